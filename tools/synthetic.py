"""Benchmarks of random uint8 images in a real source's shape, for the timing scripts (only the time matters).

A run's benchmark is built by its own kind's builder (gcl.data.benchmarks) from a random source with the
real source's classes, images per class and image shape, so that pools, buffers, evaluation sets and
streams have their real sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gcl.data.benchmarks import kind_of
from gcl.data.image_sources import NORMALIZATION, TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS


@dataclass(frozen=True)
class SourceShape:
    classes: int
    train_per_class: int
    test_per_class: int
    image: tuple[int, int, int]
    stats: tuple | None = None     # (mean, std) per channel; None: pixels in [0, 1]


# the published sizes of each source (MNIST's 60,000 / 10,000 spread evenly over its digits)
SOURCE_SHAPES = {
    "mnist": SourceShape(10, 6000, 1000, (1, 28, 28)),
    "mnist-bundled": SourceShape(10, 400, 100, (1, 28, 28)),   # as params.yaml splits it
    "cifar10": SourceShape(10, 5000, 1000, (3, 32, 32), NORMALIZATION["cifar10"]),
    "cifar100": SourceShape(100, 500, 100, (3, 32, 32), NORMALIZATION["cifar100"]),
    "tinyimagenet": SourceShape(TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS, (3, 64, 64),
                                NORMALIZATION["tinyimagenet"]),
}


def random_source(shape: SourceShape, train_per_class: int | None = None, test_per_class: int | None = None,
                  seed: int = 0) -> dict:
    """A prepared source (the dict a prepare@ stage writes) of random images in `shape`."""
    g = torch.Generator().manual_seed(seed)
    source = {"classes": [str(c) for c in range(shape.classes)]}
    counts = {"train": train_per_class or shape.train_per_class, "test": test_per_class or shape.test_per_class}
    for part, n in counts.items():
        source[f"{part}_y"] = torch.arange(shape.classes).repeat_interleave(n)
        source[f"{part}_x"] = torch.randint(0, 256, (shape.classes * n, *shape.image), dtype=torch.uint8, generator=g)
    if shape.stats:
        source.update(mean=list(shape.stats[0]), std=list(shape.stats[1]))
    return source


def random_benchmark(data_cfg: dict, source: dict) -> dict:
    """The benchmark `data_cfg` (a run's resolved data settings) builds from `source`."""
    return kind_of(data_cfg).build(source, data_cfg)
