"""No silent wrong numbers: divergence stops a seed, results depend on the data they were made from, one
trainer per run, stages end with their parent, strict JSON, no stale temporaries."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gcl.config import resolve_run
from gcl.core.atomic import remove_stale_temporaries, save_tensors, write_json
from gcl.core.fingerprint import fingerprint, train_code_digest, tree_digest
from gcl.core.layout import TRAIN_CODE
from gcl.core.processes import RunLock, RunLockedError
from gcl.core.progress_files import PROGRESS_DIR
from gcl.data import mnist360, sequential
from gcl.training.loop import DivergenceError
from gcl.training.run import train_run
from gcl.training.train import run_seed
from helpers import run_settings, small_er_run, synthetic_source

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
ER = run_settings("er", buffer=50, lr=0.1, batch=4, replay_batch=8)


def test_a_diverging_run_stops_with_the_step_and_the_cause(tiny_mnist360):
    bench, cfg = tiny_mnist360
    with pytest.raises(DivergenceError, match=r"(non-finite \(NaN or inf\) at step \d+|no longer finite|predicts class "
                                              r"\d+ for every evaluation image).*learning rate"):
        run_seed(bench, cfg, run_settings("er", buffer=50, lr=1e4, batch=4, replay_batch=8), 0, CPU)


def test_a_nan_loss_names_its_first_step(tiny_mnist360, monkeypatch):
    from gcl.methods.er import ER as ERMethod
    bench, cfg = tiny_mnist360
    original, calls = ERMethod.observe, []

    def nan_from_step_5(self, x, y, x_raw):
        calls.append(1)
        loss = original(self, x, y, x_raw)
        return loss * float("nan") if len(calls) > 5 else loss

    monkeypatch.setattr(ERMethod, "observe", nan_from_step_5)
    with pytest.raises(DivergenceError, match=r"non-finite \(NaN or inf\) at step 5 of"):
        run_seed(bench, cfg, ER, 0, CPU)


def test_a_stacked_seeds_nan_loss_names_the_seed_and_its_first_step(tiny_mnist360, monkeypatch):
    """In a stacked group only seed 1's loss turns NaN, from its step 7: the group stops naming seed 1 and step 7
    (not its evaluation's step), and a group resumed from a checkpoint inside that window would name it too."""
    from gcl.methods.er import ER as ERMethod
    from gcl.training.train import train_stacked
    bench, cfg = tiny_mnist360
    original, calls = ERMethod.observe, []

    def nan_in_seed_1_from_step_7(self, x, y, x_raw):
        calls.append(1)
        loss = original(self, x, y, x_raw)
        if len(calls) > 7:
            loss = loss * torch.tensor([1.0, float("nan"), 1.0])
        return loss

    monkeypatch.setattr(ERMethod, "observe", nan_in_seed_1_from_step_7)
    with pytest.raises(DivergenceError, match=r"seed\(s\) \[1\]: the loss became non-finite \(NaN or inf\) at step 7 of"):
        train_stacked(bench, cfg, ER, [0, 1, 2], CPU)


def test_json_is_written_strictly(tmp_path):
    with pytest.raises(ValueError):
        write_json(tmp_path / "m.json", {"class_il": float("nan")})
    assert not (tmp_path / "m.json").exists() and not list(tmp_path.glob(".*.tmp"))


def test_the_code_digest_sees_source_and_not_bytecode(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "main.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "m.py").write_text("y = 2\n")
    digest = tree_digest(["main.py", "pkg"], tmp_path)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0bytecode")
    (tmp_path / "pkg" / "stray.pyc").write_bytes(b"\0")
    assert tree_digest(["main.py", "pkg"], tmp_path) == digest
    (tmp_path / "pkg" / "sub" / "m.py").write_text("y = 3\n")
    assert tree_digest(["main.py", "pkg"], tmp_path) != digest
    (tmp_path / "pkg" / "sub" / "m.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "sub" / "m.py").rename(tmp_path / "pkg" / "sub" / "n.py")
    assert tree_digest(["main.py", "pkg"], tmp_path) != digest      # a file's name is part of the code
    with pytest.raises(FileNotFoundError, match="missing"):
        tree_digest(["main.py", "gone"], tmp_path)


def test_check_runs_depends_on_all_the_code_train_stages_run():
    """The train stages' only link to their code is the digest check@runs writes: check@ must depend on all of
    it, and the train stages on their settings and benchmark."""
    import yaml
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(TRAIN_CODE) <= set(stages["check"]["do"]["deps"])
    assert stages["train"]["do"]["deps"] == ["data/benchmarks/${item.benchmark}", "resolved/runs/${key}.json"]
    assert stages["train"]["do"]["cmd"].startswith("python -m gcl.warm stages/train.py")   # itself part of TRAIN_CODE


@pytest.mark.slow
def test_a_train_stage_refuses_settings_resolved_for_other_code(tmp_path):
    project = tmp_path / "project"
    for part in ("stages", "src/gcl"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
    key = "mnist-360-er-200"
    write_json(project / "resolved" / "runs" / f"{key}.json", {"key": key, "code": "resolved-for-older-code"})
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "GCL_WARM": "0"}
    done = subprocess.run([sys.executable, "stages/train.py", key], cwd=project, env=env, capture_output=True,
                          text=True)
    assert done.returncode != 0
    assert f"resolved/runs/{key}.json was resolved for other code" in done.stderr
    assert "run `dvc repro check@runs`" in done.stderr
    assert not (project / "runs").exists()
    write_json(project / "resolved" / "runs" / f"{key}.json",
               {"key": key, "code": tree_digest(TRAIN_CODE, project)})
    done = subprocess.run([sys.executable, "stages/train.py", key], cwd=project, env=env, capture_output=True,
                          text=True)
    assert "resolved for other code" not in done.stderr   # past the check (it then lacks params.yaml)


def test_the_resume_fingerprint_covers_the_benchmark_data(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    save_tensors(a, {"x": torch.zeros(3)})
    save_tensors(b, {"x": torch.ones(3)})
    assert fingerprint({"lr": 0.1}, files=(a,)) != fingerprint({"lr": 0.1}, files=(b,))
    assert fingerprint({"lr": 0.1}, files=(a,)) == fingerprint({"lr": 0.1}, files=(a,))


def test_the_resume_fingerprint_hashes_the_train_stages_code_and_no_other(tmp_path, monkeypatch):
    """One code scope (gcl.core.layout.TRAIN_CODE) for the train stages' digest and the seeds' resume fingerprint:
    an edit outside it (the report) keeps every interrupted run's checkpoints, an edit inside it (a method) does not."""
    from gcl.core import layout
    project = tmp_path / "project"
    for part in (*TRAIN_CODE, "src/gcl/report", "src/gcl/config.py"):
        (project / part).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, project / part)
    monkeypatch.setattr(layout, "PROJECT", project)
    before = fingerprint({"lr": 0.1}, 0, "cpu")
    assert train_code_digest() == train_code_digest(project / "stages" / "train.py")   # what check@runs writes
    for outside in ("src/gcl/report/settings.py", "src/gcl/config.py"):
        with open(project / outside, "a") as f:
            f.write("\n# an edit outside the train stages' code\n")
        assert fingerprint({"lr": 0.1}, 0, "cpu") == before, outside
    with open(project / "src/gcl/methods/er.py", "a") as f:
        f.write("\n# an edit of a method\n")
    assert fingerprint({"lr": 0.1}, 0, "cpu") != before


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return small_er_run([0, 1])


def test_seeds_finished_on_other_data_are_not_reused(project, monkeypatch):
    import gcl.training.run as run_module
    trained = []
    original = run_module.train_seeds
    # seed 0 finished, then the run was interrupted; meanwhile the benchmark was rebuilt from other data
    def crash_on_seed_1(*a, **kw):
        if a[3] == [1]:
            raise KeyboardInterrupt
        return original(*a, **kw)

    monkeypatch.setattr(run_module, "train_seeds", crash_on_seed_1)
    with pytest.raises(KeyboardInterrupt):
        train_run(project)
    bench = mnist360.build_benchmark(synthetic_source(per_class=48), project.data)
    bench["config"] = project.data.model_dump(mode="json")
    save_tensors("data/benchmarks/mnist-360/benchmark.pt", bench)
    monkeypatch.setattr(run_module, "train_seeds", lambda *a, **kw: (trained.extend(a[3]), original(*a, **kw))[1])
    out = json.loads(train_run(project).read_text())
    assert trained == [0, 1]                       # seed 0 was trained again on the new data
    assert out["seeds"]["0"]["steps"] == out["seeds"]["1"]["steps"]


def test_a_second_trainer_of_a_locked_run_is_refused(project):
    with RunLock(PROGRESS_DIR / "er-50.lock", "er-50"):
        with pytest.raises(RunLockedError, match=rf"run er-50 is being trained by another process \(pid {os.getpid()}\)"):
            train_run(project)
    train_run(project)   # released with its holder


def test_stale_temporaries_are_removed(tmp_path):
    (tmp_path / ".metrics.json.abc.tmp").write_text("half")
    (tmp_path / ".figures.xyz.tmp").mkdir()
    (tmp_path / "metrics.json").write_text("{}")
    removed = remove_stale_temporaries(tmp_path)
    assert len(removed) == 2 and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def _processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working directory is `folder` (the stage and its workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == folder:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_killing_a_stages_parent_ends_the_stage_and_its_workers(tmp_path):
    folder = tmp_path.resolve()
    params = {"seeds": [0, 1], "device": "cpu", "workers": 2, "sources": {"synthetic": {}},
              "benchmarks": {"seq": {"kind": "sequential", "source": "synthetic", "backbone": "mlp", "epochs": 400,
                                     "n_tasks": 5, "classes_per_task": 2, "augment": False}},
              "methods": {"er": {}}, "runs": {"long": {"benchmark": "seq", "method": "er", "buffer": 50, "lr": 0.05,
                                                        "batch": 4, "replay_batch": 8}}}
    import yaml
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    spec = resolve_run(params, "long")
    write_json(folder / "resolved/runs/long.json", {**spec.to_json(), "code": tree_digest(TRAIN_CODE, ROOT)})
    bench = sequential.build_benchmark(synthetic_source(per_class=20), spec.data)
    bench["config"] = spec.data.model_dump(mode="json")
    save_tensors(folder / "data/benchmarks/seq/benchmark.pt", bench)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # the parent stands in for `dvc repro`: it starts the stage and waits for it
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                               f"'-m', 'gcl.warm', {str(ROOT / 'stages' / 'train.py')!r}, 'long'])"], cwd=folder, env=env)
    try:
        deadline = time.time() + 60
        while len(_processes_in(folder)) < 4 and time.time() < deadline:   # parent, stage, two workers
            time.sleep(0.2)
        assert len(_processes_in(folder)) >= 4, "the stage did not start its workers"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 20
        while _processes_in(folder) and time.time() < deadline:
            time.sleep(0.2)
        left = _processes_in(folder)
        assert not left, f"processes outlived their parent: {left}"
        # only the progress log was written; no result
        assert [p.name for p in (folder / "runs").rglob("*") if p.is_file()] == ["train.log"]
    finally:
        for pid in _processes_in(folder):
            os.kill(pid, signal.SIGKILL)


def test_a_run_lock_leaves_no_file_and_never_holds_a_removed_one(tmp_path, monkeypatch):
    path = tmp_path / "r.lock"
    with RunLock(path, "r"):
        assert path.read_text() == str(os.getpid())
    assert not path.exists()                       # a finished trainer leaves nothing to sweep
    # its file removed between our open and our lock (by the previous holder letting go): the lock is taken anew
    real_open, opened = os.open, []

    def open_then_remove(p, *args):
        fd = real_open(p, *args)
        if not opened:
            os.unlink(p)
        opened.append(fd)
        return fd
    monkeypatch.setattr(os, "open", open_then_remove)
    with RunLock(path, "r") as lock:
        assert len(opened) == 2 and lock.fd == opened[1] and path.exists()
