"""End to end, as a user would: `dvc repro` on the ci profile in a fresh copy of the project."""
import json
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL_SKIP = {".git", "data", "runs", "results", "resolved", ".gcl-progress", "dvc.lock", ".venv"}
ANYWHERE_SKIP = {"__pycache__", ".pytest_cache", "*.egg-info"}
CHECKS = {"check@data", "check@runs", "check@reproductions"}   # each reads params.yaml: every edit re-runs them


def ignore(directory, names):
    """Copy the project as a fresh clone would have it: no outputs, no caches, no git history."""
    skip = [n for n in names if n in ANYWHERE_SKIP or n.endswith(".egg-info")]
    if Path(directory) == ROOT:
        skip += [n for n in names if n in TOP_LEVEL_SKIP]
    if Path(directory) == ROOT / ".dvc":
        skip += [n for n in names if n in {"cache", "tmp"}]
    return skip


def sh(cwd, *cmd, env=None, check=True):
    env = {**os.environ, "PYTHONPATH": str(cwd / "src"), **(env or {})}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def stages_run(output: str) -> set[str]:
    """The stages a `dvc repro` output says it ran."""
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


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


@contextmanager
def edited(project, **changes):
    """params.yaml with `a__b__c=value` set, restored (and re-run) afterwards."""
    params_file = project / "params.yaml"
    original = params_file.read_text()
    params = yaml.safe_load(original)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = params
        for k in parents:
            node = node[k]
        node[leaf] = value
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        yield
    finally:
        params_file.write_text(original)


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
    assert headline["mnist-360"]["200"]["er"]["class_il"] == round(cell["mean"]["class_il"], 2)
    for fig in ("curves", "confusion", "tsne"):
        assert (project / f"results/figures/mnist-360-{fig}.png").stat().st_size > 1000
    assert (project / "runs/mnist-360/er/200/features.pt").exists()
    assert not (project / ".gcl-progress" / "mnist-360-er-200").exists()


@pytest.mark.e2e
def test_second_repro_runs_nothing(project):
    out = sh(project, "dvc", "repro").stdout
    assert "Running stage" not in out


@pytest.mark.e2e
@pytest.mark.parametrize("change", [{"runs__mnist-360-er-200__lr": 0.05},
                                    {"runs__mnist-360-er-200__epochs": 2}])   # a run's own epochs override
def test_changing_one_run_reruns_only_that_run(project, change):
    with edited(project, **change):
        ran = stages_run(sh(project, "dvc", "repro").stdout)
        if "runs__mnist-360-er-200__epochs" in change:
            cell = json.loads((project / "runs/mnist-360/er/200/metrics.json").read_text())
            assert cell["config"]["benchmark"]["epochs"] == 2
    assert ran == {*CHECKS, "train@mnist-360-er-200", "report"}
    sh(project, "dvc", "repro")


@pytest.mark.e2e
def test_a_caption_reruns_only_the_report_and_threads_nothing(project):
    with edited(project, **{"report__benchmarks__mnist-360__label": "another caption"}):
        assert not train_stages_named(sh(project, "dvc", "status").stdout)
        ran = stages_run(sh(project, "dvc", "repro").stdout)
        assert ran == {*CHECKS, "report"}
        assert "another caption" in (project / "results/tables.md").read_text()
    sh(project, "dvc", "repro")
    with edited(project, **{"threads": 2}):
        ran = stages_run(sh(project, "dvc", "repro").stdout)
        assert ran == CHECKS
    sh(project, "dvc", "repro")


def train_stages_named(status: str) -> set[str]:
    """The train stages a `dvc status` (or `dvc repro --dry`) output names."""
    return {word.rstrip(":") for word in status.split() if word.startswith("train@")}


@pytest.mark.e2e
@pytest.mark.parametrize("change", [{"runs__mnist-360-er-200__lr": 0.05}, {"runs__mnist-360-er-200__epochs": 2},
                                    {"runs__mnist-360-er-200__batch": 8}])
def test_dvc_status_names_the_train_stage_of_an_edited_run_before_anything_runs(project, change):
    with edited(project, **change):
        status = sh(project, "dvc", "status").stdout
        dry = sh(project, "dvc", "repro", "--dry").stdout
    assert train_stages_named(status) == {"train@mnist-360-er-200"}, status
    assert "changed command" in status
    assert {s for s in stages_run(dry) if s.startswith("train@")} == {"train@mnist-360-er-200"}, dry


@pytest.mark.e2e
@pytest.mark.parametrize("change, stale", [
    ({"runs__mnist-360-er-200__lr": 0.05}, {"train@mnist-360-er-200"}),
    ({"methods__sgd": {"lr": 0.3}}, set()),                  # the run's own lr overrides the method's
    ({"benchmarks__mnist-360__epochs": 2}, {"train@mnist-360-er-200", "train@mnist-360-sgd-none",
                                            "train@mnist-360-joint-none"}),
    ({"workers": 2}, set()),
])
def test_after_check_runs_dvc_status_names_the_train_stages_an_edit_reruns(project, change, stale):
    with edited(project, **change):
        assert "check@runs" in sh(project, "dvc", "status").stdout
        sh(project, "dvc", "repro", "check@runs")
        status = sh(project, "dvc", "status").stdout
        dry = sh(project, "dvc", "repro", "--dry").stdout
    assert train_stages_named(status) == stale, status
    assert {s for s in stages_run(dry) if s.startswith("train@")} == stale, dry
    sh(project, "dvc", "repro", "check@runs")


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["dvc repro -f -s", "dvc repro -s", "python -m gcl.warm stages/train.py"])
def test_a_stage_alone_refuses_settings_params_yaml_no_longer_says(project, how):
    """After an edit, a train stage run without check@runs (which resolves the edit) refuses in one line
    naming the setting and the fix; a plain `dvc repro` then trains with the new value."""
    cell = "mnist-360-er-200"
    command = how.split() + ([f"train@{cell}"] if how.startswith("dvc") else [cell])
    with edited(project, **{f"runs__{cell}__lr": 0.05}):
        done = sh(project, *command, check=False)
        said = done.stdout + done.stderr
        # `dvc repro -s` runs it too: the run's settings are part of its command, which the edit changed
        assert done.returncode != 0 and "Traceback" not in said, said
        assert f"runs.{cell}: lr" in said and f"dvc repro train@{cell}" in said, said
        sh(project, "dvc", "repro")
        cell_config = json.loads((project / "runs/mnist-360/er/200/metrics.json").read_text())["config"]
        assert cell_config["run"]["lr"] == 0.05
    sh(project, "dvc", "repro")


@pytest.mark.e2e
@pytest.mark.parametrize("change, message", [
    ({"device": "cuda:7"}, "params.yaml asks for device: cuda:7"),
    ({"runs__mnist-360-er-200__buffer": 200.0}, "runs.mnist-360-er-200.buffer = 200.0 is not accepted"),
])
def test_an_error_the_user_can_fix_is_one_line_without_traceback(project, change, message):
    with edited(project, **change):
        done = sh(project, "dvc", "repro", check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and message in said and "Traceback" not in said, said
    sh(project, "dvc", "repro")


@pytest.mark.e2e
def test_a_folder_where_metrics_json_belongs_is_one_line_and_the_seeds_are_kept(project):
    out = project / "runs/mnist-360/er/200"
    (out / "metrics.json").unlink()
    (out / "metrics.json").mkdir()
    done = sh(project, "python", "-m", "gcl.warm", "stages/train.py", "mnist-360-er-200", check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in said, said
    assert f"error: cannot use {Path('runs/mnist-360/er/200/metrics.json')}: Is a directory" in said, said
    (out / "metrics.json").rmdir()
    again = sh(project, "python", "-m", "gcl.warm", "stages/train.py", "mnist-360-er-200").stdout
    assert again.count("finished by an earlier attempt") == 2, again      # the seeds' results were kept
    sh(project, "dvc", "repro")
    assert "up to date" in sh(project, "dvc", "status").stdout


@pytest.mark.e2e
def test_importing_with_bytecode_on_leaves_every_stage_up_to_date(project):
    """On a user's machine Python writes __pycache__ into the source folders that stages depend on."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(project / "src")
    code = ("import pkgutil, importlib, gcl, gcl.methods, gcl.data\n"
            "for m in pkgutil.walk_packages(gcl.__path__, 'gcl.'):\n    importlib.import_module(m.name)\n")
    subprocess.run(["python", "-c", code], cwd=project, env=env, check=True)
    subprocess.run(["python", "-m", "pytest", "-q", "--collect-only", "tests/test_buffer.py"], cwd=project,
                   env=env, check=True, capture_output=True)
    assert list((project / "src" / "gcl" / "methods").glob("__pycache__/*.pyc"))
    status = sh(project, "dvc", "status").stdout
    assert "up to date" in status, status


@pytest.mark.e2e
def test_a_change_to_the_training_code_makes_every_train_stage_stale(project):
    """Train stages depend on the code they run through the digest check@runs writes into their settings: an
    edit makes check@ stale, then every train stage, and a train stage run alone before check@runs refuses."""
    source = project / "src" / "gcl" / "methods" / "er.py"
    original = source.read_bytes()
    trains = {line.split()[0] for line in sh(project, "dvc", "stage", "list").stdout.splitlines()
              if line.startswith("train@")}
    try:
        source.write_bytes(original + b"# an edit\n")
        status = sh(project, "dvc", "status").stdout
        assert "check@runs" in status and "src/gcl/methods" in status, status
        # DVC itself sees nothing new for the stage alone (its two files are unchanged): forced, it refuses
        done = sh(project, "dvc", "repro", "-s", "-f", "train@mnist-360-er-200", check=False)
        assert done.returncode != 0
        assert "was resolved for other code" in done.stdout + done.stderr
        assert "dvc repro check@runs" in done.stdout + done.stderr
        sh(project, "dvc", "repro", "check@runs")
        status = sh(project, "dvc", "status").stdout
        assert {s for s in trains if f"{s}:" in status} == trains, status
    finally:
        source.write_bytes(original)
    # the forced stage had its outputs removed by DVC before it refused: DVC's run cache restores them
    out = sh(project, "dvc", "repro").stdout
    assert not {s for s in stages_run(out) if s.startswith("train@")}, out
    assert "up to date" in sh(project, "dvc", "status").stdout


@pytest.mark.e2e
def test_a_bad_param_stops_repro_before_training_with_the_projects_message(project):
    for change, message in [
        ({"runs__mnist-360-er-200__lr": "fast"}, "runs.mnist-360-er-200.lr = 'fast' is not accepted"),
        ({"runs__mnist-360-er-200__method": "err"}, "runs.mnist-360-er-200.method: 'err' has no block under methods"),
        ({"workers": 0}, "params.yaml.workers = 0 is not accepted"),
    ]:
        with edited(project, **change):
            done = sh(project, "dvc", "repro", check=False)
        assert done.returncode != 0, change
        assert message in done.stdout + done.stderr
        assert not {s for s in stages_run(done.stdout) if s.startswith("train@")}
        assert not (project / ".gcl-progress" / "mnist-360-er-200").exists()   # stopped before training
    assert stages_run(sh(project, "dvc", "repro").stdout) <= CHECKS


@pytest.mark.e2e
def test_another_profile_runs_in_its_own_workspace_and_leaves_this_one_alone(project, tmp_path):
    """The README's recipe: a git worktree of the same repository holds the other profile's params.yaml,
    outputs and dvc.lock; this workspace keeps its params, results and up-to-date stages."""
    before = {p: (project / p).read_bytes() for p in ("params.yaml", "dvc.lock", "results/tables.md")}
    other = tmp_path / "other-profile"
    sh(project, "git", "worktree", "add", "-q", str(other))
    params = yaml.safe_load((other / "profiles" / "ci.yaml").read_text())
    params["seeds"] = [0]
    params["runs"] = {k: v for k, v in params["runs"].items() if k == "mnist-360-sgd-none"}
    params["report"] = {"figures": False}
    (other / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(other, "dvc", "repro")
    assert json.loads((other / "runs/mnist-360/sgd/none/metrics.json").read_text())["seeds"].keys() == {"0"}
    assert {p: (project / p).read_bytes() for p in before} == before
    assert "up to date" in sh(project, "dvc", "status").stdout


@pytest.mark.e2e
def test_a_cell_trained_on_another_machine_is_gathered_without_training_it(project, tmp_path):
    """The README's recipe for many machines: clone A trains one cell and pushes it, with DVC's run cache, to a
    shared remote (here a local folder); clone B pulls, and its `dvc repro --pull` restores that cell instead of
    training it, trains the rest, and reports all of them."""
    a, b, store = tmp_path / "a", tmp_path / "b", tmp_path / "store"
    sh(tmp_path, "git", "clone", "-q", str(project), str(a))
    params = yaml.safe_load((a / "params.yaml").read_text())
    params["seeds"] = [0]
    (a / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(a, "dvc", "remote", "add", "-d", "store", str(store))
    sh(a, "git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "one seed; the shared remote")
    cell = "mnist-360-er-200"
    assert stages_run(sh(a, "dvc", "repro", f"train@{cell}").stdout) >= {f"train@{cell}"}
    sh(a, "dvc", "push", "--run-cache")

    sh(tmp_path, "git", "clone", "-q", str(a), str(b))
    out = sh(b, "dvc", "repro", "--pull").stdout
    assert f"Stage 'train@{cell}' is cached - skipping run, checking out outputs" in out
    # check@reproductions too: `dvc repro train@<cell>` in A did not run it (it is upstream of the report only)
    assert stages_run(out) == {"check@reproductions", "train@mnist-360-sgd-none", "train@mnist-360-joint-none",
                               "report"}
    mine = json.loads((b / "runs/mnist-360/er/200/metrics.json").read_text())
    assert mine == json.loads((a / "runs/mnist-360/er/200/metrics.json").read_text())
    summary = pd.read_csv(b / "results/summary.csv")
    er = summary[(summary["method"] == "er") & (summary["buffer"].astype(str) == "200")]
    assert list(er["class_il"]) == [mine["seeds"]["0"]["class_il"]]
    assert "up to date" in sh(b, "dvc", "status").stdout


@pytest.mark.e2e
def test_queued_experiments_run_and_both_show_in_exp_show(project):
    """The DVC way to run several experiments: queue them, start a worker, compare them in `dvc exp show`."""
    for lr in (0.05, 0.1):
        sh(project, "dvc", "exp", "run", "--queue", "-S", f"runs.mnist-360-er-200.lr={lr}", "-n", f"lr-{lr}")
    sh(project, "dvc", "queue", "start", "-j", "1")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = sh(project, "dvc", "queue", "status").stdout
        if not any(state in status for state in ("Queued", "Running")):
            break
        time.sleep(3)
    assert "Failed" not in status, status + sh(project, "dvc", "queue", "logs", "lr-0.05", check=False).stdout
    shown = json.loads(sh(project, "dvc", "exp", "show", "--json").stdout)
    names = {r["name"] for rev in shown for exp in (rev.get("experiments") or []) for r in exp["revs"]}
    assert {"lr-0.05", "lr-0.1"} <= names, names
    sh(project, "dvc", "queue", "stop", check=False)


@pytest.mark.e2e
def test_an_edited_reproduction_stops_repro_before_the_report_and_results_stay(project):
    """check@reproductions refuses it in one line before DVC deletes the report's outputs to run the report."""
    summary = project / "reproductions/mnist-360/results/summary.csv"
    original, before = summary.read_text(), (project / "results/tables.md").read_text()
    tampered = original.replace("mnist-360,sgd,none,0,", "mnist-360,sgd,none,0,1", 1)    # SGD seed 0's Class-IL
    assert tampered != original
    summary.write_text(tampered)
    try:
        with edited(project, report__reproductions=["reproductions/mnist-360"]):
            done = sh(project, "dvc", "repro", check=False)
    finally:
        summary.write_text(original)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in said, said
    assert ("error: reproductions/mnist-360/results/summary.csv is not the file reproductions/mnist-360/dvc.lock "
            "records") in said, said
    assert "report" not in stages_run(done.stdout)
    assert (project / "results/tables.md").read_text() == before and (project / "results/summary.csv").exists()
    sh(project, "dvc", "repro")
    assert "up to date" in sh(project, "dvc", "status").stdout
