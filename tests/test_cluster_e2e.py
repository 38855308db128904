"""`python -m gcl.cluster` end to end on profiles/ci.yaml cut to three small cells, against a serial `dvc repro` of
the same profile: on a real Slurm (a private one-node cluster, tests/slurm_cluster.py) and with the local executor.

On Slurm, the first call (two cells sharing a job, the long one alone) meets a preemption and a failure: the long
cell's job is preempted mid-cell (`scontrol requeue`, Slurm's own, while its train stage is frozen so that it cannot
finish first) and resumes from its checkpoint; another cell fails (a folder stands where
its run's lock file belongs, in its clone) and is named with its log while the others go on. A second call, detached,
submits only that cell; a third finds its job still queued, waits for it instead of submitting the cell again, and
gathers. Under CI=true a Slurm test that cannot start its cluster fails, never skips."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

from slurm_cluster import end_processes_naming, start_cluster, why_not_here
from test_pipeline_e2e import ROOT, ignore, sh, stages_run

LONG = "mnist-360-er-200"          # preempted mid-cell: long enough (batch 1, 8 epochs, ~6 s) to be caught training
                                   # when the test freezes it, on a slow and loaded machine too
FAILING = "mnist-360-sgd-none"     # fails in the first call
CELLS = {LONG, FAILING, "mnist-360-joint-none"}
TIMINGS = ["train_seconds", "samples_per_second"]
DEADLINE_S = 900


def cut_profile() -> dict:
    params = yaml.safe_load((ROOT / "profiles" / "ci.yaml").read_text())
    params["seeds"] = [0]
    params["checkpoint_minutes"] = 0.002       # a checkpoint every ~0.1 s: the preempted cell has one to resume from
    params["runs"][LONG].update(batch=1, epochs=8)
    params["report"]["figures"] = False
    assert set(params["runs"]) == CELLS
    return params


def make_project(path: Path, remote: Path | None = None) -> Path:
    """A fresh clone's worth of the project on the cut profile, committed (with a DVC remote, if given)."""
    shutil.copytree(ROOT, path, ignore=ignore)
    (path / "params.yaml").write_text(yaml.safe_dump(cut_profile(), sort_keys=False))
    if remote is not None:
        sh(path, "dvc", "remote", "add", "-d", "store", str(remote))
    sh(path, "git", "init", "-q")
    sh(path, "git", "add", "-A")
    sh(path, "git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "the cut ci profile")
    return path


@contextmanager
def driving(project: Path, scratch: Path, *options: str, env: dict | None = None, out: Path | None = None):
    """`python -m gcl.cluster` started in `project` (its output to `out`, where given, to be read while it runs);
    whatever it leaves running there or in `scratch` (its jobs' commands, its stages' warm servers) is ended by pid
    afterwards, whether the test passed or not."""
    stdout = open(out, "w") if out is not None else subprocess.PIPE
    process = subprocess.Popen([sys.executable, "-m", "gcl.cluster", "--scratch", str(scratch), "--poll", "0.5",
                                *options], cwd=project, text=True, stdout=stdout, stderr=subprocess.PIPE,
                               env={**os.environ, **(env or {}), "PYTHONPATH": str(project / "src")})
    if out is not None:
        stdout.close()
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        end_processes_naming(project, scratch)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the driver did not end in {DEADLINE_S} s:\n{out}\n{err}") from None
    return process.returncode, out, err


def wait_for(what: str, condition, process: subprocess.Popen | None = None, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the driver ended before {what}:\n" + "\n".join(filter(None, process.communicate())))
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {deadline_s} s")


def stage_processes(clone: Path) -> list[int]:
    """The train stage's Python processes working in `clone` (a job's: the test only stops and continues them)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"stages/train.py" in (proc / "cmdline").read_bytes() \
                    and (proc / "comm").read_text().startswith("python") and (proc / "cwd").resolve() == clone.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    assert found, f"no train stage runs in {clone}"
    return found


def attempts(scratch: Path, cell: str) -> list[dict]:
    return json.loads((scratch / "cells" / f"{cell}.json").read_text())["attempts"]


def assert_same_results(project: Path, serial: Path) -> None:
    """The report and every cell's numbers equal the serial run's (its timings aside)."""
    for name in ("results/tables.md", "results/metrics.json"):
        assert (project / name).read_text() == (serial / name).read_text(), name
    mine, theirs = (pd.read_csv(p / "results/summary.csv").drop(columns=TIMINGS) for p in (project, serial))
    pd.testing.assert_frame_equal(mine, theirs)
    for metrics in serial.glob("runs/*/*/*/metrics.json"):
        a, b = (json.loads(p.read_text())["seeds"] for p in (metrics, project / metrics.relative_to(serial)))
        assert {s: (r["acc_matrix"], r["loss_curve"]) for s, r in a.items()} == \
               {s: (r["acc_matrix"], r["loss_curve"]) for s, r in b.items()}, metrics
    assert "up to date" in sh(project, "dvc", "status").stdout


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("serial") / "ws")
    sh(project, "dvc", "repro")
    return project


# ------------------------------------------------------------------------------------------------- local executor

@pytest.mark.e2e
def test_the_local_executor_trains_cells_side_by_side_and_reports_what_serial_repro_does(serial, tmp_path):
    project, scratch = make_project(tmp_path / "ws"), tmp_path / "scratch"
    with driving(project, scratch, "--executor", "local", "--max-parallel", "2") as process:
        code, out, err = finish(process)
    assert code == 0, out + err
    assert "the DVC cache" in out and "gathered: every cell restored from DVC's run cache; ran report" in out, out
    runs = {cell: attempts(scratch, cell) for cell in CELLS}
    assert all(len(a) == 1 and a[0]["outcome"] == "done" for a in runs.values()), runs
    spans = sorted((a[0]["started"], a[0]["ended"]) for a in runs.values())
    assert spans[1][0] < spans[0][1], spans        # the first two cells trained at the same time
    assert_same_results(project, serial)
    # the clones go once their cells are in the run cache; they shared one DVC cache (the workspace's)
    assert not any((scratch / "clones").iterdir()) and "removed the clones of 3 cells in DVC's run cache" in out, out


@pytest.mark.e2e
def test_ctrl_c_on_a_local_driver_leaves_no_command_of_its_cells_running(tmp_path):
    """Ctrl-C (SIGINT to the driver's whole process group, as a terminal sends it) while cells train: each cell's
    `dvc repro`, in a process session of its own, ran on as an orphan, its record saying it still ran. Now the
    driver ends them, says so, and writes each attempt down as stopped."""
    project, scratch = make_project(tmp_path / "ws"), tmp_path / "scratch"
    process = subprocess.Popen([sys.executable, "-m", "gcl.cluster", "--scratch", str(scratch), "--poll", "0.5",
                                "--executor", "local", "--max-parallel", "2"], cwd=project, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(project / "src")})
    try:
        wait_for("a cell's DVC at work in its clone", lambda: dvc_in(scratch / "clones", b"-m\0dvc\0"), process)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 130, out + err
        assert "stopped: the local jobs were stopped with their cells' commands" in err, err
        wait_for("the cells' commands to end", lambda: not dvc_in(scratch / "clones"), deadline_s=30)
        tries = {cell: attempts(scratch, cell) for cell in CELLS if (scratch / "cells" / f"{cell}.json").exists()}
        assert tries and all(a[-1]["outcome"] in ("stopped", "done") for a in tries.values()), tries
        assert any(a[-1]["outcome"] == "stopped" for a in tries.values()), tries
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        end_processes_naming(project, scratch)


def dvc_in(folder: Path, naming: bytes = b"") -> list[int]:
    """The processes whose working folder is inside `folder` (a cell's DVC and its stage, in their clone) and whose
    command line holds `naming`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and folder.resolve() in (proc / "cwd").resolve().parents \
                    and naming in (proc / "cmdline").read_bytes() and (proc / "cmdline").read_bytes():   # not a zombie
                found.append(int(proc.name))
        except OSError:
            continue
    return found


# ------------------------------------------------------------------------------------------------- Slurm

@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = why_not_here()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm tests: {reason}")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    folder.chmod(0o700)
    cluster = start_cluster(folder)
    yield cluster
    cluster.stop()


@pytest.mark.slurm
def test_slurm_the_test_clusters_database_takes_no_login_without_its_password(slurm):
    """Any local user could log in to the accounting database as root, without a password, over TCP."""
    for user in ("root", "slurm", "someone"):
        done = subprocess.run(["mariadb", "--no-defaults", "--protocol=tcp", "-h", "127.0.0.1", "-P", str(slurm.db_port),
                               "-u", user, "-e", "SELECT 1"], capture_output=True, text=True, timeout=60, env=slurm.env)
        assert done.returncode != 0 and "Access denied" in done.stderr, (user, done.stdout, done.stderr)


@pytest.mark.slurm
def test_slurm_sbatch_accepts_the_script_every_option_renders(slurm, tmp_path, monkeypatch):
    """The script submitit submits for the documented options (--mem-gb 32, a GPU, an array throttled to
    --max-parallel, a setup line, any other sbatch option), as sbatch itself checks it (--test-only: the node
    declares 64 GB and two GPUs)."""
    from gcl.cluster.cli import parser, plan_of
    from test_cluster import sbatch_script
    options = plan_of(parser().parse_args([
        "--scratch", "s", "--partition", "debug", "--time", "720", "--gpus", "1", "--cpus", "2", "--mem-gb", "32",
        "--max-parallel", "2", "--sbatch", "comment=gcl", "--setup", "true"])).job
    monkeypatch.setenv("PATH", slurm.env["PATH"])         # submitit looks for srun on the PATH
    for jobs in (1, 4):
        script = tmp_path / f"{jobs}.sh"
        script.write_text(sbatch_script(options, tmp_path / "jobs", jobs))
        done = slurm.run("sbatch", "--test-only", str(script), check=False)
        assert done.returncode == 0 and "to start at" in done.stderr, (script.read_text(), done.stderr)


# A stand-in for a cell's command: its first start waits to be stopped and says by what; a later one ends at once.
STAND_IN_TIME_LIMIT = """
import sys, time
from pathlib import Path
folder = Path(sys.argv[1])
if (folder / "stopped-by").exists():
    sys.exit(0)
try:
    time.sleep(600)
except KeyboardInterrupt:
    (folder / "stopped-by").write_text("SIGINT")
    sys.exit(130)
"""


@pytest.mark.slurm
def test_slurm_a_job_reaching_its_time_limit_stops_its_cell_with_sigint_and_resumes_it(slurm, tmp_path, monkeypatch):
    """Slurm's own warning before the time limit (--time 1: the SIGUSR2 that submitit asks for 90 s ahead, sent to
    every process of the step): the cell's command died of SIGUSR2 at once. Now the job stops it with SIGINT, is
    requeued, and the next attempt finishes the cell."""
    from gcl.cluster.executors import JobOptions, slurm_executor
    from gcl.cluster.job import CellJob, CellTask
    from gcl.cluster.records import read_attempts
    for name in ("PATH", "SLURM_CONF"):
        monkeypatch.setenv(name, slurm.env[name])
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    folder = tmp_path / "cell"
    folder.mkdir()
    (tmp_path / "stand_in.py").write_text(STAND_IN_TIME_LIMIT)
    task = CellTask("cell", str(folder), ((sys.executable, str(tmp_path / "stand_in.py"), str(folder)),),
                    str(tmp_path / "cells" / "cell.json"), str(tmp_path / "logs" / "cell.log"))
    job = slurm_executor(tmp_path / "jobs", JobOptions(time_min=1, cpus=1)).submit(CellJob([task]))
    try:
        job.result()
    finally:
        slurm.run("scancel", job.job_id, check=False)
    tries = read_attempts(Path(task.record))
    assert [(a.outcome, a.detail) for a in tries] == [("stopped", "stopped for a requeue (preempted or timed out)"),
                                                      ("done", "")], tries
    assert (folder / "stopped-by").read_text() == "SIGINT"


@pytest.fixture(scope="module")
def first_call(slurm, tmp_path_factory):
    """The first call, with the long cell preempted mid-cell and the failing cell's clone holding a folder where its
    run's lock file belongs (a job cannot fix that by itself)."""
    top = tmp_path_factory.mktemp("slurm-run")
    project, scratch = make_project(top / "ws", remote=top / "store"), top / "scratch"
    (scratch / "clones" / FAILING / ".gcl-progress" / f"{FAILING}.lock").mkdir(parents=True)
    progress = scratch / "clones" / LONG / ".gcl-progress" / LONG
    record = project / ".gcl-progress" / "cluster.json"
    # two cells share a job (the failing one among them); the long cell has a job of its own
    with driving(project, scratch, "--cpus", "1", "--cells-per-job", "2", env=slurm.env) as process:
        wait_for("checkpoint of the long cell", lambda: record.exists() and any(progress.glob("*.ckpt")), process)
        job = next(k for k, v in json.loads(record.read_text())["jobs"].items() if LONG in v["cells"])
        # the stage frozen first, so that it cannot finish the cell before Slurm acts (Slurm's SIGCONT wakes it)
        stage = stage_processes(scratch / "clones" / LONG)
        for pid in stage:
            os.kill(pid, signal.SIGSTOP)
        try:
            slurm.run("scontrol", "requeue", job)   # Slurm's own preemption: SIGTERM to every process, SIGKILL later
        finally:
            for pid in stage:
                os.kill(pid, signal.SIGCONT)
        code, out, err = finish(process)
    return project, scratch, code, out, err


@pytest.mark.slurm
def test_slurm_a_failed_cell_is_one_line_with_its_log_and_the_other_cells_go_on(first_call):
    project, scratch, code, out, err = first_call
    assert code == 1, out + err
    jobs = json.loads((project / ".gcl-progress" / "cluster.json").read_text())["jobs"]
    assert {frozenset(job["cells"]) for job in jobs.values()} == {frozenset(CELLS - {LONG}), frozenset({LONG})}, jobs
    failed = [line for line in out.splitlines() if line.startswith("failed")]
    log = scratch / "logs" / f"{FAILING}.log"
    assert len(failed) == 1 and f"train@{FAILING}" in failed[0] and f"(log: {log})" in failed[0], out
    assert f"cannot use .gcl-progress/{FAILING}.lock: Is a directory" in failed[0], failed
    assert "cells: 2 done, 0 running, 0 pending, 1 failed (of 3)" in out, out
    assert "Run the command again: it submits only the cells still missing" in out, out
    assert sorted(p.name for p in (scratch / "clones").iterdir()) == [FAILING], "the done cells' clones go"
    for cell in CELLS - {FAILING}:           # the others trained, and are restored here
        assert (project / "runs/mnist-360" / cell.split("-")[2] / cell.split("-")[3] / "metrics.json").exists(), cell


@pytest.mark.slurm
def test_slurm_a_preempted_job_is_requeued_and_resumes_its_cell_from_its_checkpoint(first_call):
    """`scontrol requeue`, as Slurm preempts: SIGTERM to every process of the job, whose train stage died of it at
    once. Now the stage is stopped by the job with SIGINT (its graceful stop), and the requeued job resumes it."""
    from gcl.cluster.job import STOPPED_BY_SIGTERM
    project, scratch, code, out, err = first_call
    tries = attempts(scratch, LONG)
    assert [a["outcome"] for a in tries] == ["stopped", "done"] and tries[0]["job"] == tries[1]["job"], tries
    assert tries[0]["detail"] == STOPPED_BY_SIGTERM, tries
    assert f"requeued  train@{LONG}" in out and f"running   train@{LONG} (job {tries[0]['job']} on" in out, out
    log = (project / "runs/mnist-360/er/200/train.log").read_text()
    assert f"resumed from .gcl-progress/{LONG}/seed-0.ckpt at step" in log, log


def status_of(project: Path, env: dict) -> str:
    done = subprocess.run([sys.executable, "-m", "gcl.cluster", "--status"], cwd=project, capture_output=True,
                          text=True, env={**os.environ, **env, "PYTHONPATH": str(project / "src")})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def second_call(slurm, first_call):
    """The failing cell's obstacle removed: a detached call submits it (its job held an hour: --sbatch begin=...) and
    exits; `--status` sees it pending; a third call finds that job still queued and waits for it instead of
    submitting the cell again (the job released once it says so), then gathers."""
    project, scratch, *_ = first_call
    shutil.rmtree(scratch / "clones" / FAILING / ".gcl-progress" / f"{FAILING}.lock")
    with driving(project, scratch, "--cpus", "1", "--detach", "--sbatch", "begin=now+3600", env=slurm.env) as process:
        detached = finish(process)
    pending = status_of(project, slurm.env)
    said = scratch.parent / "third-call.out"
    with driving(project, scratch, "--cpus", "1", env=slurm.env, out=said) as process:
        wait_for("the third call's wait for the earlier job", lambda: "from an earlier call" in said.read_text(), process)
        slurm.run("scontrol", "update", f"JobId={latest_job(project, FAILING)}", "StartTime=now")
        code, _, err = finish(process)
    return project, scratch, detached, pending, (code, said.read_text(), err), status_of(project, slurm.env)


def latest_job(project: Path, cell: str) -> str:
    jobs = json.loads((project / ".gcl-progress" / "cluster.json").read_text())["jobs"]
    return max((k for k, v in jobs.items() if cell in v["cells"]), key=lambda k: jobs[k]["submitted"])


@pytest.mark.slurm
def test_slurm_a_detached_call_submits_only_the_failed_cell_and_status_sees_it_pending(second_call):
    project, scratch, (code, out, err), pending, *_ = second_call
    assert code == 0 and "detached: the jobs run on" in out, out + err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("submitted")] == [f"train@{FAILING}"], out
    for cell in CELLS - {FAILING}:
        assert f"in the run cache: train@{cell} (restored, not submitted)" in out, out
    assert f"submitted train@{FAILING} (job {latest_job(project, FAILING)})" in pending, pending
    assert "cells: 2 done, 0 running, 1 pending, 0 failed (of 3)" in pending, pending


@pytest.mark.slurm
def test_slurm_a_later_call_waits_for_the_earlier_job_then_gathers_what_serial_repro_gives(second_call, serial):
    project, scratch, _, _, (code, out, err), status = second_call
    assert code == 0, out + err
    job = latest_job(project, FAILING)
    assert f"still queued or running from an earlier call: train@{FAILING} (job {job})" in out, out
    assert not [line for line in out.splitlines() if line.startswith("submitted")], out
    assert f"done      train@{FAILING} (job {job}" in out, out
    for cell in CELLS:
        assert len(attempts(scratch, cell)) == {LONG: 2, FAILING: 2}.get(cell, 1)   # each trained by exactly one job
    assert [a["outcome"] for a in attempts(scratch, FAILING)] == ["failed", "done"]
    assert "gathered: every cell restored from DVC's run cache; ran report" in out, out
    assert_same_results(project, serial)
    assert "cells: 3 done, 0 running, 0 pending, 0 failed (of 3)" in status, status
    assert not any((scratch / "clones").iterdir()), "the clones go once their cells are in the run cache"


@pytest.mark.slurm
def test_slurm_the_gather_restored_every_cell_without_training_it(second_call):
    project, *_ = second_call
    out = sh(project, "dvc", "repro", "--dry").stdout
    assert not stages_run(out), out
