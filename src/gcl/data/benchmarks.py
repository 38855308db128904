"""Benchmark builders by kind: from a prepared source to tensors on disk, and from those to a stream."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gcl.atomic import save_tensors
from gcl.data import mnist360, sequential
from gcl.data.stream import Stream
from gcl.data.transforms import to_unit_float


class BenchmarkError(RuntimeError):
    """A benchmark file is missing or does not match its configuration."""


@dataclass(frozen=True)
class BenchmarkKind:
    build: Callable[[dict, dict], dict]                       # (source tensors, cfg) -> benchmark dict
    stream: Callable[[dict, dict, int, torch.Generator], Stream]   # (bench, cfg, batch, gen) -> Stream
    # bench -> (train transform, test transform), each a batched uint8 -> network input map on the device
    transforms: Callable[[dict], tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]]
    has_tasks: bool


KINDS: dict[str, BenchmarkKind] = {
    "mnist-360": BenchmarkKind(
        build=lambda source, cfg: mnist360.build_benchmark(source, float(cfg.get("validation_fraction", 0.0))),
        stream=lambda bench, cfg, batch, gen: mnist360.build_stream(bench, batch, gen, cfg.get("draw", "without-replacement")),
        transforms=lambda bench: (to_unit_float, to_unit_float),
        has_tasks=False,
    ),
    "sequential": BenchmarkKind(
        build=sequential.build_benchmark,
        stream=sequential.build_stream,
        transforms=sequential.transforms,
        has_tasks=True,
    ),
}


def kind_of(cfg: dict) -> BenchmarkKind:
    return KINDS[cfg["kind"]]


def build_benchmark(cfg: dict, source: dict, out_dir: str | Path) -> Path:
    bench = kind_of(cfg).build(source, cfg)
    bench["config"] = dict(cfg)
    out = Path(out_dir) / "benchmark.pt"
    save_tensors(out, bench)
    return out


def load_benchmark(path: str | Path, cfg: dict) -> dict:
    path = Path(path)
    if not path.exists():
        raise BenchmarkError(f"{path} does not exist: run `dvc repro` (the benchmark stage builds it)")
    try:
        bench = torch.load(path, weights_only=True)
    except Exception as exc:
        raise BenchmarkError(f"{path} is corrupt ({exc}); delete it and run `dvc repro` again") from exc
    if bench.get("config") != dict(cfg):
        raise BenchmarkError(f"{path} was built with {bench.get('config')}, but params.yaml now says {cfg}: "
                             "run `dvc repro` to rebuild it")
    return bench
