"""tools/breakdown.py: the phases of a `dvc repro` read from its time-stamped output."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BREAKDOWN = Path(__file__).resolve().parents[1] / "tools" / "breakdown.py"


@pytest.fixture
def breakdown(monkeypatch):
    spec = importlib.util.spec_from_file_location("breakdown_under_test", BREAKDOWN)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


LINES = [
    (0.5, "Running stage 'check@data':"), (0.9, "> python stages/check.py data"), (3.0, "params.yaml: data settings valid"),
    (3.4, "Updating lock file 'dvc.lock'"),
    (4.0, "Running stage 'train@m-er-200':"), (4.5, "> python stages/train.py m-er-200"),
    (6.5, "[m-er-200] 2 seed(s) to train on cpu, 2 process(es)"),
    (7.0, "[m-er-200 seed 0] segment 27/27, step 910/910, 900 samples/s, elapsed 0:00:04, left 0:00:00, last accuracy 50.00"),
    (9.0, "[m-er-200 seed 0] done: class-il 50.00 in 4.0s (900 samples/s)"),
    (9.5, "[m-er-200 seed 1] done: class-il 51.00 in 4.5s (800 samples/s)"),
    (10.0, "runs/m/er/200/metrics.json"), (11.0, "Updating lock file 'dvc.lock'"),
    (12.0, "Stage 'train@m-sgd-none' is cached - skipping run, checking out outputs"),
    (13.0, "Running stage 'report':"), (13.2, "> python stages/report.py"), (20.0, "results/tables.md"),
]


def test_phases_of_each_stage(breakdown):
    rows = {r["stage"]: r for r in breakdown.parse(LINES, total=21.0)}
    check, train, cached, report = (rows[k] for k in ("check@data", "train@m-er-200", "train@m-sgd-none", "report"))
    assert check["kind"] == "check" and check["dvc"] == pytest.approx(0.4 + 0.0 + 1.0) and check["other"] == pytest.approx(2.1)
    assert train["dvc"] == pytest.approx(0.5 + 2.0) and train["start-up"] == pytest.approx(2.0)
    assert train["seeds"] == pytest.approx(3.5) and train["training"] == pytest.approx(8.5)
    assert cached["dvc"] == pytest.approx(1.0) and cached["seeds"] == 0.0    # restored: DVC's time only
    assert report["other"] == pytest.approx(6.8) and report["dvc"] == pytest.approx(0.2 + 1.0)
    text = breakdown.summary(21.0, list(rows.values()))
    assert "cold `dvc repro`: 21.0 s wall, 4 stages" in text and "DVC before the first stage: 0.5 s" in text


def test_the_machine_speed_probe_is_reported_beside_the_run(breakdown):
    ms = breakdown.machine_speed(batch=10, steps=20, repeats=2)
    assert 0 < ms < 1000
    rows = breakdown.parse(LINES, total=21.0)
    text = breakdown.summary(21.0, rows, ((0.45, 9.5), (0.6, 12.25)))
    assert "batch 10 0.450 ms before the run, 0.600 ms after; batch 800 9.50 ms before, 12.25 ms after" in text
    assert "machine speed" not in breakdown.summary(21.0, rows)
