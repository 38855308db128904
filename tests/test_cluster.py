"""gcl.cluster's parts without a cluster or a training: where its code sits, the driver's lock, the scratch folder,
the clones, a job's stop and requeue (submitit's local executor, with stand-in commands), and the lines it prints.
End to end, on Slurm and locally: tests/test_cluster_e2e.py."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit
import yaml
from configobj import ConfigObj

from gcl.cluster import ClusterError
from gcl.cluster.job import CellJob, CellTask, RunningCell, dvc_command
from gcl.cluster.records import DRIVER_LOCK, Attempt, Scratch, read_attempts
from gcl.cluster.watch import _status, last_lines
from gcl.core.processes import RunLock

ROOT = Path(__file__).resolve().parents[1]


def test_the_cluster_code_is_outside_the_train_stages_code():
    """Editing gcl.cluster re-runs no stage: no train code digest, and no stage of dvc.yaml, covers it."""
    from gcl.core.layout import TRAIN_CODE
    cluster = "src/gcl/cluster/driver.py"
    assert not any(cluster == c or cluster.startswith(c.rstrip("/") + "/") for c in TRAIN_CODE)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = [d for stage in stages.values() for d in stage.get("do", stage).get("deps", [])]
    assert deps and not [d for d in deps if cluster.startswith(d.rstrip("/") + "/")]


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcl.cluster", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_a_second_driver_on_a_workspace_is_refused_in_one_line(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    with RunLock(tmp_path / DRIVER_LOCK, "cluster"):
        done = run_cli(tmp_path, "--scratch", str(tmp_path / "scratch"))
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == (f"error: another `python -m gcl.cluster` drives this workspace (pid {os.getpid()}): wait "
                           "for it to end, or stop it (its jobs run on), then run again; `python -m gcl.cluster "
                           "--status` shows its jobs\n")


def test_status_before_anything_was_submitted_and_outside_a_workspace(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    assert "no jobs were submitted from this workspace" in run_cli(tmp_path, "--status").stdout
    outside = run_cli(tmp_path / "..", "--status")
    assert outside.returncode == 1 and "has no dvc.yaml: run the command in the workspace" in outside.stderr


def test_a_scratch_folder_serves_one_workspace(tmp_path):
    scratch = Scratch(tmp_path / "scratch")
    scratch.claim(tmp_path / "a")
    scratch.claim(tmp_path / "a")
    with pytest.raises(ClusterError, match="is the scratch folder of .*/a, not of .*/b: give each workspace its own"):
        scratch.claim(tmp_path / "b")


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_a_clone_is_the_workspace_as_it_is_and_keeps_what_git_ignores(tmp_path):
    from gcl.cluster.clones import sync_clone, workspace_state
    ws, clone = tmp_path / "ws", tmp_path / "clone"
    (ws / ".dvc").mkdir(parents=True)
    for name, text in {".gitignore": ".gcl-progress/\n*.log\n", "kept.txt": "1", "edited.txt": "1", "gone.txt": "1",
                       ".dvc/.gitignore": "/config.local\n"}.items():
        (ws / name).write_text(text)
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "one")
    (ws / "edited.txt").write_text("2")
    (ws / "gone.txt").unlink()
    (ws / "new.txt").write_text("3")
    (ws / "ignored.log").write_text("4")
    (ws / ".dvc" / "config.local").write_text("['remote \"store\"']\n    password = secret\n")
    progress = clone / ".gcl-progress" / "cell" / "seed-0.ckpt"     # an earlier attempt's checkpoint
    progress.parent.mkdir(parents=True)
    progress.write_text("ckpt")

    sync_clone(workspace_state(ws), clone, {"cache": {"dir": "/shared/cache"}})
    assert {p.name: p.read_text() for p in clone.glob("*.txt")} == {"kept.txt": "1", "edited.txt": "2", "new.txt": "3"}
    assert not (clone / "ignored.log").exists() and progress.read_text() == "ckpt"
    local = ConfigObj(str(clone / ".dvc" / "config.local"))      # the workspace's own, and what the jobs need
    assert local['remote "store"']["password"] == "secret" and local["cache"]["dir"] == "/shared/cache", local

    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "two")
    (ws / "new.txt").unlink()
    sync_clone(workspace_state(ws), clone, {})
    assert {p.name for p in clone.glob("*.txt")} == {"kept.txt", "edited.txt"} and progress.exists()


# A stand-in for a cell's DVC command: each start leaves its pid in a file; the first start waits to be stopped,
# a later one ends at once, with the exit status the test asks for.
STAND_IN = """
import os, sys, time
from pathlib import Path
folder, code = Path(sys.argv[1]), int(sys.argv[2])
start = len(list(folder.glob("start-*"))) + 1
(folder / f"start-{start}").write_text(str(os.getpid()))
if start == 1 and code == 0:
    time.sleep(600)
print(f"stand-in, start {start}: exit {code}", flush=True)
sys.exit(code)
"""


def stand_in_task(tmp_path: Path, cell: str, code: int) -> CellTask:
    folder, script = tmp_path / cell, tmp_path / "stand_in.py"
    folder.mkdir()
    script.write_text(STAND_IN)
    return CellTask(cell, str(folder), ((sys.executable, str(script), str(folder), str(code)),),
                    str(tmp_path / "cells" / f"{cell}.json"), str(tmp_path / "logs" / f"{cell}.log"))


def wait_for(condition, deadline_s: float = 300.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, "waited too long"
        time.sleep(0.1)


def child_of(pid: int) -> int:
    """The one child process of `pid` (the local executor's controller runs the job's task as its child)."""
    children = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"\nPPid:\t{pid}\n" in (proc / "status").read_text():
                children.append(int(proc.name))
        except OSError:
            continue
    assert len(children) == 1, children
    return children[0]


def test_a_job_told_to_stop_stops_its_cells_is_requeued_and_starts_them_again(tmp_path):
    """SIGUSR2 (what Slurm sends before a preemption or the time limit; here to the local job's task): the job stops
    its cells' processes and is requeued; its next attempt starts them again. A cell that fails is written down
    with its exit status and its job raises, naming it; the other cell is done."""
    waits, fails = stand_in_task(tmp_path, "waits", 0), stand_in_task(tmp_path, "fails", 3)
    executor = submitit.LocalExecutor(tmp_path / "jobs")
    executor.update_parameters(timeout_min=60)
    job = executor.submit(CellJob([waits, fails]))
    # stopped once the failing cell's failure is written down, and the waiting cell waits
    wait_for(lambda: (Path(waits.clone) / "start-1").exists() and
             [a.outcome for a in read_attempts(Path(fails.record))] == ["failed"])
    first = int((Path(waits.clone) / "start-1").read_text())
    os.kill(child_of(int(job.job_id)), signal.SIGUSR2)
    wait_for(job.done)
    assert not Path(f"/proc/{first}").exists()          # the stopped attempt's process is gone
    assert [a.outcome for a in read_attempts(Path(waits.record))] == ["stopped", "done"]
    assert [a.outcome for a in read_attempts(Path(fails.record))] == ["failed", "failed"]
    failure = read_attempts(Path(fails.record))[-1].detail
    assert failure == f"`python {tmp_path / 'stand_in.py'} {fails.clone} 3` exited with 3", failure
    with pytest.raises(submitit.core.utils.FailedJobError, match=f"train@fails: `python {tmp_path}"):
        job.result()
    assert "stand-in, start 2: exit 3" in last_lines(fails.log)


def dvc_project(folder: Path) -> Path:
    """A one-stage DVC project, its stage never run."""
    folder.mkdir()
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                    [sys.executable, "-m", "dvc", "stage", "add", "-q", "-n", "made", "-o", "made.txt",
                     "echo made > made.txt"]):
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
    return folder


@pytest.mark.parametrize("half_written", [True, False], ids=["half-written", "its-pid-given-to-another-process"])
def test_an_attempt_removes_the_dvc_locks_a_killed_dvc_left_in_its_clone(tmp_path, half_written):
    """The rwlock a DVC killed mid-write leaves (empty), or one naming a process id that is now another process's
    (a requeue on another node): DVC itself refuses to run there; a cell's attempt runs."""
    clone = dvc_project(tmp_path / "clone")
    rwlock = clone / ".dvc" / "tmp" / "rwlock"
    # the test's own pid stands for the killed DVC's, now another process's
    left = "" if half_written else json.dumps({"write": {str(clone / "made.txt"): {"pid": os.getpid(), "cmd": "dvc"}}})
    rwlock.write_text(left)
    refused = subprocess.run(dvc_command("repro"), cwd=clone, capture_output=True, text=True)
    assert refused.returncode != 0 and ("corrupted" in refused.stderr or "is busy" in refused.stderr), refused
    rwlock.write_text(left)
    task = CellTask("made", str(clone), (dvc_command("repro"),), str(tmp_path / "made.json"), str(tmp_path / "made.log"))
    cell = RunningCell(task, "7_1", "node")
    cell.start()
    wait_for(lambda: cell.poll() or cell.process is None)
    assert cell.outcome == "done", Path(task.log).read_text()
    assert (clone / "made.txt").read_text() == "made\n"
    assert "removed the DVC lock files an earlier DVC left in the clone: .dvc/tmp/rwlock" in Path(task.log).read_text()


def attempt(outcome=None, detail="", job="7_1") -> Attempt:
    return Attempt(job=job, host="node", started=0.0, seen=60.0, ended=None if outcome is None else 120.0,
                   outcome=outcome, detail=detail)


@pytest.mark.parametrize("attempts, phase, state, status", [
    ([], "waiting", "PENDING", "pending"),
    ([], "waiting", "UNKNOWN", "pending"),
    ([attempt()], "running", "RUNNING", "running"),
    ([attempt()], "waiting", "PENDING", "running"),      # sacct not caught up with the job's start yet
    ([attempt()], "waiting", "REQUEUED", "requeued"),
    ([attempt("stopped", "stopped for a requeue")], "running", "RUNNING", "requeued"),
    ([attempt("stopped"), attempt()], "running", "RUNNING", "running"),
    ([attempt("done")], "running", "RUNNING", "done"),          # its job still runs other cells
    ([attempt("failed", "`dvc repro` exited with 1")], "over", "FAILED", "failed"),
    ([attempt()], "over", "CANCELLED", "failed"),               # cancelled, out of time or memory, node lost
    ([], "over", "FAILED", "failed"),
])
def test_where_a_cell_stands(attempts, phase, state, status):
    assert _status(attempts, phase, state)[0] == status


def test_a_failed_cell_is_one_line_with_its_reason_its_last_lines_and_its_log(tmp_path):
    from gcl.cluster.watch import CellView
    log = tmp_path / "cell.log"
    log.write_text("=== attempt 1\nRunning stage 'train@x':\n\nerror: cannot use x.lock: Is a directory\n"
                   "ERROR: failed to reproduce 'train@x'\n=== train@x: failed\n")
    view = CellView("x", "7_1", "failed", 1, "node", "`dvc repro` exited with 1", 0.5, 1, str(log))
    assert view.line() == ("failed    train@x (job 7_1 on node): `dvc repro` exited with 1 | Running stage 'train@x': / "
                           f"error: cannot use x.lock: Is a directory / ERROR: failed to reproduce 'train@x' (log: {log})")
    assert "\n" not in view.line()


def test_the_summary_counts_cells_and_gpu_hours():
    from gcl.cluster.watch import CellView, summary_line
    views = [CellView("a", "1", "done", 1, "n", "", 2.0, 1, ""), CellView("b", "1", "running", 1, "n", "", 1.0, 1, ""),
             CellView("c", "2", "requeued", 2, "n", "", 0.5, 2, ""), CellView("d", "3", "failed", 1, "n", "", 0, 2, "")]
    assert summary_line(views) == "cells: 1 done, 1 running, 1 pending, 1 failed (of 4); 4.00 GPU-hours so far"
    cpu = [CellView("a", "1", "done", 1, "n", "", 0.25, 0, "")]
    assert summary_line(cpu) == "cells: 1 done, 0 running, 0 pending, 0 failed (of 1); 0.25 job-hours so far (no GPUs asked)"


def test_a_submission_names_each_cells_latest_job(tmp_path):
    from gcl.cluster.records import Submission, SubmittedJob
    submission = Submission("/scratch", "/scratch/jobs", {"5_0": SubmittedJob("slurm", ["a", "b"], 1, submitted=1.0)})
    submission.jobs["9"] = SubmittedJob("local", ["b"], 0, submitted=2.0)
    submission.save(tmp_path)
    again = Submission.load(tmp_path)
    assert again == submission and again.job_of() == {"a": "5_0", "b": "9"}
    assert json.loads((tmp_path / ".gcl-progress" / "cluster.json").read_text())["scratch"] == "/scratch"


@pytest.mark.parametrize("args, message", [
    (["--max-parallel", "0"], "--max-parallel 0: must be at least 1"),
    (["--gpus", "-1"], "--gpus -1: must be zero or more"),
    (["--poll", "0"], "--poll 0.0: must be positive"),
    (["--sbatch", "account"], "--sbatch account: write it as OPTION=VALUE"),
])
def test_options_the_command_refuses(args, message):
    from gcl.cluster.cli import parser, plan_of
    with pytest.raises(ClusterError, match=message):
        plan_of(parser().parse_args(["--scratch", "s", *args]))


def test_options_become_what_each_job_asks_for():
    from gcl.cluster.cli import parser, plan_of
    plan = plan_of(parser().parse_args(["--scratch", "s", "--gpus", "1", "--sbatch=--account=p", "--sbatch",
                                        "qos=high", "--setup", "module load cuda", "--max-timeouts", "0"]))
    assert plan.job.sbatch == {"account": "p", "qos": "high"} and plan.job.setup == ["module load cuda"]
    assert (plan.job.executor, plan.job.gpus, plan.job.max_parallel, plan.job.max_timeouts) == ("slurm", 1, None, 0)
    local = plan_of(parser().parse_args(["--scratch", "s", "--executor", "local"]))
    assert local.job.max_parallel == 2 and local.cells_per_job == 1
