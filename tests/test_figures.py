"""Figures: readable panels (at most eight lines), curves over the tasks seen so far, confusion matrices
with a colour bar and every class labelled, t-SNE that skips degenerate features instead of crashing. The
values come typed from gcl.report.plot_data; gcl.report.figures only draws them."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gcl.core.atomic import write_json
from gcl.core.results import RunResult
from gcl.core.settings import ParamsError, validate
from gcl.report import figures, plot_data
from gcl.report.display import Display
from gcl.report.plot_data import Curve
from gcl.report.settings import MAX_LINES, ReportSettings
from gcl.report.summary import ResolvedReport, summary_frame
from gcl.report.write import write_report

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "reference").glob("*.csv"))


def cell(method, buffer, curve=(10.0, 20.0, 30.0), confusion=((5, 0, 1), (0, 4, 0), (2, 0, 3)), acc_matrix=None,
         run=None):
    run = {"benchmark": "b", "method": method, "buffer": buffer, **(run or {})}
    return RunResult.from_json({"benchmark": "b", "method": method, "buffer": buffer, "config": {"run": run},
                                "seeds": {"0": {"class_il": curve[-1], "curve": list(curve), "acc_matrix": acc_matrix,
                                                "confusion": [list(r) for r in confusion]}}})


def resolved_for(cells, has_tasks=False, report=None):
    return {"seeds": [0], "benchmarks": {"b": {"label": "B", "source": "s", "kind": "k", "has_tasks": has_tasks}},
            "methods": {}, "runs": {f"{c.method}-{c.buffer}": c.run for c in cells},
            "report": report or {}}


def display_for(cells, report=None) -> Display:
    return Display(ResolvedReport.from_json(resolved_for(cells, report=report)))


def curve(method, buffer, values=(10.0, 20.0, 30.0)) -> Curve:
    return Curve("b", method, str(buffer), False, list(values))


def test_task_average_curve():
    assert plot_data.task_average_curve([[90.0, 0.0], [60.0, 80.0]]) == [90.0, 70.0]
    assert plot_data.task_average_curve([[80.0, 60.0, 70.0]]) == [70.0]    # offline: one row after every task


def test_curves_are_typed_values_per_run():
    """Each run's mean curve over seeds: over the tasks seen so far where the benchmark has tasks."""
    cells = [cell("er", 200, acc_matrix=[[90.0, 0.0], [60.0, 80.0]]), cell("sgd", "none")]
    with_tasks = ResolvedReport.from_json(resolved_for(cells, has_tasks=True))
    assert plot_data.curves(cells, with_tasks) == [Curve("b", "er", "200", True, [90.0, 70.0]),
                                                   Curve("b", "sgd", "none", True, [10.0, 20.0, 30.0])]
    without = ResolvedReport.from_json(resolved_for(cells))
    assert plot_data.curves(cells, without)[0] == Curve("b", "er", "200", False, [10.0, 20.0, 30.0])


def test_panels_hold_at_most_eight_methods():
    ordered = [f"m{i}" for i in range(13)]
    groups = figures.panels({"first": ["m12", "m0", "absent"], "again": ["m0"]}, ordered)
    assert groups[0] == ("first", ["m12", "m0"])                         # named group; absent method dropped
    assert all(title != "again" for title, _ in groups)                  # a panel of methods drawn already
    rest = [ms for t, ms in groups[1:]]
    assert [len(ms) for ms in rest] == [8, 3] and rest[0][0] == "m1"
    with pytest.raises(ParamsError, match="at most 8"):
        validate(ReportSettings, {"curves": {"groups": {"big": ordered[:9]}}}, "report")


@pytest.mark.slow
def test_curve_figure_panels_and_lines(tmp_path, monkeypatch):
    """12 methods at two buffers + a bufferless one: a 2 x 2 grid, no panel over MAX_LINES lines, and the
    bufferless method drawn dashed in both rows."""
    cells = [cell(f"m{i}", b) for i in range(12) for b in (200, 1000)] + [cell("sgd", "none")]
    curves = plot_data.curves(cells, ResolvedReport.from_json(resolved_for(cells)))
    captured = {}
    real_save = figures._save

    def keep(fig, path):
        captured["axes"] = fig.axes
        return real_save(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    figures.plot_curves(curves, {}, display_for(cells), tmp_path)
    axes = captured["axes"]
    assert len(axes) == 4
    assert [ax.get_title() for ax in axes] == ["methods (1), B=200", "methods (2), B=200",
                                               "methods (1), B=1000", "methods (2), B=1000"]
    assert max(len(ax.get_lines()) for ax in axes) <= MAX_LINES
    sgd = [line for ax in axes for line in ax.get_lines() if line.get_label() == "sgd (no buffer)"]
    assert len(sgd) == 2 and all(line.get_linestyle() == "--" for line in sgd)
    assert (tmp_path / "b-curves.png").stat().st_size > 5000


def test_confusion_figure_labels_every_class_and_has_a_colour_bar(tmp_path, monkeypatch):
    cells = [cell("coca-ckd-scl", 200), cell("er", 200)]
    settings = ReportSettings.model_validate({"visualise": {"benchmark": "b", "cells": ["coca-ckd-scl/200", "er/200"]}})
    confusions = plot_data.confusions(settings, cells)
    assert [(c.method, c.buffer, c.seed) for c in confusions] == [("coca-ckd-scl", "200", 0), ("er", "200", 0)]
    captured = {}
    real_save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: (captured.update(axes=fig.axes), real_save(fig, path))[1])
    display = display_for(cells, report={"methods": {"coca-ckd-scl": {"label": "CKD+SCL"}}})
    figures.plot_confusions("b", confusions, display, tmp_path / "c.png")
    panels, bar = captured["axes"][:2], captured["axes"][-1]
    assert [ax.get_title() for ax in panels] == ["CKD+SCL (B=200)", "er (B=200)"]
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["0", "1", "2"]
    assert bar.get_ylabel() == "fraction of the true class"
    image = panels[0].get_images()[0].get_array()
    assert np.allclose(image[0], [5 / 6, 0, 1 / 6])                     # rows normalised


def test_degenerate_features():
    assert plot_data.degenerate(np.zeros((50, 4))) == "all features identical (e.g. all zero)"
    bad = np.random.default_rng(0).normal(size=(50, 4))
    bad[3, 1] = np.nan
    assert plot_data.degenerate(bad) == "non-finite features"
    assert plot_data.degenerate(np.ones((3, 4))).startswith("too few")
    assert plot_data.degenerate(np.random.default_rng(0).normal(size=(50, 4))) is None


@pytest.mark.slow
def test_a_figure_that_cannot_be_drawn_is_skipped_with_a_warning(tmp_path, monkeypatch):
    """All-zero features (t-SNE crashed on them) and non-finite ones: skipped and named; the other
    figures and every table are written."""
    monkeypatch.chdir(tmp_path)
    cells = [cell("er", 200), cell("sgd", "none")]
    for c, feats in zip(cells, (torch.zeros(60, 8), torch.full((60, 8), float("nan")))):
        write_json(Path("runs/b", c.method, str(c.buffer), "metrics.json"), c.to_json())
        figures_dir = Path("runs/b", c.method, str(c.buffer))
        torch.save({"features": feats, "labels": torch.zeros(60, dtype=torch.long), "seed": 0},
                   figures_dir / "features.pt")
    resolved = resolved_for(cells, report={"figures": True, "visualise": {"benchmark": "b", "cells": ["er/200", "sgd/none"]}})
    warnings = write_report(resolved, "results", PAPER)
    assert warnings == ["t-SNE: runs/b/er/200/features.pt: all features identical (e.g. all zero); er/200 skipped",
                        "t-SNE: runs/b/sgd/none/features.pt: non-finite features; sgd/none skipped"]
    assert sorted(p.name for p in Path("results/figures").iterdir()) == ["b-confusion.png", "b-curves.png"]
    assert "non-finite features" in Path("results/tables.md").read_text()
    assert json.loads(Path("results/metrics.json").read_text()) == {}     # no CoCa here: no headline


def test_a_failing_figure_does_not_cost_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = cell("er", 200)
    write_json(Path("runs/b/er/200/metrics.json"), c.to_json())
    monkeypatch.setattr(figures, "plot_curves", lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")))
    warnings = write_report(resolved_for([c], report={"figures": True}), "results", PAPER)
    assert warnings == ["figure curves skipped: ValueError: boom"]
    assert Path("results/tables.md").exists() and Path("results/plots/curves/b/er_200.csv").exists()


def test_a_panel_adding_nothing_at_a_buffer_is_left_out():
    """A sweep run at buffer 500 only: at 200 its panel would repeat CoCa alone, so it is left out there."""
    mine = [curve(m, b) for m in ("coca", "er") for b in ("200", "500")] + [curve("coca-w05", "500"), curve("sgd", "none")]
    groups = [("main", ["sgd", "er", "coca"]), ("sweep", ["coca", "coca-w05"])]
    layout = figures.curve_layout(groups, mine, ["200", "500"])
    assert [[(b, t, [m for m, _ in lines]) for b, t, lines in row] for row in layout] == [
        [("200", "main", ["sgd", "er", "coca"])],
        [("500", "main", ["sgd", "er", "coca"]), ("500", "sweep", ["coca", "coca-w05"])]]
    assert layout[0][0][2][0][1].buffer == "none"                  # SGD drawn from its bufferless run


def test_a_sweeps_marks_are_drawn_as_dotted_lines_with_their_note(tmp_path, monkeypatch):
    """Figure 4's omega sweep ends at omega = 1, where the closed form has no value: a mark says so."""
    runs = []
    for name, omega in (("coca", 0.1), ("coca-w09", 0.9)):
        runs.append(cell(name, 500, run={"omega": omega}))
    sweep = {"parameter": "omega", "methods": ["coca", "coca-w09"], "label": "ω",
             "marks": [{"x": 1.0, "text": "ω = 1: undefined"}]}
    report = {"sensitivity": {"benchmark": "b", "buffer": 500, "sweeps": [sweep]}}
    resolved = ResolvedReport.from_json(resolved_for(runs, report=report))
    settings = resolved.settings
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    sweeps = plot_data.sweep_panels(resolved, summary_frame(runs))
    assert [(p.x, p.mean) for p in sweeps[0].points] == [(0.1, 30.0), (0.9, 30.0)]
    figures.plot_sensitivity(settings.sensitivity, sweeps, tmp_path / "s.png")
    ax = drawn["fig"].axes[0]
    assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.get_lines())
    assert any("ω = 1: undefined" in t.get_text() for t in ax.texts)
    assert any("The paper's Figure 4 is on Seq-CIFAR-100 at buffer 500." in t.get_text() for t in drawn["fig"].texts)


@pytest.mark.slow
def test_a_tsne_embedding_is_the_same_in_a_worker_thread_as_single_threaded():
    """The report embeds the runs side by side in threads, each on one OpenMP thread: what it draws is the
    one-thread embedding, whichever thread computed it."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    from gcl.report.plot_data import embed_tsne
    rng = np.random.default_rng(0)
    features = np.concatenate([rng.normal(c, 1.0, (40, 8)) for c in (0.0, 4.0, 8.0)]).astype(np.float32)
    with threadpool_limits(1):
        alone = embed_tsne(features)
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(embed_tsne, [features, features]))
    assert alone.shape == (120, 2) and all(np.array_equal(alone, t) for t in threaded)


@pytest.mark.slow
def test_every_figure_is_drawn_from_the_runs(tmp_path, monkeypatch):
    """A report with curves, visualised runs (confusion, t-SNE) and a sweep draws all four figures, no warning."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    cells = [cell("er", 200, run={"omega": 0.1}), cell("coca", 200, run={"omega": 0.5}, curve=(20.0, 40.0)),
             cell("sgd", "none")]
    for c in cells:
        write_json(Path("runs/b", c.method, str(c.buffer), "metrics.json"), c.to_json())
        labels = torch.arange(60) % 3
        features = torch.from_numpy(rng.normal(size=(60, 8)).astype(np.float32)) + 4 * labels[:, None]
        torch.save({"features": features, "labels": labels, "seed": 0}, Path("runs/b", c.method, str(c.buffer), "features.pt"))
    report = {"figures": True, "visualise": {"benchmark": "b", "cells": ["sgd/none", "er/200", "coca/200"]},
              "sensitivity": {"benchmark": "b", "buffer": 200, "sweeps": [{"parameter": "omega", "methods": ["er", "coca"]}]}}
    assert write_report(resolved_for(cells, report=report), "results", PAPER) == []
    drawn = sorted(p.name for p in Path("results/figures").iterdir())
    assert drawn == ["b-confusion.png", "b-curves.png", "b-tsne.png", "sensitivity.png"]
    assert all(Path("results/figures", name).stat().st_size > 5000 for name in drawn)
    assert sorted(p.name for p in Path("results/plots/confusion/b").iterdir()) == ["coca_200.csv", "er_200.csv",
                                                                                   "sgd_none.csv"]


# ---------------------------------------------------------------------------- figures that agree

def default_profile_curves():
    """A curve for every run of the default profile (params.yaml), and its display: the figures as its report
    draws them, on made-up values."""
    from gcl.config import load_params, resolve_report
    resolved = ResolvedReport.from_json(resolve_report(load_params(ROOT / "params.yaml")))
    curves = [Curve(r["benchmark"], r["method"], str(r["buffer"]), resolved.has_tasks(r["benchmark"]),
                    [10.0, 20.0] if r["method"] != "joint" else [30.0]) for r in resolved.runs.values()]
    return curves, resolved.settings.curves.groups, Display(resolved)


def drawn_lines(figs):
    """(figure, panel, method, colour) of every line of every panel: the figures' own colour assignment."""
    return [(bench, ax.get_title(), line.get_gid(), line.get_color())
            for bench, fig in figs.items() for ax in fig.axes for line in ax.get_lines() if line.get_gid()]


def test_every_figure_of_the_default_profile_gives_a_method_one_colour():
    import matplotlib.pyplot as plt
    figs = figures.curve_figures(*default_profile_curves())
    lines = drawn_lines(figs)
    colours = {}
    for _, _, method, colour in lines:
        colours.setdefault(method, set()).add(colour)
    assert set(figs) == {"mnist-360", "seq-mnist"} and len(colours) > 18    # more than tab10 and Dark2 hold
    assert {m: c for m, c in colours.items() if len(c) > 1} == {}        # one colour per method, every panel
    panels = {}
    for bench, title, method, colour in lines:
        panels.setdefault((bench, title), {})[method] = colour
    assert all(len(set(by_method.values())) == len(by_method) for by_method in panels.values())   # lines differ
    plt.close("all")


def test_the_colours_follow_the_report_order_and_differ_within_a_panel():
    colours = figures.method_colours(["a", "b", "c", "d"], [{"a", "b"}, {"b", "c"}, {"a", "d"}])
    assert colours["a"] == colours["c"] == figures.PALETTE[0]    # never in one panel: the first colour each
    assert colours["b"] == colours["d"] == figures.PALETTE[1]


@pytest.mark.slow
def test_legends_stand_outside_the_curves_and_every_axis_is_explained():
    import matplotlib.pyplot as plt
    figs = figures.curve_figures(*default_profile_curves())
    for bench, fig in figs.items():
        fig.canvas.draw()
        for ax in (ax for ax in fig.axes if ax.get_legend()):
            assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0   # below the panel
            assert ax.get_xlabel() == ("tasks seen (evaluated after each)" if bench == "seq-mnist"
                                       else "stream segments seen (evaluated after each)")
        assert "dashed: a method without a buffer" in fig.texts[0].get_text()       # the line styles, said
        assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()][0].startswith("accuracy (%)")
    plt.close("all")


@pytest.mark.parametrize("n, shape, shown", [(4, (2, 2), 4), (6, (2, 3), 6), (5, (2, 3), 5), (3, (1, 3), 3), (7, (3, 3), 7)])
def test_the_visualised_runs_fill_rows_of_at_most_three_as_even_as_can_be(n, shape, shown):
    import matplotlib.pyplot as plt
    fig, _, _ = figures._grid(plt, n)
    assert (len(fig.axes) == shape[0] * shape[1]) and sum(ax.axison for ax in fig.axes) == shown
    assert fig.axes[0].get_gridspec().get_geometry() == shape
    plt.close(fig)
