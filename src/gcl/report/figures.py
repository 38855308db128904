"""The report's figures (PNG) and the plot data `dvc plots` reads (CSV under results/plots/).

Curves: accuracy after every task (average over the tasks seen so far, as the paper's evaluation) or,
on MNIST-360 (no tasks), after every segment over all digits; mean over seeds. One figure per
benchmark: a row of panels per buffer, a column per group of at most MAX_LINES methods
(report.curves.groups, then the others in row order); methods without a buffer are drawn in every
row as references. Confusion matrices and t-SNE of report.visualise's runs (first seed), and the
sensitivity sweep of report.sensitivity (the paper's Figure 4).

Every figure is drawn on its own: one that cannot be drawn (degenerate features, a missing file) is
skipped with a warning and the others are kept. Longer than ~300 lines because each of the paper's four
figures is a function here, sharing the grid and saving helpers.
"""
from __future__ import annotations

import csv
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from gcl.core.layout import run_dir
from gcl.core.results import RunResult, SeedResult
from gcl.report.settings import MAX_LINES
from gcl.report.common import ReportError, buffer_key, warn

# ---------------------------------------------------------------------------- data

def task_average_curve(acc_matrix: list[list[float]]) -> list[float]:
    """Average accuracy over the tasks seen so far: row l of the accuracy matrix averaged over tasks 0..l.
    A single row (an offline method such as JOINT, evaluated once after the whole stream) has seen every task."""
    if len(acc_matrix) == 1:
        return [sum(acc_matrix[0]) / len(acc_matrix[0])]
    return [sum(row[:l + 1]) / (l + 1) for l, row in enumerate(acc_matrix)]


def seed_curve(result: SeedResult, has_tasks: bool) -> list[float]:
    if has_tasks and result.acc_matrix:
        return task_average_curve(result.acc_matrix)
    return list(result.curve)


def mean_curve(cell: RunResult, has_tasks: bool) -> list[float]:
    curves = [seed_curve(r, has_tasks) for r in cell.seeds.values()]
    return [sum(v) / len(v) for v in zip(*curves)]


def has_tasks(resolved: dict, benchmark: str) -> bool:
    return bool(resolved["benchmarks"].get(benchmark, {}).get("has_tasks"))


def _name(cell: RunResult) -> str:
    return f"{cell.method}_{cell.buffer}"


def visualised(settings, cells: list[RunResult]) -> tuple[str, list[RunResult]]:
    """The cells report.visualise names as 'method/buffer', in that order (check@runs validated them)."""
    spec = settings.visualise
    if not spec:
        return "", []
    by_name = {(c.benchmark, f"{c.method}/{c.buffer}"): c for c in cells}
    return spec.benchmark, [by_name[(spec.benchmark, n)] for n in spec.cells if (spec.benchmark, n) in by_name]


def first_seed(cell: RunResult) -> tuple[int, SeedResult]:
    seed = min(cell.seeds)
    return seed, cell.seeds[seed]


def write_plot_data(resolved: dict, settings, cells: list[RunResult], out: Path) -> list[Path]:
    """plots/curves/<benchmark>/<method>_<buffer>.csv (evaluation, accuracy: mean over seeds) and
    plots/confusion/<benchmark>/<method>_<buffer>.csv (actual, predicted: one line per test image of the
    first seed) for `dvc plots show/diff` (dvc.yaml's `plots:`)."""
    paths = []
    for c in cells:
        path = out / "curves" / c.benchmark / f"{_name(c)}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["evaluation", "accuracy"])
            for i, acc in enumerate(mean_curve(c, has_tasks(resolved, c.benchmark)), start=1):
                w.writerow([i, f"{acc:.2f}"])
        paths.append(path)
    bench, chosen = visualised(settings, cells)
    for c in chosen:
        counts = np.asarray(first_seed(c)[1].confusion, dtype=np.int64)
        path = out / "confusion" / bench / f"{_name(c)}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["actual", "predicted"])
            for t, p in zip(*np.nonzero(counts)):
                w.writerows([[int(t), int(p)]] * int(counts[t, p]))
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------- drawing

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    try:
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def _buffer_text(buffer) -> str:
    return "no buffer" if str(buffer) == "none" else f"B={buffer}"


def panels(groups: dict[str, list[str]], ordered: list[str]) -> list[tuple[str, list[str]]]:
    """The named groups (only their methods that ran), then the other methods in row order, MAX_LINES a panel."""
    out = [(title, [m for m in methods if m in ordered]) for title, methods in groups.items()]
    kept, grouped = [], set()
    for title, methods in out:
        if methods and not set(methods) <= grouped:   # a panel of methods drawn already adds nothing
            kept.append((title, methods))
            grouped |= set(methods)
    out = kept
    rest = [m for m in ordered if m not in grouped]
    chunks = [rest[i:i + MAX_LINES] for i in range(0, len(rest), MAX_LINES)]
    name = "other methods" if out else "methods"
    for i, chunk in enumerate(chunks):
        out.append((name + (f" ({i + 1})" if len(chunks) > 1 else ""), chunk))
    return out


MAX_COLUMNS = 4   # panels a figure row holds; a buffer with more panels wraps onto the next row


def curve_layout(groups: list[tuple[str, list[str]]], mine: list[dict], buffers: list[str]) -> list[list[tuple]]:
    """Figure rows of panels (buffer, title, [(method, cell)]): per buffer, each group's methods that ran at
    that buffer or without one; a panel whose methods an earlier panel of that buffer drew already is left
    out (e.g. a sweep run at one buffer only), and a buffer's panels wrap after MAX_COLUMNS."""
    rows = []
    for b in buffers:
        drawn, row = set(), []
        for title, methods in groups:
            lines = []
            for m in methods:
                cell = next((c for c in mine if c.method == m and str(c.buffer) == b), None) \
                    or next((c for c in mine if c.method == m and str(c.buffer) == "none"), None)
                if cell is not None:
                    lines.append((m, cell))
            if lines and not {m for m, _ in lines} <= drawn:
                row.append((b, title, lines))
                drawn |= {m for m, _ in lines}
        rows += [row[i:i + MAX_COLUMNS] for i in range(0, len(row), MAX_COLUMNS)]
    return rows


def plot_curves(resolved: dict, settings, display, cells: list[RunResult], out_dir: Path) -> list[Path]:
    """One figure per benchmark: a row of panels per buffer, one panel per method group, at most MAX_LINES
    lines a panel; methods without a buffer (dashed; JOINT's final accuracy dotted) in every row."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    paths = []
    for bench in dict.fromkeys(c.benchmark for c in cells):
        tasks = has_tasks(resolved, bench)
        mine = [c for c in cells if c.benchmark == bench]
        groups = panels(settings.curves.groups, display.sort({c.method for c in mine}))
        buffers = sorted({str(c.buffer) for c in mine if str(c.buffer) != "none"}, key=buffer_key) or ["none"]
        layout = curve_layout(groups, mine, buffers)
        ncols = max(len(row) for row in layout)
        fig, axes = plt.subplots(len(layout), ncols, figsize=(4.6 * ncols, 3.2 * len(layout)),
                                 squeeze=False, sharey=True)
        colours = plt.get_cmap("tab10")
        for r, row in enumerate(layout):
            for ax in axes[r][len(row):]:
                ax.axis("off")
            for k, (b, title, lines) in enumerate(row):
                ax = axes[r][k]
                for i, (m, cell) in enumerate(lines):
                    curve = mean_curve(cell, tasks)
                    own = str(cell.buffer) == b
                    style = "-" if own and b != "none" else "--"
                    name = display.label(m) + ("" if own else " (no buffer)")
                    if len(curve) == 1:        # offline (JOINT): only the final accuracy
                        ax.axhline(curve[0], color=colours(i % 10), linestyle=":", label=f"{name}, final")
                    else:
                        ax.plot(range(1, len(curve) + 1), curve, style, color=colours(i % 10), label=name,
                                marker="o" if len(curve) <= 20 else None, markersize=3)
                ax.set_title(f"{title}, {_buffer_text(b)}", fontsize=9)
                ax.set_xlabel("after task" if tasks else "after stream segment", fontsize=8)
                if k == 0:
                    ax.set_ylabel("accuracy (%)" + (", tasks seen" if tasks else ""), fontsize=8)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        fig.suptitle(f"{bench}: accuracy over the stream (mean over seeds)")
        fig.tight_layout()
        paths.append(_save(fig, out_dir / f"{bench}-curves.png"))
    return paths


def _grid(plt, n: int, width: float = 3.6, height: float = 3.4):
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n], flat


def plot_confusions(bench: str, cells: list[RunResult], display, path: Path) -> Path:
    """Row-normalised confusion matrices of the first seed after the stream (the paper's Figure 6),
    every class labelled, one colour bar."""
    plt = _pyplot()
    fig, axes, flat = _grid(plt, len(cells), width=4.0)
    image = None
    for ax, c in zip(axes, cells):
        seed, result = first_seed(c)
        counts = np.asarray(result.confusion, dtype=float)
        seen = np.flatnonzero(counts.sum(1) > 0)      # outputs with no test images are left out
        counts = counts[seen][:, seen]
        image = ax.imshow(counts / counts.sum(1, keepdims=True), vmin=0, vmax=1, cmap="Blues")
        size = max(3.0, min(8.0, 240 / len(seen)))
        ax.set_xticks(range(len(seen)), [str(i) for i in seen], fontsize=size, rotation=90 if len(seen) > 20 else 0)
        ax.set_yticks(range(len(seen)), [str(i) for i in seen], fontsize=size)
        ax.set_title(f"{display.label(c.method)} ({_buffer_text(c.buffer)})", fontsize=9)
        ax.set_xlabel("predicted class", fontsize=8)
        ax.set_ylabel("true class", fontsize=8)
    fig.colorbar(image, ax=flat, shrink=0.8, label="fraction of the true class")
    fig.suptitle(f"{bench}: confusion matrices (seed {seed}, after the stream)")
    return _save(fig, path)


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


def plot_tsne(bench: str, cells: list[RunResult], display, path: Path, warn) -> Path | None:
    """t-SNE of the final penultimate features of the evaluation images (the paper's Figure 5). Runs whose
    features are degenerate or missing are skipped with a warning; no figure if none is left."""
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
        usable.append((c, saved, features))
    if not usable:
        return None
    # one embedding per thread, each on one OpenMP thread (and BLAS on one): faster than one at a time on all
    # cores (its gradient's sums release the GIL), and the same floats on any machine (the order of a
    # multi-threaded sum follows the cores)
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(min(len(usable), os.cpu_count() or 1)) as pool:
        embeddings = list(pool.map(embed_tsne, [features for _, _, features in usable]))
    plt = _pyplot()
    fig, axes, flat = _grid(plt, len(usable))
    for ax, (c, saved, _), xy in zip(axes, usable, embeddings):
        points = ax.scatter(xy[:, 0], xy[:, 1], c=saved["labels"].numpy(), cmap="tab10", s=3)
        ax.set_title(f"{display.label(c.method)} ({_buffer_text(c.buffer)})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.legend(*points.legend_elements(), title="class", loc="center right", fontsize=7, title_fontsize=8)
    fig.suptitle(f"{bench}: t-SNE of test features (seed {saved['seed']})")
    return _save(fig, path)


def plot_sensitivity(settings, cells: list[RunResult], path: Path) -> Path | None:
    """Class-IL against each swept setting of `report.sensitivity` (the paper's Figure 4: CoCa's omega and
    gamma), a panel per sweep, mean ± std over seeds. The x value is the setting each run trained with."""
    spec = settings.sensitivity
    if not spec:
        return None
    where = {(c.benchmark, c.method, str(c.buffer)): c for c in cells}
    points_of = []
    for i, sweep in enumerate(spec.sweeps):
        points = []
        for method in sweep.methods:
            cell = where.get((spec.benchmark, method, str(spec.buffer)))
            if cell is None:
                raise ReportError(f"report.sensitivity.sweeps[{i}]: no run {spec.benchmark}/{method}/{spec.buffer} "
                                  "in runs; add its run or drop it from the sweep")
            if sweep.parameter not in cell.run:
                raise ReportError(f"report.sensitivity.sweeps[{i}].parameter: {method!r} has no setting "
                                  f"{sweep.parameter!r} (`python -m gcl.describe` lists each method's settings)")
            accs = np.array([r.class_il for r in cell.seeds.values()], dtype=float)
            points.append((cell.run[sweep.parameter], accs.mean(), accs.std(ddof=1) if len(accs) > 1 else 0.0))
        points_of.append(sorted(points))
    plt = _pyplot()
    n = len(spec.sweeps)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.4), squeeze=False)
    for ax, sweep, points in zip(axes[0], spec.sweeps, points_of):
        x, m, sd = zip(*points)
        ax.errorbar(x, m, yerr=sd, marker="o", capsize=3)
        for mark in sweep.marks:   # e.g. a value where the method is undefined, so it has no point
            ax.axvline(mark.x, color="grey", linestyle=":")
            ax.annotate(mark.text, xy=(mark.x, min(m)), xytext=(-4, 0), textcoords="offset points", ha="right",
                        va="bottom", fontsize=8, color="grey")
            ax.set_xlim(left=min(ax.get_xlim()[0], mark.x - 0.05), right=max(ax.get_xlim()[1], mark.x + 0.05))
        ax.set_xlabel(sweep.label or sweep.parameter)
        ax.set_ylabel("Class-IL accuracy (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{spec.benchmark}, buffer {spec.buffer}: {spec.title}")
    return _save(fig, path)


def draw_all(resolved: dict, settings, display, cells: list[RunResult], out_dir: Path, warnings: list[str]) -> list[Path]:
    """Every figure; one that fails is skipped with a warning (a params error still stops the report)."""

    def note(message: str) -> None:
        warn(message, warnings)

    bench, chosen = visualised(settings, cells)
    jobs = [("curves", lambda: plot_curves(resolved, settings, display, cells, out_dir)),
            ("sensitivity", lambda: plot_sensitivity(settings, cells, out_dir / "sensitivity.png"))]
    if chosen:
        jobs += [("confusion", lambda: plot_confusions(bench, chosen, display, out_dir / f"{bench}-confusion.png")),
                 ("t-SNE", lambda: plot_tsne(bench, chosen, display, out_dir / f"{bench}-tsne.png", note))]
    drawn = []
    for name, job in jobs:
        try:
            result = job()
        except ReportError:
            raise
        except Exception as exc:   # one figure must not cost the tables
            note(f"figure {name} skipped: {type(exc).__name__}: {exc}")
            continue
        drawn += result if isinstance(result, list) else [result] if result else []
    return drawn
