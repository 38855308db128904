"""Stage report's outputs under results/: tables.md (the accuracies), costs.md (what each run cost, the methods'
own metrics), summary.csv (one row per seed of a run), metrics.json (the numbers `dvc exp show` compares),
plots/ (the data `dvc plots` reads) and figures/ (PNG).

Every output is built in a temporary folder first and moved into place only when all of them succeeded.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from gcl.core.atomic import remove_stale_temporaries
from gcl.core.errors import writing
from gcl.core.results import RunResult
from gcl.report import plot_data
from gcl.report.common import warn
from gcl.report.document import (
    COSTS,
    TABLES,
    ProfileResults,
    profile_results,
    read_reproduction,
    render_costs,
    render_tables,
)
from gcl.report.figures import draw_all
from gcl.report.paper import read_paper
from gcl.report.summary import ResolvedReport, load_cells, stale_runs, summary_frame
from gcl.report.tables import headline_metrics

OUTPUTS = (TABLES, COSTS, "summary.csv", "metrics.json", "figures", "plots")


def write_report(resolved: dict, out_dir: str | Path, paper_csvs: list[str | Path]) -> list[str]:
    """The report of `resolved` (resolved/runs/report.json) beside the paper's numbers (reference/*.csv). Builds
    every output in a temporary folder beside `out_dir`; moves them into place only when all succeeded. Returns
    the warnings (also printed and listed at the top of tables.md)."""
    out_dir = Path(out_dir)
    report = ResolvedReport.from_json(resolved)
    cells = load_cells(report)
    paper = read_paper(paper_csvs)
    reproductions = [read_reproduction(f, paper) for f in report.settings.reproductions]
    warnings: list[str] = []
    for folder in stale_runs(report):
        warn(f"stale: {folder} is not a run of params.yaml; delete it", warnings)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)             # what a killed report left
    build = Path(tempfile.mkdtemp(prefix=".report.", suffix=".tmp", dir=out_dir))
    try:
        with writing(out_dir, build):    # a full disk names results/<file>, not the build folder that goes
            render_report(report, summary_frame(cells), cells, paper, build, warnings, reproductions)
        for name in OUTPUTS:
            dest = out_dir / name
            if dest.is_dir():
                shutil.rmtree(dest)
            elif dest.exists():
                dest.unlink()
            os.replace(build / name, dest)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return warnings


def render_report(report: ResolvedReport, summary: pd.DataFrame, cells: list[RunResult] | None, paper: pd.DataFrame,
                  out: Path, warnings: list[str], reproductions: list[ProfileResults] = (), figures: bool = True) -> None:
    """Every output of OUTPUTS into the empty folder `out`, from the runs' results: the one renderer of the report
    stage and of check@reproductions, which renders a committed reproduction again to compare it with what it holds.
    `cells` None (a reproduction committed without its runs/): the summary alone, so no curves, confusion matrices
    or figures drawn from them; `figures` False: no PNG drawn (their warnings neither)."""
    this = profile_results(report, summary, paper)
    sweeps = this.sweeps                           # a sweep's error (a run it names is missing) before any output
    (out / "figures").mkdir()
    (out / "plots").mkdir()
    curves = plot_data.curves(cells, report) if cells is not None else []
    confusions = plot_data.confusions(report.settings, cells) if cells is not None else []
    plot_data.write_plot_data(curves, confusions, out / "plots", sweeps)
    if figures and report.settings.figures and cells is not None:
        draw_all(report.settings, this.display, cells, curves, confusions, sweeps, out / "figures", warnings)
    this.summary.to_csv(out / "summary.csv", index=False)
    (out / "metrics.json").write_text(json.dumps(headline_metrics(this.head), indent=2, allow_nan=False) + "\n")
    (out / COSTS).write_text(render_costs(this, reproductions))
    (out / TABLES).write_text(render_tables(this, paper, warnings, reproductions))
