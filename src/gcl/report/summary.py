"""The report's inputs: the resolved report (resolved/runs/report.json, as check@runs writes it) read into typed
values once, the runs' results that params.yaml lists, and the summary frame built from them (one row per seed of
a run: results/summary.csv).

It reads exactly the runs that params.yaml lists (never a glob of runs/), so removed runs cannot leak into the
tables; a run folder on disk that params.yaml no longer lists is found by `stale_runs`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gcl.core.layout import run_dir
from gcl.core.results import RunResult
from gcl.report.common import ReportError
from gcl.report.settings import ReportSettings


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the resolved report (its caption is a report setting: Display.benchmark_label)."""

    name: str
    source: str          # the data source's key, e.g. mnist-bundled
    kind: str            # mnist-360 | sequential | ...
    has_tasks: bool      # False on MNIST-360: no Task-IL, curves over stream segments instead of tasks


@dataclass(frozen=True)
class Registered:
    """A named method's registered algorithm."""

    algorithm: str | None = None      # None: the algorithm its runs name


@dataclass(frozen=True)
class ResolvedReport:
    """resolved/runs/report.json (gcl.config.resolve_report) as the report reads it: the report settings typed,
    the benchmarks and registered methods typed, the runs as their flat settings (benchmark, method, buffer,
    algorithm and the method's own settings, which differ per method)."""

    seeds: list[int]
    benchmarks: dict[str, Benchmark]       # in params.yaml's order
    methods: dict[str, Registered]         # in params.yaml's order
    runs: dict[str, dict]                  # run key -> its flat settings, in params.yaml's order
    settings: ReportSettings

    @classmethod
    def from_json(cls, data: dict) -> ResolvedReport:
        benchmarks = {name: Benchmark(name, b["source"], b.get("kind", ""), bool(b.get("has_tasks")))
                      for name, b in data["benchmarks"].items()}
        methods = {name: Registered(m.get("algorithm"))
                   for name, m in (data.get("methods") or {}).items()}
        return cls(list(data["seeds"]), benchmarks, methods, dict(data["runs"]),
                   ReportSettings.model_validate(data.get("report") or {}))

    def has_tasks(self, benchmark: str) -> bool:
        b = self.benchmarks.get(benchmark)
        return bool(b and b.has_tasks)


def load_cells(resolved: ResolvedReport, root: str | Path = ".") -> list[RunResult]:
    """Each run's metrics.json under `root` (runs/<benchmark>/<method>/<buffer>/ there), in the order params.yaml
    lists the runs; a run without one has not run yet and is left out (`unrun` names it, and the report draws what
    has run: a workspace part way through a grid reports its finished runs)."""
    cells = []
    for run in resolved.runs.values():
        path = Path(root) / run_dir(run) / "metrics.json"
        if path.exists():
            cells.append(RunResult.from_json(json.loads(path.read_text())))
    return cells


Cell = tuple[str, str, str]     # (benchmark, method, buffer as text): one run of params.yaml


def unrun(resolved: ResolvedReport, summary: pd.DataFrame) -> dict[Cell, str]:
    """The runs params.yaml lists that have no results in `summary`, (benchmark, method, buffer) -> run key, in
    params.yaml's order: what a report of part of a grid leaves out, and says so."""
    have = set(zip(summary.benchmark, summary.method, summary.buffer.astype(str))) if len(summary) else set()
    cells = {(r["benchmark"], r["method"], str(r["buffer"])): key for key, r in resolved.runs.items()}
    return {cell: key for cell, key in cells.items() if cell not in have}


def stale_runs(resolved: ResolvedReport, root: str | Path = ".") -> list[str]:
    """Run folders on disk under `root` (runs/<benchmark>/<method>/<buffer>/metrics.json there) that params.yaml does
    not list, as paths relative to `root`."""
    listed = {run_dir(r) for r in resolved.runs.values()}
    found = sorted(p.parent.relative_to(root) for p in Path(root).glob("runs/*/*/*/metrics.json"))
    return [p.as_posix() for p in found if p not in listed]


# a seed's environment: the env_* columns; `stacked`: how many seeds trained as one network with it (none: alone)
# (cpu_capability: torch's CPU kernels' instruction set, recorded on a CPU; layout: a ResNet's memory format where it
# is not the default)
ENVIRONMENT = ("torch", "device", "cpu_capability", "threads", "precision", "compiled", "layout", "stacked")

# The summary frame (results/summary.csv; a committed reproduction's results/summary.csv reads back the same):
COLUMNS = {
    "benchmark": "the benchmark's key",
    "method": "the method's key (a configuration of an algorithm)",
    "buffer": "the buffer size as text, 'none' for a method without a buffer",
    "seed": "the seed",
    "class_il": "Class-IL accuracy (%) after the stream",
    "task_il": "Task-IL accuracy (%); empty on a benchmark without tasks",
    "forgetting": "mean drop from a group's best earlier accuracy to its last; empty for an offline method",
    "steps": "SGD steps of the stream (a count)",
    "samples": "stream samples seen (a count)",
    "train_seconds": "wall time of the training steps, evaluations excluded",
    "samples_per_second": "stream samples per train second",
    "device": "cpu | cuda",
    **{f"env_{k}": f"the seed's environment: {k}" for k in ENVIRONMENT},
    "method_metrics.<name>": "a method's own numbers (e.g. CN-DPM's experts); a count where every value is whole",
}
NUMERIC = ("class_il", "task_il", "forgetting", "steps", "samples", "train_seconds", "samples_per_second")
COUNTS = ("steps", "samples")
METHOD_METRIC = "method_metrics."


def summary_frame(cells: list[RunResult]) -> pd.DataFrame:
    """One row per (benchmark, method, buffer, seed), the columns of COLUMNS; counts (steps, samples, a method's
    whole-numbered metrics) as integers, empty where a seed has none. No run at all: an error (nothing to report)."""
    if not cells:
        raise ReportError("no run has results yet: run `dvc repro` (its train stages run first)")
    rows = []
    for c in cells:
        for seed, r in c.seeds.items():
            row = {"benchmark": c.benchmark, "method": c.method, "buffer": str(c.buffer),
                   "seed": seed, "class_il": r.class_il, "task_il": r.task_il,
                   "forgetting": r.forgetting, "steps": r.steps, "samples": r.samples,
                   "train_seconds": r.train_seconds, "samples_per_second": r.samples_per_second,
                   "device": c.device}
            env = r.environment or {"torch": c.torch, "threads": c.threads}   # older results
            row.update({f"env_{k}": env.get(k) for k in ENVIRONMENT})
            for k, v in r.method_metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[f"{METHOD_METRIC}{k}"] = v
            rows.append(row)
    frame = pd.DataFrame(rows)
    for col in NUMERIC:
        frame[col] = pd.to_numeric(frame[col])
    for col in [*COUNTS, *method_metric_columns(frame)]:
        if is_count(frame[col]):
            frame[col] = frame[col].astype("Int64")   # 200, not 200.0, where some seeds have none
    return frame


def method_metric_columns(summary: pd.DataFrame) -> list[str]:
    return [c for c in summary.columns if c.startswith(METHOD_METRIC)]


def is_count(values: pd.Series) -> bool:
    """Whether a numeric column holds whole numbers only (a count: steps, a buffer's size, experts)."""
    present = pd.to_numeric(values, errors="coerce").dropna()
    return bool(len(present)) and bool((present == present.round()).all())


def _environment_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row's environment as text, one column per ENVIRONMENT key; `stacked` as 'stacked' or 'alone'."""
    # as objects: a summary.csv read back holds an all-empty column as floats, which refuse a text value
    envs = rows.reindex(columns=[f"env_{k}" for k in ENVIRONMENT]).astype(object)
    envs["env_compiled"] = envs["env_compiled"].astype(object).fillna("eager")   # results from before compiled backbones
    envs["env_layout"] = envs["env_layout"].astype(object).fillna("default")      # recorded only where not the default
    # a GPU seed has no CPU capability; a CPU seed from before it was recorded reads '?' (unknown, not equal)
    on_gpu = rows.reindex(columns=["device"])["device"].eq("cuda")
    envs.loc[on_gpu & envs["env_cpu_capability"].isna(), "env_cpu_capability"] = "-"
    # stacked seeds round otherwise than lone ones in float32 (equal in distribution): one environment each way,
    # however many seeds a stack held
    envs["env_stacked"] = envs["env_stacked"].map(lambda v: "alone" if pd.isna(v) else "stacked")
    return envs.fillna("?").astype(str)


def _in_words(torch: str, device: str, cpu_capability: str, threads: str, precision: str, compiled: str,
              layout: str) -> str:
    capability = "" if cpu_capability in ("-", "?") else f" ({cpu_capability})"   # unrecorded: older results
    return f"torch {torch}, {device}{capability}, {threads} thread(s), {precision}" + (
        "" if compiled == "eager" else f", compiled ({compiled})") + ("" if layout == "default" else f", {layout}")


def environments(rows: pd.DataFrame) -> list[str]:
    """The distinct environments of these summary rows, stacking included, in words, most seeds first."""
    counts = _environment_frame(rows).value_counts()
    return [f"{_in_words(*env[:-1])}{', seeds stacked' if env[-1] == 'stacked' else ''} ({n} seeds)"
            for env, n in counts.items()]


def mixes_environments(rows: pd.DataFrame) -> bool:
    """Whether these rows come from more than one environment besides stacking: another CPU or GPU, torch build,
    thread count, precision or compilation, each of which moves a seed's numbers within seed noise (stacked and
    lone seeds differ in float32 rounding only)."""
    return len(_environment_frame(rows).drop(columns="env_stacked").drop_duplicates()) > 1


def stacked_seeds(rows: pd.DataFrame) -> int:
    """How many of these rows' seeds trained stacked (several seeds as one network)."""
    return int((_environment_frame(rows)["env_stacked"] == "stacked").sum())


def environment_line(rows: pd.DataFrame) -> str:
    """Where rows of one environment (besides stacking) were computed, in words: how many seeds, how many stacked."""
    stacked = stacked_seeds(rows)
    where = _in_words(*_environment_frame(rows).drop(columns="env_stacked").iloc[0])
    return f"{where} ({len(rows)} seeds" + (f", {stacked} of them trained stacked" if stacked else "") + ")"


def stats(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """mean and std (0 for one seed) of `metric` per (benchmark, method, buffer)."""
    s = summary.groupby(["benchmark", "method", "buffer"])[metric].agg(["mean", "std", "count"]).reset_index()
    s["std"] = s["std"].fillna(0.0)
    return s
