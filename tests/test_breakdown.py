"""python -m gcl.bench breakdown (gcl.bench.breakdown): the phases of a `dvc repro` read from its time-stamped output."""
from __future__ import annotations

from pathlib import Path

import pytest

from gcl.bench import breakdown as breakdown_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def breakdown():
    return breakdown_module


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


def test_a_run_of_an_earlier_commit_with_offline_downloads_keeps_its_results(breakdown, tmp_path, monkeypatch):
    """--rev clones that commit, --downloads lands as the clone's data/downloads, --keep-results gets the clone's
    params.yaml, dvc.lock and results/ (dvc repro itself stood in for: it is what the clone runs)."""
    import subprocess
    root = ROOT
    # HEAD by its hash: a CI checkout may hold no earlier commit
    previous = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    downloads = tmp_path / "dl" / "MNIST" / "raw"
    downloads.mkdir(parents=True)
    (downloads / "train-images-idx3-ubyte").write_bytes(b"idx")
    seen = {}

    def fake_repro(cmd, cwd, env):
        seen["head"] = subprocess.run(["git", "-C", str(cwd), "rev-parse", "HEAD"], capture_output=True, text=True,
                                      check=True).stdout.strip()
        seen["downloaded"] = (cwd / "data" / "downloads" / "MNIST" / "raw" / "train-images-idx3-ubyte").read_bytes()
        (cwd / "dvc.lock").write_text("lock")
        (cwd / "results").mkdir(exist_ok=True)
        (cwd / "results" / "tables.md").write_text("tables")
        return LINES, 21.0
    monkeypatch.setattr(breakdown, "timed_lines", fake_repro)
    kept = tmp_path / "kept"
    total, rows = breakdown.one_run(None, None, rev=previous, downloads=tmp_path / "dl", keep_results=kept, root=ROOT)
    assert seen == {"head": previous, "downloaded": b"idx"} and total == 21.0 and rows
    assert (kept / "dvc.lock").read_text() == "lock" and (kept / "results" / "tables.md").read_text() == "tables"
    assert (kept / "params.yaml").read_text() == subprocess.run(
        ["git", "-C", str(root), "show", f"{previous}:params.yaml"], capture_output=True, text=True).stdout
    with pytest.raises(SystemExit, match="no such folder"):
        breakdown.main(["--downloads", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="holds no dvc.yaml"):       # the repository cloned: the current folder's
        breakdown.main(["--root", str(tmp_path)])
