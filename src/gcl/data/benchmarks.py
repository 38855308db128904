"""Benchmarks: from a prepared source to tensors on disk (benchmark@), and back.

The kinds are classes registered in gcl.data.benchmark_registry by the modules that define them, imported
here: gcl.data.mnist360 (`mnist-360`) and gcl.data.sequential (`sequential`). A kind's data group
(`Kind.Data`) is what a benchmark file is built from and records; its training group is what runs read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gcl.core.atomic import save_tensors
from gcl.core.errors import UserError

# the kind modules register their kinds on import
from gcl.data import mnist360, sequential  # noqa: F401
from gcl.data.benchmark_registry import (  # noqa: F401 (the API)
    KINDS,
    BenchmarkData,
    BenchmarkSettings,
    DataSettings,
    TrainingSettings,
    data_setting,
    register_kind,
    training_setting,
)

# keys an older params.yaml has in a benchmark's block, and where they belong (config refuses them there, naming it)
MOVED_FIELDS = {"label": "report.benchmarks.{name}.label", "threads": "the top-level `threads`"}


class BenchmarkError(UserError, RuntimeError):
    """A benchmark file is missing or does not match its configuration."""


def data_settings(data: DataSettings | dict) -> DataSettings:
    """A benchmark's data settings, typed: as they are, or read back from their JSON (resolved/data/benchmarks/
    <name>.json's `data`, which the benchmark stage hands over) as their kind's Data."""
    if isinstance(data, DataSettings):
        return data
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in KINDS:
        raise BenchmarkError(f"data settings of an unknown benchmark kind {kind!r}; known kinds: {sorted(KINDS)}")
    return KINDS[kind].Data.model_validate(data)


def build_benchmark(data: DataSettings | dict, source: dict, out_dir: str | Path) -> Path:
    """Build the benchmark of data settings `data` (data_settings) from a prepared source, and write
    `<out_dir>/benchmark.pt`."""
    data = data_settings(data)
    bench = KINDS[data.kind].build(source, data)
    bench["config"] = data.model_dump(mode="json")
    out = Path(out_dir) / "benchmark.pt"
    save_tensors(out, bench)
    return out


def load_benchmark(path: str | Path, data: DataSettings) -> BenchmarkData:
    """The benchmark file at `path`, refused unless it was built from the data settings `data`."""
    path = Path(path)
    if not path.exists():
        raise BenchmarkError(f"{path} does not exist: run `dvc repro` (the benchmark stage builds it)")
    try:
        bench = torch.load(path, weights_only=True)
    except Exception as exc:
        raise BenchmarkError(f"{path} is corrupt ({exc}); delete it and run `dvc repro` again") from exc
    wanted = data.model_dump(mode="json")
    if bench.get("config") != wanted:
        raise BenchmarkError(f"{path} was built with {bench.get('config')}, but params.yaml now says {wanted}: "
                             "run `dvc repro` to rebuild it")
    return bench
