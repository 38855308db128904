"""CIFAR-10, CIFAR-100 and Tiny ImageNet sources, run offline on tiny files in the real on-disk formats."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10, CIFAR100

from gcl.data.image_sources import NORMALIZATION, TINY_MD5
from gcl.data.sources import SOURCES, SourceError, load_source, prepare_source, read_source
from image_fixtures import (CIFAR10_NAMES, WNIDS, cifar_checksums, md5, serve_folder, tar_folder, write_cifar10,
                            write_cifar100, write_tinyimagenet_zip)


def test_image_sources_are_registered():
    assert {"cifar10", "cifar100", "tinyimagenet"} <= set(SOURCES)


def test_cifar10_pickles_become_nchw_uint8_in_file_order(tmp_path, monkeypatch):
    truth = write_cifar10(tmp_path)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    out = prepare_source("cifar10", {"download": False, "download_dir": str(tmp_path)}, tmp_path / "raw")
    data = load_source(out)
    assert data["train_x"].dtype == torch.uint8 and data["train_x"].shape == (100, 3, 32, 32)
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))   # batches 1..5 in order, CHW kept
    assert torch.equal(data["train_y"], torch.from_numpy(truth["train_y"]).long())
    assert torch.equal(data["test_x"], torch.from_numpy(truth["test_x"]))
    assert data["classes"] == CIFAR10_NAMES
    assert (tuple(data["mean"]), tuple(data["std"])) == NORMALIZATION["cifar10"]


def test_cifar100_uses_the_fine_labels(tmp_path, monkeypatch):
    truth = write_cifar100(tmp_path)
    cifar_checksums(monkeypatch, CIFAR100, tmp_path / "cifar-100-python")
    data = read_source("cifar100", {"download": False}, tmp_path)
    assert torch.equal(data["train_y"], torch.from_numpy(truth["train_y"]).long())
    assert torch.equal(data["test_x"], torch.from_numpy(truth["test_x"]))
    assert data["classes"][:2] == ["fine0", "fine1"] and len(data["classes"]) == 100


def test_a_file_that_fails_the_real_checksum_is_named(tmp_path):
    write_cifar10(tmp_path)    # tiny files: torchvision's published MD5s cannot match
    with pytest.raises(SourceError, match=r"data_batch_1 does not match its published MD5.*sources\.cifar10\.archive"):
        read_source("cifar10", {"download": False}, tmp_path)


def test_a_missing_file_is_named_with_the_fix(tmp_path, monkeypatch):
    write_cifar10(tmp_path)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(SourceError, match=r"test_batch is missing.*download is false.*cifar-10-python\.tar\.gz"):
        read_source("cifar10", {"download": False}, tmp_path)


def test_cifar_from_a_local_archive_and_from_a_mirror_url(tmp_path, monkeypatch):
    made = tmp_path / "made"
    truth = write_cifar10(made)
    archive = tar_folder(made / "cifar-10-batches-py", tmp_path / "cifar-10-python.tar.gz")
    cifar_checksums(monkeypatch, CIFAR10, made / "cifar-10-batches-py", archive)
    data = read_source("cifar10", {"archive": str(archive)}, tmp_path / "a")
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))
    # a mirror: torchvision's downloader fetches the archive, checks its MD5 and extracts it
    with serve_folder(tmp_path) as mirror:
        data = read_source("cifar10", {"url": f"{mirror}/cifar-10-python.tar.gz"}, tmp_path / "b")
    assert torch.equal(data["test_y"], torch.from_numpy(truth["test_y"]).long())
    assert (tmp_path / "b" / "cifar-10-python.tar.gz").exists()


def test_a_failed_download_says_how_to_supply_the_archive(tmp_path):
    with serve_folder(tmp_path) as mirror, \
            pytest.raises(SourceError, match=r"could not download .*Fix: .*sources\.cifar10\.archive"):
        read_source("cifar10", {"url": f"{mirror}/nowhere.tar.gz"}, tmp_path / "dl")


def test_a_wrong_archive_is_refused(tmp_path):
    bad = tmp_path / "cifar-10-python.tar.gz"
    bad.write_bytes(b"not an archive")
    with pytest.raises(SourceError, match=r"is not the original cifar-10-python\.tar\.gz"):
        read_source("cifar10", {"archive": str(bad)}, tmp_path / "d")


def _tiny(tmp_path):
    archive = tmp_path / "tiny-imagenet-200.zip"
    return archive, write_tinyimagenet_zip(archive)


def test_tinyimagenet_zip_in_wnids_order_with_val_as_test(tmp_path):
    archive, truth = _tiny(tmp_path)
    data = read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)
    assert data["train_x"].shape == (36, 3, 64, 64) and data["test_x"].shape == (6, 3, 64, 64)
    assert data["train_y"].tolist() == [k for k in range(3) for _ in range(12)]      # wnids.txt order
    colours = data["train_x"].float().mean(dim=(2, 3))
    assert torch.allclose(colours, torch.from_numpy(np.stack(truth["train"])).float(), atol=3)  # _0 .. _11 in order
    assert data["test_y"].tolist() == [k for k, _ in truth["val"]]
    grey = data["test_x"][0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert data["classes"] == ["name0", "name1", "name2"]
    assert (tuple(data["mean"]), tuple(data["std"])) == NORMALIZATION["tinyimagenet"]


def test_tinyimagenet_from_an_extracted_folder(tmp_path):
    import zipfile
    archive, _ = _tiny(tmp_path)
    zipfile.ZipFile(archive).extractall(tmp_path / "x")
    from_zip = read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)
    from_dir = read_source("tinyimagenet", {"archive": str(tmp_path / "x" / "tiny-imagenet-200")}, tmp_path)
    assert torch.equal(from_zip["train_x"], from_dir["train_x"]) and torch.equal(from_zip["test_y"], from_dir["test_y"])


def test_tinyimagenet_checks_the_canonical_md5_and_explains_the_fix(tmp_path):
    archive, _ = _tiny(tmp_path)
    with pytest.raises(SourceError, match=rf"does not match the MD5 {TINY_MD5}.*248,100,043 bytes"):
        read_source("tinyimagenet", {"archive": str(archive)}, tmp_path)
    with pytest.raises(SourceError, match=r"tiny-imagenet-200\.zip is missing, and sources\.tinyimagenet\.download is false"):
        read_source("tinyimagenet", {"download": False}, tmp_path / "empty")
    with serve_folder(tmp_path) as mirror, \
            pytest.raises(SourceError, match=r"could not download .*sources\.tinyimagenet\.archive"):
        read_source("tinyimagenet", {"url": f"{mirror}/gone.zip"}, tmp_path / "empty")


def test_tinyimagenet_download_from_a_mirror(tmp_path):
    archive, _ = _tiny(tmp_path)
    with serve_folder(tmp_path) as mirror:
        data = read_source("tinyimagenet", {"url": f"{mirror}/{archive.name}", "md5": md5(archive)}, tmp_path / "dl")
    assert (tmp_path / "dl" / "tiny-imagenet-200.zip").exists() and len(data["train_y"]) == 36


def test_tinyimagenet_incomplete_archive_names_the_missing_file(tmp_path):
    import zipfile
    archive = tmp_path / "broken.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "\n".join(WNIDS))
    with pytest.raises(SourceError, match=r"no training images under tiny-imagenet-200/train/n02124075/images/"):
        read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)
