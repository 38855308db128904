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

from pathlib import Path

RESOLVED = Path("resolved")

# The code a train stage runs (relative to the project root). check@runs depends on it and writes its digest
# into every resolved/runs/<run>.json, so that a train stage depends on two files (its settings with that
# digest, and its benchmark) instead of on each of these: a short dvc.lock, which DVC re-reads and rewrites
# after every stage. A code change re-runs check@runs, which changes every run's settings file.
TRAIN_CODE = ("stages/train.py", "src/gcl/core", "src/gcl/training", "src/gcl/data", "src/gcl/methods")


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


def run_dir(run: dict) -> Path:
    """A run's folder, from its flat settings (benchmark, method, buffer)."""
    return Path("runs") / run["benchmark"] / run["method"] / str(run["buffer"])


def run_log(run: dict) -> Path:
    """A run's log: its progress lines, beside its results."""
    return run_dir(run) / "train.log"
