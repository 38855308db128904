"""gcl.snapshot (python -m gcl.snapshot) keeps a grid's finished runs across sittings: only finished runs of the profile,
the lock cut to its stages, the report only once it is this grid's whole report."""
import hashlib
from pathlib import Path

import yaml

from gcl import snapshot

PARAMS = {"sources": {"src": {}}, "benchmarks": {"b": {}},
          "runs": {"b-er-200": {"benchmark": "b", "method": "er", "buffer": 200},
                   "b-sgd-none": {"benchmark": "b", "method": "sgd", "buffer": "none"},
                   "b-coca-200": {"benchmark": "b", "method": "coca", "buffer": 200}}}


def run_folder(ws: Path, method: str, buffer, files=("metrics.json", "train.log")) -> dict:
    folder = ws / "runs" / "b" / method / str(buffer)
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(name)
    return {"outs": [{"path": f"runs/b/{method}/{buffer}", "md5": "x.dir", "nfiles": 2}]}


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    stages = {"check@runs": {"cmd": "c"}, "prepare@src": {"cmd": "p"}, "train@other-er-200": {"cmd": "t"},
              "train@b-er-200": run_folder(ws, "er", 200),            # finished
              "train@b-sgd-none": run_folder(ws, "sgd", "none", ("metrics.json",)),   # a file short
              "train@b-coca-200": run_folder(ws, "coca", 200)}        # being trained again (its lock held)
    (ws / ".gcl-progress").mkdir()
    (ws / ".gcl-progress" / "b-coca-200.lock").write_text("")
    (ws / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))
    return ws


def test_only_the_profiles_finished_runs_and_stages_are_kept(tmp_path):
    ws, dest = workspace(tmp_path), tmp_path / "repro"
    dest.mkdir()
    assert snapshot.snapshot(ws, dest) == ["train@b-er-200"]
    assert (dest / "runs/b/er/200/train.log").read_text() == "train.log"
    assert not (dest / "runs/b/sgd").exists() and not (dest / "runs/b/coca").exists()
    lock = yaml.safe_load((dest / "dvc.lock").read_text())["stages"]
    assert set(lock) == {"check@runs", "prepare@src", "train@b-er-200", "train@b-sgd-none", "train@b-coca-200"}
    assert yaml.safe_load((dest / "params.yaml").read_text()) == PARAMS
    assert not (dest / "results").exists()


def test_the_report_joins_once_it_is_the_whole_grids(tmp_path):
    ws, dest = workspace(tmp_path), tmp_path / "repro"
    dest.mkdir()
    summary = ws / "results" / "summary.csv"
    summary.parent.mkdir()
    lock = yaml.safe_load((ws / "dvc.lock").read_text())

    def write_summary(rows: str) -> None:
        summary.write_text("benchmark,method,buffer,seed,class_il\n" + rows)
        lock["stages"]["report"] = {"outs": [{"path": "results/summary.csv",
                                              "md5": hashlib.md5(summary.read_bytes()).hexdigest()}]}
        (ws / "dvc.lock").write_text(yaml.safe_dump(lock))

    write_summary("b,er,200,0,50.0\n")                 # another profile's report, or part of the grid
    assert "report" not in snapshot.snapshot(ws, dest)
    write_summary("b,er,200,0,50.0\nb,sgd,none,0,20.0\nb,coca,200,0,60.0\n")
    assert "report" in snapshot.snapshot(ws, dest)
    assert (dest / "results" / "summary.csv").read_text() == summary.read_text()
    assert "report" in yaml.safe_load((dest / "dvc.lock").read_text())["stages"]
    summary.write_text(summary.read_text() + "b,er,200,1,51.0\n")   # edited since dvc.lock recorded it
    assert "report" not in snapshot.snapshot(ws, dest)


def test_a_report_of_part_of_the_grid_stays_whole_while_later_runs_join(tmp_path):
    """A folder's report of its finished runs survives a snapshot of the whole profile (whose report is not made):
    its params.yaml, results/ and the stages recording that params.yaml stay; a run trained since joins runs/."""
    ws, dest = workspace(tmp_path), tmp_path / "repro"
    dest.mkdir()
    part = {**PARAMS, "runs": {"b-er-200": PARAMS["runs"]["b-er-200"]}}
    (ws / "params.yaml").write_text(yaml.safe_dump(part))
    summary = ws / "results" / "summary.csv"
    summary.parent.mkdir()
    summary.write_text("benchmark,method,buffer,seed,class_il\nb,er,200,0,50.0\n")
    lock = yaml.safe_load((ws / "dvc.lock").read_text())
    part_digest = hashlib.md5((ws / "params.yaml").read_bytes()).hexdigest()
    lock["stages"]["check@runs"] = {"cmd": "c", "deps": [{"path": "params.yaml", "md5": part_digest}]}
    lock["stages"]["report"] = {"deps": [{"path": "params.yaml", "md5": part_digest}],
                                "outs": [{"path": "results/summary.csv",
                                          "md5": hashlib.md5(summary.read_bytes()).hexdigest()}]}
    (ws / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert "report" in snapshot.snapshot(ws, dest)

    # the whole profile back; the coca run finishes; the check stage records the whole profile's digest now
    (ws / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (ws / ".gcl-progress" / "b-coca-200.lock").unlink()
    lock["stages"]["check@runs"]["deps"][0]["md5"] = hashlib.md5((ws / "params.yaml").read_bytes()).hexdigest()
    (ws / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert sorted(snapshot.snapshot(ws, dest)) == ["train@b-coca-200", "train@b-er-200"]
    assert yaml.safe_load((dest / "params.yaml").read_text()) == part
    assert (dest / "results" / "summary.csv").read_text() == summary.read_text()
    kept = yaml.safe_load((dest / "dvc.lock").read_text())["stages"]
    assert kept["check@runs"]["deps"][0]["md5"] == kept["report"]["deps"][0]["md5"] == part_digest
    assert "train@b-coca-200" in kept and (dest / "runs/b/coca/200/metrics.json").is_file()
