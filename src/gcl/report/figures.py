"""The report's figures (PNG), drawn from gcl.report.plot_data's values; nothing is computed from the runs here.

Curves: one figure per benchmark, a row of panels per buffer, a column per group of at most MAX_LINES methods
(report.curves.groups, then the others in row order); methods without a buffer are drawn in every row as
references. Confusion matrices and t-SNE of report.visualise's runs (first seed), and the sensitivity sweep of
report.sensitivity (the paper's Figure 4).

Every figure is drawn on its own: one that cannot be drawn (degenerate features, a missing file) is skipped
with a warning and the others are kept.
"""
from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gcl.core.atomic import atomic_path
from gcl.core.results import RunResult
from gcl.report import plot_data
from gcl.report.cache import CACHE_DIR, Kept, key_of
from gcl.report.common import ReportError, buffer_key, warn
from gcl.report.display import Display, buffer_text
from gcl.report.plot_data import Confusion, Curve, Embedding, SweepPanel
from gcl.report.settings import MAX_LINES, ReportSettings, Sensitivity


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


FIGURE_CACHE = CACHE_DIR / "figures"
REPORT_CODE = sorted(Path(__file__).parent.glob("*.py"))   # what draws a figure: labels, layout, this module


def _saved(kept: Kept | None, path: Path, inputs: object, draw: Callable[[], object]) -> Path:
    """`path`: a copy of the PNG this code drew from the same `inputs` (all that `draw` reads) in an earlier report,
    kept in `kept`; else drawn (`draw` gives the figure), saved and kept. No cache where `kept` is None."""
    if kept is None:
        return _save(draw(), path)
    cached = kept.path(key_of(REPORT_CODE, ["matplotlib"], (path.name, inputs)))
    if cached.exists():
        shutil.copyfile(cached, path)
        return path
    _save(draw(), path)
    with atomic_path(cached) as tmp:
        shutil.copyfile(path, tmp)
    return path


# ---------------------------------------------------------------------------- curves

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


def curve_layout(groups: list[tuple[str, list[str]]], mine: list[Curve],
                 buffers: list[str]) -> list[list[tuple[str, str, list[tuple[str, Curve]]]]]:
    """Figure rows of panels (buffer, title, [(method, curve)]): per buffer, each group's methods that ran at
    that buffer or without one; a panel whose methods an earlier panel of that buffer drew already is left
    out (e.g. a sweep run at one buffer only), and a buffer's panels wrap after MAX_COLUMNS."""
    rows = []
    for b in buffers:
        drawn, row = set(), []
        for title, methods in groups:
            lines = []
            for m in methods:
                curve = next((c for c in mine if c.method == m and c.buffer == b), None) \
                    or next((c for c in mine if c.method == m and c.buffer == "none"), None)
                if curve is not None:
                    lines.append((m, curve))
            if lines and not {m for m, _ in lines} <= drawn:
                row.append((b, title, lines))
                drawn |= {m for m, _ in lines}
        rows += [row[i:i + MAX_COLUMNS] for i in range(0, len(row), MAX_COLUMNS)]
    return rows


# One colour per method in every figure and panel; matplotlib's tab10 first, then Dark2, then tab20's light shades
# (faint on white, so last)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
           "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def method_colours(methods: list[str], panels: list[set[str]]) -> dict[str, str]:
    """Each method's one colour for every figure: in `methods`' order (the report's rows), the first colour of
    PALETTE that no method sharing a panel (`panels`) with it has taken, so that the lines of a panel differ."""
    colours: dict[str, str] = {}
    for i, m in enumerate(methods):
        taken = {colours[n] for panel in panels if m in panel for n in panel if n in colours}
        colours[m] = next((c for c in PALETTE if c not in taken), PALETTE[i % len(PALETTE)])
    return colours


def axis_labels(tasks: bool) -> tuple[str, str]:
    """(x, y) labels of a curve panel: what one step on the x axis is, what the accuracy is measured on."""
    if tasks:
        return "tasks seen (evaluated after each)", "accuracy (%), mean over the tasks seen"
    return "stream segments seen (evaluated after each)", "accuracy (%) on every test class"


def benchmark_layout(mine: list[Curve], groups: dict[str, list[str]], display: Display):
    """One benchmark's figure rows of panels (curve_layout): per buffer, its method groups."""
    buffers = sorted({c.buffer for c in mine if c.buffer != "none"}, key=buffer_key) or ["none"]
    return curve_layout(panels(groups, display.sort({c.method for c in mine})), mine, buffers)


def curve_figure(bench: str, layout, tasks: bool, labels: dict[str, str], colours: dict[str, str]):
    """One benchmark's figure: a row of panels per buffer (`layout`: benchmark_layout's), each method under its
    label and in its colour, each panel's legend below it, outside the curves; methods without a buffer (dashed;
    JOINT's final accuracy dotted) in every row."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    ncols = max(len(row) for row in layout)
    fig, axes = plt.subplots(len(layout), ncols, figsize=(4.6 * ncols, 4.6 * len(layout)), squeeze=False, sharey=True)
    x_label, y_label = axis_labels(tasks)
    for r, row in enumerate(layout):
        for ax in axes[r][len(row):]:
            ax.axis("off")
        for k, (b, title, lines) in enumerate(row):
            ax = axes[r][k]
            for m, curve in lines:
                _draw_curve(ax, curve, labels[m], own=curve.buffer == b, colour=colours[m])
            ax.set_title(f"{title}, {buffer_text(b)}", fontsize=9)
            ax.set_xlabel(x_label, fontsize=8)
            if k == 0:
                ax.set_ylabel(y_label, fontsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.suptitle(f"{bench}: accuracy over the stream, mean over seeds\n"
                 "solid: the method at the panel's buffer; dashed: a method without a buffer (in every row); "
                 "dotted: an offline method's final accuracy", fontsize=10)
    fig.tight_layout()
    return fig


def _draw_curve(ax, curve: Curve, name: str, own: bool, colour: str) -> None:
    """One method's line in a panel (its gid: the method's key): its curve, or a dotted level for an offline
    method's one final accuracy."""
    name += "" if own else " (no buffer)"
    values = curve.values
    if len(values) == 1:
        ax.axhline(values[0], color=colour, linestyle=":", label=f"{name}, final", gid=curve.method)
    else:
        ax.plot(range(1, len(values) + 1), values, "-" if own and curve.buffer != "none" else "--", color=colour,
                label=name, marker="o" if len(values) <= 20 else None, markersize=3, gid=curve.method)


def curve_plans(curves: list[Curve], groups: dict[str, list[str]], display: Display) -> dict[str, tuple]:
    """Per benchmark, all its curve figure draws (curve_figure's arguments after the benchmark): its layout,
    whether it has tasks, and its methods' labels and colours, each method in one colour across all figures."""
    by_bench = {b: [c for c in curves if c.benchmark == b] for b in dict.fromkeys(c.benchmark for c in curves)}
    layouts = {b: benchmark_layout(mine, groups, display) for b, mine in by_bench.items()}
    shared = [{m for m, _ in lines} for layout in layouts.values() for row in layout for _, _, lines in row]
    colours = method_colours(display.sort({c.method for c in curves}), shared)
    return {b: (layouts[b], mine[0].has_tasks, {m: display.label(m) for m in dict.fromkeys(c.method for c in mine)},
                {m: colours[m] for m in dict.fromkeys(c.method for c in mine)})
            for b, mine in by_bench.items()}


def curve_figures(curves: list[Curve], groups: dict[str, list[str]], display: Display) -> dict[str, object]:
    """Each benchmark's curve figure (matplotlib)."""
    return {b: curve_figure(b, *plan) for b, plan in curve_plans(curves, groups, display).items()}


def plot_curves(curves: list[Curve], groups: dict[str, list[str]], display: Display, out_dir: Path,
                kept: Kept | None = None) -> list[Path]:
    """One PNG per benchmark (curve_figure), drawn where `kept` has none of the same plan."""
    return [_saved(kept, out_dir / f"{b}-curves.png", (b, plan), lambda b=b, plan=plan: curve_figure(b, *plan))
            for b, plan in curve_plans(curves, groups, display).items()]


# ---------------------------------------------------------------------------- the visualised runs

def _grid(plt, n: int, width: float = 3.6, height: float = 3.4):
    nrows = math.ceil(n / 3)                 # at most 3 a row, the rows as even as can be (4: 2 x 2)
    ncols = math.ceil(n / nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n], flat


def plot_confusions(bench: str, confusions: list[Confusion], display: Display, path: Path,
                    kept: Kept | None = None) -> Path:
    """Row-normalised confusion matrices of the first seed after the stream (the paper's Figure 6),
    every class labelled, one colour bar."""
    labels = {c.method: display.label(c.method) for c in confusions}
    return _saved(kept, path, (bench, confusions, labels), lambda: _confusion_figure(bench, confusions, labels))


def _confusion_figure(bench: str, confusions: list[Confusion], labels: dict[str, str]):
    plt = _pyplot()
    fig, axes, flat = _grid(plt, len(confusions), width=4.0)
    image = None
    for ax, c in zip(axes, confusions):
        counts = c.counts.astype(float)
        seen = np.flatnonzero(counts.sum(1) > 0)      # outputs with no test images are left out
        counts = counts[seen][:, seen]
        image = ax.imshow(counts / counts.sum(1, keepdims=True), vmin=0, vmax=1, cmap="Blues")
        size = max(3.0, min(8.0, 240 / len(seen)))
        ax.set_xticks(range(len(seen)), [str(i) for i in seen], fontsize=size, rotation=90 if len(seen) > 20 else 0)
        ax.set_yticks(range(len(seen)), [str(i) for i in seen], fontsize=size)
        ax.set_title(f"{labels[c.method]} ({buffer_text(c.buffer)})", fontsize=9)
        ax.set_xlabel("predicted class", fontsize=8)
        ax.set_ylabel("true class", fontsize=8)
    fig.colorbar(image, ax=flat, shrink=0.8, label="fraction of the true class")
    fig.suptitle(f"{bench}: confusion matrices (seed {confusions[-1].seed}, after the stream)")
    return fig


def plot_tsne(bench: str, embeddings: list[Embedding], display: Display, path: Path,
              kept: Kept | None = None) -> Path | None:
    """t-SNE of the final penultimate features of the evaluation images (the paper's Figure 5); no figure
    without an embedding."""
    if not embeddings:
        return None
    labels = {e.method: display.label(e.method) for e in embeddings}
    return _saved(kept, path, (bench, embeddings, labels), lambda: _tsne_figure(bench, embeddings, labels))


def _tsne_figure(bench: str, embeddings: list[Embedding], labels: dict[str, str]):
    plt = _pyplot()
    fig, axes, flat = _grid(plt, len(embeddings))
    for ax, e in zip(axes, embeddings):
        points = ax.scatter(e.xy[:, 0], e.xy[:, 1], c=e.labels, cmap="tab10", s=3)
        ax.set_title(f"{labels[e.method]} ({buffer_text(e.buffer)})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.legend(*points.legend_elements(), title="class", loc="center right", fontsize=7, title_fontsize=8)
    fig.suptitle(f"{bench}: t-SNE of test features (seed {embeddings[-1].seed})")
    return fig


# ---------------------------------------------------------------------------- the sensitivity sweeps

SENSITIVITY = "sensitivity.png"   # under results/figures/
MARK_BAND = 0.2                   # share of a panel's height under its data, where a mark's two lines of text go

def plot_sensitivity(spec: Sensitivity | None, sweeps: list[SweepPanel], path: Path,
                     kept: Kept | None = None) -> Path | None:
    """Class-IL against each swept setting (the paper's Figure 4: CoCa's omega and gamma), a panel per sweep,
    mean ± std over seeds; no figure without a sweep."""
    sweeps = [panel for panel in sweeps if not panel.pending]     # a sweep whose runs have not all run: not drawn
    if spec is None or not sweeps:
        return None
    inputs = (spec.model_dump(), [(panel.sweep.model_dump(), panel.points) for panel in sweeps])   # plain data: a
    return _saved(kept, path, inputs, lambda: _sensitivity_figure(spec, sweeps))    # model's pickle holds a set


def _sensitivity_figure(spec: Sensitivity, sweeps: list[SweepPanel]):
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.5 * len(sweeps), 3.4), squeeze=False)
    for ax, panel in zip(axes[0], sweeps):
        x, m, sd = ([getattr(p, k) for p in panel.points] for k in ("x", "mean", "std"))
        ax.errorbar(x, m, yerr=sd, marker="o", capsize=3)
        if panel.sweep.marks:            # a band under the data for the marks' text, so no error bar crosses it
            low, high = ax.get_ylim()
            ax.set_ylim(low - MARK_BAND / (1 - MARK_BAND) * (high - low), high)
        for mark in panel.sweep.marks:   # e.g. a value where the method is undefined, so it has no point
            ax.axvline(mark.x, color="grey", linestyle=":")
            ax.annotate(mark.text, xy=(mark.x, 0.02), xycoords=("data", "axes fraction"), xytext=(-4, 0),
                        textcoords="offset points", ha="right", va="bottom", fontsize=8, color="grey")
            ax.set_xlim(left=min(ax.get_xlim()[0], mark.x - 0.05), right=max(ax.get_xlim()[1], mark.x + 0.05))
        ax.set_xlabel(panel.sweep.label or panel.sweep.parameter)
        ax.set_ylabel("Class-IL accuracy (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{spec.benchmark}, buffer {spec.buffer}: {spec.title}")
    fig.text(0.5, -0.02, f"Mean ± std over seeds. {spec.paper_note}", ha="center", va="top", fontsize=8)
    return fig


# ---------------------------------------------------------------------------- all of them

def draw_all(settings: ReportSettings, display: Display, cells: list[RunResult], curves: list[Curve],
             confusions: list[Confusion], sweeps: list[SweepPanel], out_dir: Path, warnings: list[str]) -> list[Path]:
    """Every figure; one that fails is skipped with a warning (a params error still stops the report).
    `curves`, `confusions` and `sweeps`: plot_data's, as results/plots holds them; the t-SNE embeddings (the
    slowest part, where not cached) are computed in the background meanwhile."""

    def note(message: str) -> None:
        warn(message, warnings)

    bench, chosen = plot_data.visualised(settings, cells)
    kept = Kept(FIGURE_CACHE, ".png")
    # the features are read (and their warnings given) before any figure; their t-SNE, the slowest part, is
    # computed in the background while the other figures are drawn
    usable = _attempt("t-SNE", lambda: plot_data.visualised_features(chosen, note), note, None) if chosen else None
    with ThreadPoolExecutor(1) as background:
        embedded = background.submit(plot_data.embeddings, usable) if usable is not None else None
        jobs = [("curves", lambda: plot_curves(curves, settings.curves.groups, display, out_dir, kept)),
                ("sensitivity", lambda: plot_sensitivity(settings.sensitivity, sweeps, out_dir / SENSITIVITY, kept))]
        if chosen:
            jobs.append(("confusion", lambda: plot_confusions(bench, confusions, display,
                                                              out_dir / f"{bench}-confusion.png", kept)))
        if embedded:
            jobs.append(("t-SNE", lambda: plot_tsne(bench, embedded.result(), display, out_dir / f"{bench}-tsne.png",
                                                    kept)))
        drawn = [path for name, job in jobs for path in _drawn(name, job, note)]
    kept.prune()
    return drawn


def _drawn(name: str, job, note) -> list[Path]:
    """The files one figure job drew (none where it failed: _attempt)."""
    result = _attempt(name, job, note, None)
    return result if isinstance(result, list) else [result] if result else []


def _attempt(name: str, job, note, failed):
    """`job()`, or `failed` with a warning (`note`) where it raises: one figure must not cost the tables. A params
    error (ReportError) still stops the report."""
    try:
        return job()
    except ReportError:
        raise
    except Exception as exc:
        note(f"figure {name} skipped: {type(exc).__name__}: {exc}")
        return failed
