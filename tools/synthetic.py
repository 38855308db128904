"""Benchmarks of random uint8 images in a real source's shape, for the timing scripts (only the time matters).

A run's benchmark is built by its own kind's builder (gcl.data.benchmarks) from a random source with the
real source's classes, images per class and image shape (gcl.data.random_sources), so that pools, buffers,
evaluation sets and streams have their real sizes.
"""
from __future__ import annotations

from gcl.data.benchmarks import KINDS, BenchmarkData, DataSettings
from gcl.data.random_sources import SOURCE_SHAPES, SourceShape, random_source, shape_of  # noqa: F401  (the timing scripts' API)


def random_benchmark(data: DataSettings, source: dict) -> BenchmarkData:
    """The benchmark that `data` (a run's resolved data settings) builds from `source`."""
    return KINDS[data.kind].build(source, data)
