"""The on-disk layout that dvc.yaml's outs name, in one place.

    resolved/data/sources/<name>.json      check@data: a source's validated settings
    resolved/data/benchmarks/<name>.json   check@data: a benchmark's settings, by group
    resolved/runs/<run>.json               check@runs: one run, fully resolved
    resolved/runs/report.json              check@runs: what the report reads
    data/raw/<source>/data.pt              prepare@<source>
    data/benchmarks/<name>/benchmark.pt    benchmark@<name>
    runs/<benchmark>/<method>/<buffer>/    train@<run>: metrics.json, features.pt, train.log (one output)
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

RESOLVED = Path("resolved")

# The code a train stage runs (relative to the project root): the one scope of "the code a run's numbers depend
# on" (gcl.core.fingerprint.train_code_digest), hashed into every resolved run by check@runs and into each seed's
# resume fingerprint. dvc.yaml's check stages list the same paths; docs/design.md says why a train stage depends on
# that digest rather than on these folders.
TRAIN_CODE = ("stages/train.py", "src/gcl/core", "src/gcl/training", "src/gcl/data", "src/gcl/methods")
PROJECT = Path(__file__).resolve().parents[3]     # the project whose src/ holds this package (TRAIN_CODE's root)


def resolved_source(name: str) -> Path:
    return RESOLVED / "data" / "sources" / f"{name}.json"


def resolved_benchmark(name: str) -> Path:
    return RESOLVED / "data" / "benchmarks" / f"{name}.json"


def resolved_run(key: str) -> Path:
    return RESOLVED / "runs" / f"{key}.json"


def resolved_report() -> Path:
    return RESOLVED / "runs" / "report.json"


def source_file(name: str) -> Path:
    return Path("data", "raw", name, "data.pt")


def benchmark_file(name: str) -> Path:
    return Path("data", "benchmarks", name, "benchmark.pt")


def run_dir(run) -> Path:
    """A run's folder, from its flat settings (benchmark, method, buffer): a resolved run's typed `run`
    (gcl.methods.base.RunSettings), or their JSON form (as the report reads them from report.json)."""
    if isinstance(run, Mapping):
        return Path("runs") / run["benchmark"] / run["method"] / str(run["buffer"])
    return Path("runs") / run.benchmark / run.method / str(run.buffer)


def run_log(run) -> Path:
    """A run's log: its progress lines, beside its results."""
    return run_dir(run) / "train.log"
