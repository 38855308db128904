"""What the figures draw (gcl.report.figures) and `dvc plots` reads (CSV under results/plots/), from the runs'
results; nothing is drawn here.

Curves: accuracy after every task (average over the tasks seen so far, as the paper's evaluation) or, on
MNIST-360 (no tasks), after every segment over all digits; mean over seeds. Confusion matrices and t-SNE
embeddings of report.visualise's runs (first seed), and the sensitivity sweeps of report.sensitivity (the
paper's Figure 4).
"""
from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from gcl.core.atomic import atomic_path
from gcl.core.layout import run_dir
from gcl.core.results import RunResult, SeedResult
from gcl.report.cache import CACHE_DIR, Kept, key_of
from gcl.report.common import ReportError
from gcl.report.settings import ReportSettings, Sweep
from gcl.report.summary import ResolvedReport

# ---------------------------------------------------------------------------- curves


@dataclass(frozen=True)
class Curve:
    """One run's accuracy over the stream, mean over its seeds; one value for an offline method (JOINT)."""

    benchmark: str
    method: str
    buffer: str          # "none" for a method without a buffer
    has_tasks: bool      # values after each task (tasks seen so far), else after each stream segment
    values: list[float]

    @property
    def name(self) -> str:
        return f"{self.method}_{self.buffer}"


def task_average_curve(acc_matrix: list[list[float]]) -> list[float]:
    """Average accuracy over the tasks seen so far: row l of the accuracy matrix averaged over tasks 0..l.
    A single row (an offline method such as JOINT, evaluated once after the whole stream) has seen every task."""
    if len(acc_matrix) == 1:
        return [sum(acc_matrix[0]) / len(acc_matrix[0])]
    return [sum(row[:t + 1]) / (t + 1) for t, row in enumerate(acc_matrix)]


def seed_curve(result: SeedResult, has_tasks: bool) -> list[float]:
    if has_tasks and result.acc_matrix:
        return task_average_curve(result.acc_matrix)
    return list(result.curve)


def mean_curve(cell: RunResult, has_tasks: bool) -> list[float]:
    curves = [seed_curve(r, has_tasks) for r in cell.seeds.values()]
    return [sum(v) / len(v) for v in zip(*curves)]


def curves(cells: list[RunResult], resolved: ResolvedReport) -> list[Curve]:
    """Every run's curve, in the order of `cells`."""
    out = []
    for c in cells:
        tasks = resolved.has_tasks(c.benchmark)
        out.append(Curve(c.benchmark, c.method, str(c.buffer), tasks, mean_curve(c, tasks)))
    return out


# ---------------------------------------------------------------------------- the visualised runs


@dataclass(frozen=True)
class Confusion:
    """[true][predicted] counts of one run's first seed after the stream (Class-IL)."""

    benchmark: str
    method: str
    buffer: str
    seed: int
    counts: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.method}_{self.buffer}"


def first_seed(cell: RunResult) -> tuple[int, SeedResult]:
    seed = min(cell.seeds)
    return seed, cell.seeds[seed]


def visualised(settings: ReportSettings, cells: list[RunResult]) -> tuple[str, list[RunResult]]:
    """The cells report.visualise names as 'method/buffer', in that order (check@runs validated them)."""
    spec = settings.visualise
    if not spec:
        return "", []
    by_name = {(c.benchmark, f"{c.method}/{c.buffer}"): c for c in cells}
    return spec.benchmark, [by_name[(spec.benchmark, n)] for n in spec.cells if (spec.benchmark, n) in by_name]


def confusions(settings: ReportSettings, cells: list[RunResult]) -> list[Confusion]:
    out = []
    for c in visualised(settings, cells)[1]:
        seed, result = first_seed(c)
        out.append(Confusion(c.benchmark, c.method, str(c.buffer), seed, np.asarray(result.confusion, dtype=np.int64)))
    return out


@dataclass(frozen=True)
class Embedding:
    """2-d t-SNE of one run's final penultimate features of the evaluation images, and their classes."""

    method: str
    buffer: str
    seed: int
    xy: np.ndarray       # (images, 2)
    labels: np.ndarray   # (images,)


def degenerate(features: np.ndarray) -> str | None:
    """Why t-SNE cannot embed these features (it crashed on such input), or None."""
    if features.ndim != 2 or len(features) < 5:
        return f"too few feature vectors ({features.shape})"
    if not np.isfinite(features).all():
        return "non-finite features"
    if not np.any(features.std(axis=0) > 0):
        return "all features identical (e.g. all zero)"
    return None


def embed_tsne(features: np.ndarray) -> np.ndarray:
    """2-d t-SNE of one run's features (PCA start, fixed seed) on one OpenMP thread, whatever thread calls it."""
    from sklearn.manifold import TSNE
    perplexity = float(min(30, (len(features) - 1) / 3))
    with threadpool_limits(1, user_api="openmp"):   # OpenMP's thread count is per calling thread
        return TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=0).fit_transform(features)


# t-SNE is most of a report's time (seconds per run): each embedding is kept (gcl.report.cache) under a key of all
# it is computed from, so a report recomputes only the runs whose features changed
TSNE_CACHE = CACHE_DIR / "tsne"


def tsne_key(features: np.ndarray) -> str:
    """What an embedding is computed from: the features (bytes, shape, type), this module's code (embed_tsne's
    settings) and scikit-learn's version."""
    return key_of([Path(__file__)], ["scikit-learn"], np.ascontiguousarray(features))


def cached_tsne(features: list[np.ndarray], cache: Path = TSNE_CACHE) -> list[np.ndarray]:
    """embed_tsne of each, taken from `cache` where an earlier report computed it from the same features, the rest
    computed (one embedding per thread) and kept there; the cache then holds these embeddings only."""
    kept = Kept(cache, ".npy")
    paths = [kept.path(tsne_key(f)) for f in features]
    found = {path: _cached(path) for path in paths}
    todo = {path: f for path, f in zip(paths, features) if found[path] is None}
    if todo:
        # one embedding per thread, each on one OpenMP thread (and BLAS on one): faster than one at a time on all
        # cores (its gradient's sums release the GIL), and the same floats on any machine (the order of a
        # multi-threaded sum follows the cores)
        with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
            found.update(zip(todo, pool.map(embed_tsne, todo.values())))
        for path in todo:
            with atomic_path(path) as tmp, tmp.open("wb") as f:
                np.save(f, found[path])
    kept.prune()
    return [found[path] for path in paths]


def _cached(path: Path) -> np.ndarray | None:
    """A kept embedding, or None where there is none or it cannot be read (a killed write is never renamed in)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Features:
    """One visualised run's final penultimate features of the evaluation images (first seed), and their classes."""

    method: str
    buffer: str
    seed: int
    features: np.ndarray   # (images, dims), float32
    labels: np.ndarray     # (images,)


def visualised_features(cells: list[RunResult], warn: Callable[[str], None]) -> list[Features]:
    """Each run's features.pt; runs whose features are missing or degenerate are skipped with a warning."""
    import torch
    usable = []
    for c in cells:
        file = run_dir(c.run) / "features.pt"
        if not file.exists():
            warn(f"t-SNE: {file} is missing; {c.method}/{c.buffer} skipped")
            continue
        saved = torch.load(file, weights_only=True)
        features = saved["features"].float().numpy()
        why = degenerate(features)
        if why:
            warn(f"t-SNE: {file}: {why}; {c.method}/{c.buffer} skipped")
            continue
        usable.append(Features(c.method, str(c.buffer), int(saved["seed"]), features, saved["labels"].numpy()))
    return usable


def embeddings(usable: list[Features]) -> list[Embedding]:
    """The t-SNE of each run's features (cached_tsne)."""
    xys = cached_tsne([f.features for f in usable]) if usable else []
    return [Embedding(f.method, f.buffer, f.seed, xy, f.labels) for f, xy in zip(usable, xys)]


# ---------------------------------------------------------------------------- the sensitivity sweeps


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: the swept setting's value and each seed's Class-IL."""

    x: float                               # the swept setting, as the run resolves it
    method: str                            # the run's method (a configuration)
    seeds: tuple[tuple[int, float], ...]   # (seed, Class-IL %), by seed

    @property
    def accs(self) -> list[float]:
        return [acc for _, acc in self.seeds]

    @property
    def mean(self) -> float:
        """Class-IL over seeds (as gcl.report.summary.stats)."""
        return float(pd.Series(self.accs, dtype=float).mean())

    @property
    def std(self) -> float:
        """Over seeds, one degree of freedom removed (as gcl.report.summary.stats); 0 for one seed."""
        return float(pd.Series(self.accs, dtype=float).std()) if len(self.seeds) > 1 else 0.0


@dataclass(frozen=True)
class SweepPanel:
    sweep: Sweep                    # its parameter, axis label, marks and statements (report.sensitivity.sweeps)
    points: list[SweepPoint]        # by x, one per value
    pending: tuple[str, ...] = ()   # its runs not run yet (benchmark/method/buffer): the panel is not drawn

    def at(self, x: float) -> SweepPoint | None:
        """The point whose value is `x` (to rounding), or None."""
        return next((p for p in self.points if math.isclose(p.x, x, rel_tol=1e-9, abs_tol=1e-12)), None)


def sweep_panels(resolved: ResolvedReport, summary: pd.DataFrame) -> list[SweepPanel]:
    """Class-IL against each swept setting of `report.sensitivity`, a panel per sweep ([] without one): the x value
    is the setting each run resolves (params.yaml's, defaults filled in, as the run trained with it), the seeds are
    the summary's (this profile's or a committed reproduction's). A sweep with a run that has not run yet is a panel
    with `pending` and no points (not drawn). A sweep naming a run or setting that does not exist, or two runs at
    one value, is an error."""
    spec = resolved.settings.sensitivity
    if not spec:
        return []
    runs = {(r["benchmark"], r["method"], str(r["buffer"])): r for r in resolved.runs.values()}
    on = summary[(summary.benchmark == spec.benchmark) & (summary.buffer.astype(str) == str(spec.buffer))]
    panels = []
    for i, sweep in enumerate(spec.sweeps):
        where = f"report.sensitivity.sweeps[{i}]"
        cells = {method: f"{spec.benchmark}/{method}/{spec.buffer}" for method in sweep.methods}
        pending = tuple(cell for method, cell in cells.items() if (spec.benchmark, method, str(spec.buffer)) in runs
                        and on[on.method == method].empty)
        if pending:                     # part of a grid: this sweep waits for its runs
            panels.append(SweepPanel(sweep, [], pending))
            continue
        points = [_sweep_point(where, sweep, runs.get((spec.benchmark, method, str(spec.buffer))), method,
                               on[on.method == method], cell) for method, cell in cells.items()]
        points.sort(key=lambda p: p.x)
        twice = [f"{a.method} and {b.method} at {sweep.parameter} = {a.x:g}" for a, b in zip(points, points[1:])
                 if math.isclose(a.x, b.x, rel_tol=1e-9, abs_tol=1e-12)]
        if twice:
            raise ReportError(f"{where}.methods: {'; '.join(twice)}: one run a value")
        panels.append(SweepPanel(sweep, points))
    return panels


def _sweep_point(where: str, sweep: Sweep, run: dict | None, method: str, rows: pd.DataFrame, cell: str) -> SweepPoint:
    """One method's point of a sweep, from its resolved run and its summary rows (errors name `where`)."""
    if run is None:
        raise ReportError(f"{where}: no run {cell} in runs; add its run or drop it from the sweep")
    if sweep.parameter not in run:
        raise ReportError(f"{where}.parameter: {method!r} has no setting {sweep.parameter!r} "
                          "(`python -m gcl.describe` lists each method's settings)")
    if rows.empty:
        raise ReportError(f"{where}: run {cell} has no results in the summary; run `dvc repro`")
    seeds = tuple(sorted((int(s), float(a)) for s, a in zip(rows.seed, rows.class_il)))
    return SweepPoint(float(run[sweep.parameter]), method, seeds)


# ---------------------------------------------------------------------------- dvc plots


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


SWEEP_COLUMNS = ["seed", "class_il", "method", "mean", "std", "seeds"]   # after the swept setting's own column


def sweep_rows(panel: SweepPanel) -> list[list]:
    """One row per (value, seed): the value, the seed, its Class-IL, and its point's method, mean, std and seeds."""
    return [[f"{p.x:g}", seed, f"{acc:.2f}", p.method, f"{p.mean:.2f}", f"{p.std:.2f}", len(p.seeds)]
            for p in panel.points for seed, acc in p.seeds]


def write_plot_data(curves: list[Curve], confusions: list[Confusion], out: Path,
                    sweeps: list[SweepPanel] = ()) -> list[Path]:
    """plots/curves/<benchmark>/<method>_<buffer>.csv (evaluation, accuracy: mean over seeds),
    plots/confusion/<benchmark>/<method>_<buffer>.csv (actual, predicted: one line per test image of the
    first seed) and plots/sensitivity/<parameter>.csv (the swept setting, then SWEEP_COLUMNS: one line per seed of
    each point) for `dvc plots show/diff` (dvc.yaml's `plots:`)."""
    paths = []
    for panel in (p for p in sweeps if not p.pending):
        paths.append(_write_csv(out / "sensitivity" / f"{panel.sweep.parameter}.csv",
                                [panel.sweep.parameter, *SWEEP_COLUMNS], sweep_rows(panel)))
    for c in curves:
        rows = [[i, f"{acc:.2f}"] for i, acc in enumerate(c.values, start=1)]
        paths.append(_write_csv(out / "curves" / c.benchmark / f"{c.name}.csv", ["evaluation", "accuracy"], rows))
    for c in confusions:
        rows = [[int(t), int(p)] for t, p in zip(*np.nonzero(c.counts)) for _ in range(int(c.counts[t, p]))]
        paths.append(_write_csv(out / "confusion" / c.benchmark / f"{c.name}.csv", ["actual", "predicted"], rows))
    return paths
