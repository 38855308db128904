"""End to end, as a user would: `dvc repro` on the ci profile in a fresh copy of the project."""
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL_SKIP = {".git", "data", "runs", "results", ".gcl-progress", "dvc.lock", ".venv"}
ANYWHERE_SKIP = {"__pycache__", ".pytest_cache", "*.egg-info"}


def ignore(directory, names):
    """Copy the project as a fresh clone would have it: no outputs, no caches, no git history."""
    skip = [n for n in names if n in ANYWHERE_SKIP or n.endswith(".egg-info")]
    if Path(directory) == ROOT:
        skip += [n for n in names if n in TOP_LEVEL_SKIP]
    if Path(directory) == ROOT / ".dvc":
        skip += [n for n in names if n in {"cache", "tmp"}]
    return skip


def sh(cwd, *cmd):
    env = {**os.environ, "PYTHONPATH": str(cwd / "src")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    dst = tmp_path_factory.mktemp("project")
    shutil.copytree(ROOT, dst, dirs_exist_ok=True, ignore=ignore)
    shutil.copy(dst / "profiles" / "ci.yaml", dst / "params.yaml")
    sh(dst, "git", "init", "-q")
    sh(dst, "git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    sh(dst, "git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "ci profile")
    sh(dst, "dvc", "repro")
    return dst


@pytest.mark.e2e
def test_repro_writes_the_output_contract(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    cell = json.loads((project / "runs/mnist-360/er/200/metrics.json").read_text())
    assert {"benchmark", "method", "buffer", "device", "config", "seeds", "mean", "std"} <= set(cell)
    assert cell["buffer"] == 200 and cell["device"] == "cpu"
    assert sorted(cell["seeds"]) == ["0", "1"]
    seed = cell["seeds"]["0"]
    assert {"class_il", "task_il", "acc_matrix", "forgetting", "train_seconds", "samples_per_second"} <= set(seed)
    assert seed["task_il"] is None and len(seed["acc_matrix"]) == 27
    assert 0 <= cell["mean"]["class_il"] <= 100
    summary = pd.read_csv(project / "results/summary.csv")
    assert len(summary) == len(params["runs"]) * len(params["seeds"])
    tables = (project / "results/tables.md").read_text()
    assert "49.27" in tables and "19.02" in tables            # the paper's ER-200 and SGD numbers
    assert f"{cell['mean']['class_il']:.2f} ± {cell['std']['class_il']:.2f}" in tables
    headline = json.loads((project / "results/metrics.json").read_text())
    assert headline["class_il"]["mnist-360"]["er"]["200"] == round(cell["mean"]["class_il"], 2)
    for fig in ("curves", "confusion", "tsne"):
        assert (project / f"results/figures/mnist-360-{fig}.png").stat().st_size > 1000
    assert (project / "runs/mnist-360/er/200/features.pt").exists()
    assert not (project / ".gcl-progress" / "mnist-360-er-200").exists()


@pytest.mark.e2e
def test_second_repro_runs_nothing(project):
    out = sh(project, "dvc", "repro")
    assert "Running stage" not in out


@contextmanager
def er_200_lr(project, value):
    """params.yaml with the ER-200 cell's lr set to `value`, restored afterwards."""
    params_file = project / "params.yaml"
    original = params_file.read_text()
    params = yaml.safe_load(original)
    params["runs"]["mnist-360-er-200"]["lr"] = value
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        yield
    finally:
        params_file.write_text(original)


@pytest.mark.e2e
def test_changing_one_cell_reruns_only_that_cell(project):
    with er_200_lr(project, 0.05):
        status = sh(project, "dvc", "status")
    stale = {line.rstrip(":") for line in status.splitlines() if line and not line.startswith(("\t", " "))}
    assert stale == {"train@mnist-360-er-200", "report"}, status


@pytest.mark.e2e
def test_a_bad_param_stops_the_stage_with_a_clear_error(project):
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    with er_200_lr(project, "fast"):
        done = subprocess.run(["dvc", "repro", "-s", "train@mnist-360-er-200"], cwd=project, env=env,
                              capture_output=True, text=True)
    assert done.returncode != 0
    assert "runs.mnist-360-er-200.lr must be a float, got 'fast'" in done.stdout + done.stderr
    assert not (project / ".gcl-progress" / "mnist-360-er-200").exists()   # stopped before training
