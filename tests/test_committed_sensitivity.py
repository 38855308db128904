"""The committed reproductions' sensitivity figures (the paper's Figure 4, report.sensitivity) are drawn from their
own runs: the figure's data (results/plots/sensitivity/<parameter>.csv) holds every seed of every swept run that
the reproduction's summary.csv holds, with the same accuracy, and the axis of each panel is the swept setting."""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gcl.report.reproductions import read_summary

ROOT = Path(__file__).resolve().parents[1]


def swept_reproductions() -> list[Path]:
    """The committed reproductions whose params.yaml draws a sensitivity figure."""
    found = []
    for params in sorted((ROOT / "reproductions").glob("*/params.yaml")):
        if (yaml.safe_load(params.read_text()).get("report") or {}).get("sensitivity"):
            found.append(params.parent)
    return found


def test_both_benchmarks_sweeps_are_among_the_committed_sensitivity_figures():
    assert {"mnist-360-sensitivity", "online-cifar10"} <= {folder.name for folder in swept_reproductions()}


@pytest.mark.parametrize("folder", swept_reproductions(), ids=lambda folder: folder.name)
def test_each_point_of_a_committed_sweep_has_every_seed_of_its_run(folder: Path):
    sensitivity = yaml.safe_load((folder / "params.yaml").read_text())["report"]["sensitivity"]
    summary = read_summary(folder)
    assert (folder / "results" / "figures" / "sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for sweep in sensitivity["sweeps"]:
        parameter = sweep["parameter"]
        rows = pd.read_csv(folder / "results" / "plots" / "sensitivity" / f"{parameter}.csv")
        assert rows.columns[0] == parameter                         # the panel's axis is the swept setting
        assert set(rows["method"]) == set(sweep["methods"])
        xs = []
        for method in sweep["methods"]:
            run = summary[(summary["benchmark"] == sensitivity["benchmark"]) & (summary["method"] == method)
                          & (summary["buffer"] == str(sensitivity["buffer"]))]
            runs = dict(zip(run["seed"].astype(int), run["class_il"].astype(float)))
            mine = rows[rows["method"] == method].to_dict("records")
            assert sorted(int(r["seed"]) for r in mine) == sorted(runs) and runs, method
            for r in mine:                                          # the csv rounds to 2 decimals
                assert abs(float(r["class_il"]) - runs[int(r["seed"])]) <= 0.005 + 1e-9
                assert int(r["seeds"]) == len(runs)
                assert abs(float(r["mean"]) - statistics.mean(runs.values())) <= 0.005 + 1e-9
                if len(runs) > 1:
                    assert abs(float(r["std"]) - statistics.stdev(runs.values())) <= 0.005 + 1e-9
            point = {float(r[parameter]) for r in mine}
            assert len(point) == 1, f"{method} sits at more than one {parameter}: {point}"
            xs.append(point.pop())
        assert len(set(xs)) == len(xs), f"two runs of the {parameter} sweep share a point: {xs}"
