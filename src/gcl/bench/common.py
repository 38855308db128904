"""What the benchmarks share: random benchmarks in a real source's shape, a clock that waits for the device, a quiet
progress, and a profile's (benchmark, method) pairs.

A run's benchmark is built by its own kind's builder (gcl.data.benchmarks) from a random source with the
real source's classes, images per class and image shape (gcl.data.random_sources), so that pools, buffers,
evaluation sets and streams have their real sizes; only the time measured on them means anything.
"""
from __future__ import annotations

import time

import torch
import yaml

from gcl.data.benchmarks import KINDS, BenchmarkData, DataSettings
from gcl.methods.base import Method, RunSettings
from gcl.training.progress import Progress


def random_benchmark(data: DataSettings, source: dict) -> BenchmarkData:
    """The benchmark that `data` (a run's resolved data settings) builds from `source`."""
    return KINDS[data.kind].build(source, data)


def overrides(pairs: list[str]) -> dict:
    """--set KEY=VALUE pairs as settings (values read as YAML: 0.1 a float, all a string)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def run_as(run: RunSettings, cls: type[Method], pairs: list[str], method: str | None = None) -> RunSettings:
    """`run`'s settings as method `cls` takes them (a plug-in at its base's run, named `method`), with the --set
    `pairs` that `cls` declares over them; `run` itself where neither changes anything."""
    given = {k: v for k, v in overrides(pairs).items() if k in cls.Settings.model_fields}
    if cls.name == run.algorithm and not given:
        return run
    fields = {k: v for k, v in run.model_dump().items() if k in cls.Run.model_fields}
    return cls.Run.model_validate({**fields, **given, "algorithm": cls.name, "method": method or run.method})


def sync(device: torch.device) -> None:
    """Wait for the work queued on `device` so far (a CPU's is done already)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Wall-clock readings after the device has finished the work queued so far."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self) -> float:
        sync(self.device)
        return time.perf_counter()


class Quiet(Progress):
    """A training loop's progress that prints nothing."""

    def say(self, text: str) -> None:
        pass


def split(text: str) -> list[str]:
    """A comma-separated option as its items ('' -> [])."""
    return [x for x in text.split(",") if x]


def cells_of(params: dict, benchmarks: list[str], methods: list[str]) -> dict[tuple[str, str], list[str]]:
    """(benchmark, method) -> the profile's run keys of that pair, the timed run (largest buffer) first; empty
    `benchmarks` or `methods`: all of them."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for key, run in params["runs"].items():
        if (benchmarks and run["benchmark"] not in benchmarks) or (methods and run["method"] not in methods):
            continue
        pairs.setdefault((run["benchmark"], run["method"]), []).append(key)
    size = lambda key: -1 if params["runs"][key]["buffer"] == "none" else params["runs"][key]["buffer"]
    return {pair: sorted(keys, key=size, reverse=True) for pair, keys in pairs.items()}
