"""Shared fixtures: small benchmarks made from synthetic digits, so unit tests need no download."""
from __future__ import annotations

import pytest
import torch

from gcl.data import mnist360

torch.set_num_threads(1)   # small ops: one thread is much faster on these 2-core machines


def synthetic_source(per_class: int = 30, test_per_class: int = 6, classes: int = 10, seed: int = 0) -> dict:
    """A source dict in the exact shape sources.py writes, with class-dependent blobs as images."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        y = torch.arange(classes).repeat_interleave(n)
        x = torch.randint(0, 60, (len(y), 1, 28, 28), generator=g, dtype=torch.uint8)
        for c in range(classes):   # a bright square whose position encodes the class
            r, col = 2 + 2 * (c // 4) * 3, 2 + (c % 4) * 6
            x[y == c, :, r:r + 6, col:col + 6] = 255
        return x, y

    train_x, train_y = make(per_class)
    test_x, test_y = make(test_per_class)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "classes": [str(c) for c in range(classes)]}


@pytest.fixture
def tiny_mnist360() -> tuple[dict, dict]:
    cfg = {"kind": "mnist-360", "source": "synthetic", "backbone": "mlp", "epochs": 1, "threads": 1}
    bench = mnist360.build_benchmark(synthetic_source(per_class=60))
    bench["config"] = cfg
    return bench, cfg
