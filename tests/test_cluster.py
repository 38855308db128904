"""gcl.cluster's parts without a cluster or a training: where its code sits, the driver's lock, the scratch folder,
the clones, a job's stop and requeue (submitit's local executor, with stand-in commands), and the lines it prints.
End to end, on Slurm and locally: tests/test_cluster_e2e.py."""
import json
import os
import re
import shutil
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


@pytest.mark.slow
def test_a_second_driver_on_a_workspace_is_refused_in_one_line(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    with RunLock(tmp_path / DRIVER_LOCK, "cluster"):
        done = run_cli(tmp_path, "--scratch", str(tmp_path / "scratch"))
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == (f"error: another `python -m gcl.cluster` drives this workspace (pid {os.getpid()}): wait "
                           "for it to end, or stop it (its jobs run on), then run again; `python -m gcl.cluster "
                           "--status` shows its jobs\n")


@pytest.mark.slow
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


def test_a_scratch_folder_is_made_private_and_one_others_could_write_is_refused(tmp_path):
    """Made 0700 (its subfolders too), inside a sticky shared folder as in /tmp; refused where others could write
    it, or write the folder it sits in without the sticky bit (they could replace it)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    scratch = Scratch(shared / "me" / "scratch")
    scratch.prepare()
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in [scratch.root, *scratch.root.iterdir()]} == \
        {name: "0o700" for name in ("scratch", "clones", "cells", "logs", "jobs", "dvc-cache")}
    scratch.prepare()                               # again: the same folder passes
    shared.chmod(0o777)
    with pytest.raises(ClusterError, match=rf"^--scratch {scratch.root}: {shared} can be written by others without "
                                           r"the sticky bit \(mode 777\), who could replace the scratch folder\. Fix: "):
        scratch.prepare()
    shared.chmod(0o1777)
    scratch.root.chmod(0o777)
    with pytest.raises(ClusterError, match=rf"^{scratch.root} can be written by others \(mode 777\): they could plant "
                                           rf"links or job files there\. Fix: chmod 700 {scratch.root}$"):
        scratch.prepare()


def test_a_scratch_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    scratch = Scratch(tmp_path / "scratch")
    scratch.root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(scratch.root, 54321, -1)
    else:                                           # not root: the folder is ours, so this process pretends to be
        monkeypatch.setattr(os, "geteuid", lambda: 54321)         # another user
    with pytest.raises(ClusterError, match=r"scratch\b.* belongs to .*uid \d+.*, not to you .*: a scratch folder must be "
                                           r"your own\. Fix: use a folder of your own"):
        scratch.claim(tmp_path / "ws")


def test_a_link_planted_in_the_scratch_folder_is_refused_and_its_target_untouched(tmp_path):
    """Another user's symbolic link at clones/<cell> (to a repository of the user's): the driver ran `git checkout
    -f` and `git clean -f -d` in its target. Now the clone, a record, a log or the job folder that is a link is
    refused, and the target keeps its tracked and untracked files."""
    from gcl.cluster.clones import sync_clones, workspace_state
    ws, victim = tmp_path / "ws", tmp_path / "victim"
    for repo in (ws, victim):
        repo.mkdir()
        (repo / "tracked.txt").write_text(repo.name)
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "one")
    (victim / "tracked.txt").write_text("edited, not committed")
    (victim / "untracked.txt").write_text("mine")
    scratch = Scratch(tmp_path / "scratch")
    scratch.prepare()
    (scratch.root / "clones" / "cell").symlink_to(victim)
    with pytest.raises(ClusterError, match=rf"^{scratch.root}/clones/cell is a symbolic link \(to {victim}\), where "
                                           r"the scratch folder keeps its own files: it is not followed\. Fix: remove "):
        sync_clones(workspace_state(ws), [scratch.clone("cell")], {})
    assert (victim / "tracked.txt").read_text() == "edited, not committed"
    assert (victim / "untracked.txt").read_text() == "mine"
    (scratch.root / "cells" / "cell.json").symlink_to(victim / "untracked.txt")
    (scratch.root / "logs").rename(scratch.root / "logs-moved")
    (scratch.root / "logs").symlink_to(victim)
    for where in (lambda: scratch.record("cell"), lambda: scratch.log("cell"), scratch.prepare):
        with pytest.raises(ClusterError, match="is a symbolic link"):
            where()
    shutil.rmtree(scratch.root / "jobs")
    (scratch.root / "jobs").symlink_to(victim)
    with pytest.raises(ClusterError, match=rf"^{scratch.root}/jobs is a symbolic link"):
        scratch.jobs


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
    (ws / ".dvc" / "config.local").chmod(0o600)
    progress = clone / ".gcl-progress" / "cell" / "seed-0.ckpt"     # an earlier attempt's checkpoint
    progress.parent.mkdir(parents=True)
    progress.write_text("ckpt")

    sync_clone(workspace_state(ws), clone, {"cache": {"dir": "/shared/cache"}})
    assert {p.name: p.read_text() for p in clone.glob("*.txt")} == {"kept.txt": "1", "edited.txt": "2", "new.txt": "3"}
    assert not (clone / "ignored.log").exists() and progress.read_text() == "ckpt"
    local = ConfigObj(str(clone / ".dvc" / "config.local"))      # the workspace's own, and what the jobs need
    assert local['remote "store"']["password"] == "secret" and local["cache"]["dir"] == "/shared/cache", local
    assert oct((clone / ".dvc" / "config.local").stat().st_mode & 0o777) == "0o600", "the password, readable by others"

    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "two")
    (ws / "new.txt").unlink()
    sync_clone(workspace_state(ws), clone, {})
    assert {p.name for p in clone.glob("*.txt")} == {"kept.txt", "edited.txt"} and progress.exists()


def test_a_clone_gets_staged_unstaged_renamed_and_new_files(tmp_path):
    """`git add params.yaml` hid the edit from the clone (its job trained the committed settings); a rename, a
    staged new file and a staged deletion reach it too."""
    from gcl.cluster.clones import sync_clone, workspace_state
    ws, clone = tmp_path / "ws", tmp_path / "clone"
    ws.mkdir()
    for name in ("params.yaml", "old-name.txt", "unstaged.txt", "staged-gone.txt"):
        (ws / name).write_text("committed")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "one")
    (ws / "params.yaml").write_text("staged")
    (ws / "unstaged.txt").write_text("unstaged")
    (ws / "staged-new.txt").write_text("new")
    (ws / "untracked.txt").write_text("untracked")
    git(ws, "add", "params.yaml", "staged-new.txt")
    git(ws, "mv", "old-name.txt", "new-name.txt")
    git(ws, "rm", "-q", "staged-gone.txt")
    (ws / "new-name.txt").write_text("renamed, then edited")
    sync_clone(workspace_state(ws), clone, {})
    assert {p.name: p.read_text() for p in clone.glob("*.*") if p.is_file()} == {
        "params.yaml": "staged", "unstaged.txt": "unstaged", "staged-new.txt": "new", "untracked.txt": "untracked",
        "new-name.txt": "renamed, then edited"}


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


@pytest.mark.slow
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


STAND_IN_SIGNALS = """
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
(folder / "pid").write_text(str(os.getpid()))
try:
    time.sleep(600)
except KeyboardInterrupt:
    (folder / "stopped-by").write_text("SIGINT")
    sys.exit(130)
"""


@pytest.mark.slow
def test_slurms_sigterm_and_sigusr2_to_every_process_reach_the_stage_as_sigint(tmp_path):
    """Slurm signals every process of a job's step: a cell's command (the train stage) got SIGTERM and died at
    once, or SIGUSR2, whose default ends a process. Now the command ignores both, and the job stops it with SIGINT
    (the train stage's graceful stop) when it gets SIGTERM itself; the attempt says why."""
    from gcl.cluster.job import STOPPED_BY_SIGTERM
    folder = tmp_path / "cell"
    folder.mkdir()
    (tmp_path / "signals.py").write_text(STAND_IN_SIGNALS)
    task = CellTask("cell", str(folder), ((sys.executable, str(tmp_path / "signals.py"), str(folder)),),
                    str(tmp_path / "cells" / "cell.json"), str(tmp_path / "logs" / "cell.log"))
    executor = submitit.LocalExecutor(tmp_path / "jobs")
    executor.update_parameters(timeout_min=60)
    job = executor.submit(CellJob([task]))
    try:
        wait_for(lambda: (folder / "pid").exists())
        stage, job_process = int((folder / "pid").read_text()), child_of(int(job.job_id))
        assert read_attempts(Path(task.record))[-1].group == stage      # its process group, for the driver
        for sig in (signal.SIGUSR2, signal.SIGTERM):       # what Slurm sends the whole step
            os.kill(stage, sig)
        time.sleep(1)
        assert Path(f"/proc/{stage}").exists() and not (folder / "stopped-by").exists()
        os.kill(job_process, signal.SIGTERM)
        wait_for(lambda: [a.outcome for a in read_attempts(Path(task.record))] == ["stopped"])
        assert (folder / "stopped-by").read_text() == "SIGINT"
        assert read_attempts(Path(task.record))[-1].detail == STOPPED_BY_SIGTERM
    finally:
        for pid in (int(job.job_id), child_of(int(job.job_id))):     # the job waits to be requeued: end it
            os.kill(pid, signal.SIGKILL)


def test_a_lost_attempt_is_charged_to_its_last_heartbeat_not_to_now():
    """A cell that ran 10 minutes, its job lost without a word: a week later it was charged 168 hours."""
    lost = Attempt(job="7_1", host="node", started=0.0, seen=600.0)
    week = 7 * 24 * 3600.0
    assert lost.hours(week) <= (600.0 + 3 * 60.0) / 3600
    assert Attempt(job="7_1", host="node", started=0.0, seen=600.0).hours(630.0) == pytest.approx(630.0 / 3600)


def dvc_project(folder: Path) -> Path:
    """A one-stage DVC project, its stage never run."""
    folder.mkdir()
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                    [sys.executable, "-m", "dvc", "stage", "add", "-q", "-n", "made", "-o", "made.txt",
                     "echo made > made.txt"]):
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
    return folder


@pytest.mark.slow
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


# ------------------------------------------------------------------------------------------------- Slurm's states

FAKE_SLURM_TOOL = """#!{python}
import sys
from pathlib import Path
said = dict(line.split("=", 1) for line in Path({states!r}).read_text().split())      # job id=STATE
with open({states!r} + "-calls", "a") as calls:
    calls.write({tool!r} + "\\n")
ids = [i for k, arg in enumerate(sys.argv) if arg == "-j" for i in sys.argv[k + 1].split(",")]
if said.get({tool!r}) == "down":
    sys.exit(f"{tool}: error: " + ("Slurm accounting storage is disabled" if {tool!r} == "sacct" else
                                    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"))
if {tool!r} == "sacct":       # submitit asks about every job it watches: the test's own jobs are answered
    print("JobID|State|NodeList")
    for i in ids:
        if i in said:
            print(f"{{i}}|{{said[i].replace('_by_', ' by ')}}|node")
else:                         # squeue: every job of the user's that Slurm holds, "<id> <STATE>"
    for key, state in said.items():
        if key.startswith("queue-"):
            print(key[len("queue-"):], state)
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sacct and squeue that say what the test writes down (job id -> state; squeue: "queue-<id>", else nothing;
    "sacct=down" or "squeue=down": that tool fails, as sacct does without accounting), so that submitit reads a
    state as it reads Slurm's; each call is written down, one line each, in "<states>-calls"."""
    states, bin_dir = tmp_path / "states", tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sacct", "squeue"):
        (bin_dir / tool).write_text(FAKE_SLURM_TOOL.format(python=sys.executable, states=str(states), tool=tool))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return states


SLURM_STATES = {      # squeue's and sacct's job states (Slurm 22.05 to 24.x): where each leaves the cell's clone
    "PENDING": "waiting", "REQUEUED": "waiting", "REQUEUE_HOLD": "waiting", "REQUEUE_FED": "waiting",
    "RESV_DEL_HOLD": "waiting", "SPECIAL_EXIT": "waiting", "CONFIGURING": "waiting",
    "RUNNING": "running", "COMPLETING": "running", "SIGNALING": "running", "STAGE_OUT": "running",
    "SUSPENDED": "running", "STOPPED": "running", "RESIZING": "running",
    "COMPLETED": "over", "FAILED": "over", "CANCELLED": "over", "CANCELLED_by_1000": "over", "TIMEOUT": "over",
    "NODE_FAIL": "over", "PREEMPTED": "over", "BOOT_FAIL": "over", "DEADLINE": "over", "OUT_OF_MEMORY": "over",
    "REVOKED": "over",
}


@pytest.mark.parametrize("state", sorted(SLURM_STATES))
def test_every_slurm_state_is_a_phase_and_only_an_ended_job_is_over(tmp_path, fake_slurm, state):
    """sacct's state, read through submitit: a job still configuring, suspended, stopped, signalled or held for a
    requeue is not over (submitit's done() says it is), so its clone is not given to another job."""
    from gcl.cluster.executors import Jobs
    job_id = str(40000 + sorted(SLURM_STATES).index(state))      # new to submitit's shared watcher
    fake_slurm.write_text(f"{job_id}={state}\n")
    assert Jobs(tmp_path / "jobs").phase("slurm", job_id).name == SLURM_STATES[state]


def test_a_job_sacct_calls_over_whose_processes_still_end_is_running_until_squeue_forgets_it(tmp_path, fake_slurm):
    from gcl.cluster.executors import Jobs
    jobs = Jobs(tmp_path / "jobs")
    fake_slurm.write_text("41000=CANCELLED_by_0 queue-41000=COMPLETING\n")
    assert (jobs.phase("slurm", "41000").name, jobs.phase("slurm", "41000").state) == ("running", "COMPLETING")
    fake_slurm.write_text("41000=CANCELLED_by_0\n")
    assert (jobs.phase("slurm", "41000", fresh=True).name, jobs.phase("slurm", "41000").state) == ("over", "CANCELLED")


def slurm_phases(jobs, job_ids: list[str], fresh: bool = False) -> list[tuple[str, str]]:
    return [(phase.name, phase.state) for phase in (jobs.phase("slurm", job_id, fresh) for job_id in job_ids)]


def test_without_accounting_a_job_is_where_squeue_says_and_over_once_squeue_forgets_it(tmp_path, fake_slurm):
    """No slurmdbd: sacct fails, submitit says UNKNOWN, which read as waiting, and the driver waited forever for
    jobs long over. Now squeue is asked: a job it lists is waiting, running or over as its state says; one it no
    longer lists is over (its cells' records say how they ended); a squeue that cannot be asked makes nothing over.
    sacct, which says accounting is disabled, is asked once, not at every look (each failure was two lines of
    output)."""
    from gcl.cluster.executors import NOT_LISTED, Jobs
    from gcl.cluster.watch import _status
    jobs, ids = Jobs(tmp_path / "jobs"), [f"42000_{i}" for i in range(4)]
    fake_slurm.write_text("sacct=down queue-42000_0=PENDING queue-42000_1=RUNNING queue-42000_2=COMPLETING "
                          "queue-42000_3=TIMEOUT\n")
    assert slurm_phases(jobs, ids) == [("waiting", "PENDING"), ("running", "RUNNING"), ("running", "COMPLETING"),
                                       ("over", "TIMEOUT")]
    fake_slurm.write_text("sacct=down queue-42000_0=RUNNING\n")
    assert slurm_phases(jobs, ids, fresh=True) == [("running", "RUNNING"), ("over", NOT_LISTED), ("over", NOT_LISTED),
                                                   ("over", "TIMEOUT")]      # how it ended, as squeue last said
    fake_slurm.write_text("sacct=down squeue=down\n")
    assert slurm_phases(jobs, ids[:2], fresh=True) == [("waiting", "UNKNOWN"),      # neither says: not over by mistake
                                                       ("over", NOT_LISTED)]        # over stays over
    assert (fake_slurm.parent / "states-calls").read_text().split().count("sacct") == 1
    assert _status([], "over", NOT_LISTED) == ("failed", f"its job ended {NOT_LISTED} before the cell started")


def test_a_job_sacct_does_not_list_is_where_squeue_says(tmp_path, fake_slurm):
    """With accounting, a job sacct does not list (yet, or lost by slurmdbd) read as waiting forever too."""
    from gcl.cluster.executors import NOT_LISTED, Jobs
    jobs = Jobs(tmp_path / "jobs")
    fake_slurm.write_text("queue-42100=RUNNING\n")
    assert slurm_phases(jobs, ["42100"]) == [("running", "RUNNING")]
    fake_slurm.write_text("\n")
    assert slurm_phases(jobs, ["42100"], fresh=True) == [("over", NOT_LISTED)]


def test_squeue_is_asked_once_for_every_job_a_poll_reads(tmp_path, fake_slurm):
    """Without accounting every job is read from squeue: one call answers them all (the paper grid is 225 jobs,
    and the driver polls every 10 s); a job submitted after that answer asks again (it would read as gone)."""
    from submitit.slurm.slurm import SlurmJob

    from gcl.cluster.executors import Jobs
    jobs = Jobs(tmp_path / "jobs")
    fake_slurm.write_text("sacct=down " + " ".join(f"queue-43000_{i}=PENDING" for i in range(20)) + "\n")
    assert {phase for phase, _ in slurm_phases(jobs, [f"43000_{i}" for i in range(20)])} == {"waiting"}
    calls = fake_slurm.parent / "states-calls"
    assert calls.read_text().split() == ["sacct", "squeue"]
    fake_slurm.write_text(fake_slurm.read_text().strip() + " queue-43001=PENDING\n")
    jobs.add(SlurmJob(folder=tmp_path / "jobs", job_id="43001"))
    assert slurm_phases(jobs, ["43001"]) == [("waiting", "PENDING")] and calls.read_text().split() == [
        "sacct", "squeue", "squeue"]


# ------------------------------------------------------------------------------------------------- resources

def sbatch_script(options, folder: Path, jobs: int = 1) -> str:
    """The sbatch script submitit submits for `jobs` jobs (an array when more than one) under `options`."""
    from submitit.slurm.slurm import _make_sbatch_string

    from gcl.cluster.executors import slurm_executor
    executor = slurm_executor(folder, options)
    parameters = {**executor.parameters, **({"map_count": jobs} if jobs > 1 else {})}
    return _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **parameters)


def every_option():
    from gcl.cluster.cli import parser, plan_of
    return plan_of(parser().parse_args([
        "--scratch", "s", "--partition", "gpu", "--time", "720", "--gpus", "1", "--cpus", "8", "--mem-gb", "32",
        "--max-parallel", "16", "--sbatch", "account=myproj", "--sbatch", "qos=high", "--setup", "module load cuda"])).job


def test_every_option_renders_as_sbatch_takes_it(tmp_path, fake_slurm):
    """What each option becomes in the script submitit submits: --mem-gb as whole megabytes (sbatch refuses
    --mem=32.0GB), the array throttled to --max-parallel, Slurm's warning before the time limit."""
    (fake_slurm.parent / "bin" / "srun").write_text("#!/bin/sh\n")
    (fake_slurm.parent / "bin" / "srun").chmod(0o755)
    script = sbatch_script(every_option(), tmp_path / "jobs", jobs=32)
    flags = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {"#SBATCH --partition=gpu", "#SBATCH --time=720", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=32768M", "#SBATCH --array=0-31%16", "#SBATCH --account=myproj", "#SBATCH --qos=high",
            "#SBATCH --signal=USR2@90", "#SBATCH --job-name=gcl-cells"} <= flags, script
    assert "\nmodule load cuda\n" in script
    from gcl.cluster.cli import parser, plan_of
    half = plan_of(parser().parse_args(["--scratch", "s", "--mem-gb", "0.5"])).job
    assert "#SBATCH --mem=512M" in sbatch_script(half, tmp_path / "jobs"), "a fraction of a GB is whole megabytes"


@pytest.mark.parametrize("executor, args, minutes", [
    ("local", ["--time", "1440"], 1440),        # was 7 days: 1440 read as "not given"
    ("local", ["--time", "90"], 90),
    ("local", [], 7 * 24 * 60),                 # not given: a local job has no time limit to speak of
    ("slurm", ["--time", "1440"], 1440),
    ("slurm", ["--time", "10080"], 10080),
    ("slurm", [], 1440),
])
def test_time_is_taken_as_given(tmp_path, fake_slurm, executor, args, minutes):
    from gcl.cluster.cli import parser, plan_of
    from gcl.cluster.executors import local_executor
    (fake_slurm.parent / "bin" / "srun").write_text("#!/bin/sh\n")
    (fake_slurm.parent / "bin" / "srun").chmod(0o755)
    options = plan_of(parser().parse_args(["--scratch", "s", "--executor", executor, *args])).job
    if executor == "local":
        assert local_executor(tmp_path / "jobs", options).parameters["timeout_min"] == minutes
    else:
        assert f"#SBATCH --time={minutes}\n" in sbatch_script(options, tmp_path / "jobs")


FAKE_SBATCH = """#!/bin/sh
echo "$@" >> {calls}
{body}
"""


def slurm_submitter(tmp_path: Path, fake_slurm: Path, sbatch_body: str):
    """A driver's Slurm submitter on a workspace at `tmp_path`, with a stand-in sbatch that runs `sbatch_body`."""
    from gcl.cluster.driver import Submitter
    from gcl.cluster.executors import JobOptions, Jobs
    from gcl.cluster.records import Submission
    from gcl.cluster.workspace import Sharing
    bin_dir = fake_slurm.parent / "bin"
    (bin_dir / "srun").write_text("#!/bin/sh\n")
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(calls=fake_slurm.parent / "sbatch-calls", body=sbatch_body))
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    scratch = Scratch(tmp_path / "scratch")
    scratch.prepare()
    return Submitter(JobOptions("slurm"), scratch, Sharing("cache", {}), Submission(str(scratch.root), str(scratch.jobs)),
                     Jobs(scratch.jobs), tmp_path)


@pytest.mark.parametrize("body, message", [
    ("exit 1", "sbatch failed with no message (exit code 1)"),
    ("echo 'queue full, try later'; exit 3", "sbatch failed with no message (exit code 3; it printed: queue full, try later)"),
    ("echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2; exit 1",
     "sbatch: error: Batch job submission failed: Invalid partition name specified"),
])
def test_a_refused_submission_is_one_line_even_when_sbatch_says_nothing(tmp_path, fake_slurm, body, message):
    """sbatch that failed without a word made the driver fail on an IndexError (the last line of an empty
    message); now it says so, with sbatch's exit status (and its output, if any). Nothing is written down."""
    from gcl.cluster.records import Submission
    from gcl.cluster.workspace import Cell
    submitter = slurm_submitter(tmp_path, fake_slurm, body)
    for groups in ([[Cell("a", ())]], [[Cell("a", ())], [Cell("b", ())]]):         # one job, and an array
        with pytest.raises(ClusterError, match=rf"^Slurm refused the jobs: {re.escape(message)}$"):
            submitter.submit_all(groups)
    assert Submission.load(tmp_path) is None and not submitter.jobs.mine


@pytest.mark.parametrize("cells", [1, 3])
def test_jobs_are_written_down_as_soon_as_sbatch_took_them(tmp_path, fake_slurm, monkeypatch, cells):
    """The submission record was written once submitit had put every job of the array in place: a driver stopped
    in between (Ctrl-C) left jobs running that no record named, and the next driver submitted their cells again,
    into the clones they trained in. Now the record names each job as soon as sbatch returns its id, and the
    driver's line says the jobs run on."""
    from submitit.core.utils import JobPaths

    from gcl.cluster.driver import DriverStopped
    from gcl.cluster.records import Submission
    from gcl.cluster.workspace import Cell
    submitter = slurm_submitter(tmp_path, fake_slurm, 'echo "Submitted batch job 4242"')
    move = JobPaths.move_temporary_file

    def interrupted(self, tmp_path, name, keep_as_symlink=False):     # Ctrl-C as submitit puts the pickles in place
        if name == "submitted_pickle":
            raise KeyboardInterrupt
        return move(self, tmp_path, name, keep_as_symlink)
    monkeypatch.setattr(JobPaths, "move_temporary_file", interrupted)
    groups = [[Cell(f"c{i}", (), f"key-{i}")] for i in range(cells)]
    with pytest.raises(KeyboardInterrupt) as stopped:
        submitter.submit_all(groups)
    ids = ["4242"] if cells == 1 else [f"4242_{i}" for i in range(cells)]
    recorded = Submission.load(tmp_path)
    assert recorded is not None and recorded.job_of() == {f"c{i}": ids[i] for i in range(cells)}
    assert [recorded.jobs[job_id].keys for job_id in ids] == [{f"c{i}": f"key-{i}"} for i in range(cells)]
    assert isinstance(stopped.value, DriverStopped), "the driver's line said no job was submitted"
    assert stopped.value.line.startswith(f"stopped while submitting: the {cells} jobs sbatch took run on, written down")
    assert len((fake_slurm.parent / "sbatch-calls").read_text().splitlines()) == 1       # one sbatch: one array
    monkeypatch.setattr(JobPaths, "move_temporary_file", move)          # uninterrupted: the same, and the handles
    submitter.submit_all(groups)
    assert Submission.load(tmp_path).job_of() == {f"c{i}": ids[i] for i in range(cells)} and submitter.jobs.mine == set(ids)


STAND_IN_GPUS = """
import os, sys
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"), flush=True)
"""


@pytest.mark.parametrize("user, gpus, slots, seen", [
    ("3,5", 1, 2, ["3", "5"]),              # the user's own GPUs, one to a slot
    ("GPU-a,GPU-b,GPU-c,GPU-d", 2, 2, ["GPU-a,GPU-b", "GPU-c,GPU-d"]),
    ("3,5", 0, 2, ["3,5", "3,5"]),          # --gpus 0: what the user sees, not CUDA_VISIBLE_DEVICES=""
    (None, 0, 1, ["(unset)"]),
])
@pytest.mark.slow
def test_local_jobs_share_out_the_gpus_the_user_sees(tmp_path, monkeypatch, user, gpus, slots, seen):
    """Through submitit's local executor, as the driver submits: each slot's cells see its share of the user's
    CUDA_VISIBLE_DEVICES; without --gpus they see what the user sees (a GPU machine never trains on the CPU
    unasked)."""
    from gcl.cluster.driver import Submitter
    from gcl.cluster.executors import JobOptions, Jobs
    from gcl.cluster.records import Submission
    from gcl.cluster.workspace import Cell, Sharing
    if user is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", user)
    scratch = Scratch(tmp_path / "scratch")
    submitter = Submitter(JobOptions("local", gpus=gpus, max_parallel=slots), scratch, Sharing("cache", {}),
                          Submission(str(scratch.root), str(scratch.jobs)), Jobs(scratch.jobs), tmp_path)
    (tmp_path / "show.py").write_text(STAND_IN_GPUS)
    for slot in range(slots):
        task = submitter.task(Cell(f"c{slot}", ()), slot)
        assert task.gpus == gpus
        task = CellTask(task.cell, task.clone, ((sys.executable, str(tmp_path / "show.py")),), task.record, task.log,
                        task.environment)          # no GPU check: no GPU on a test machine (the next test's)
        Path(task.clone).mkdir(parents=True)
        executor = submitit.LocalExecutor(scratch.jobs)
        executor.update_parameters(timeout_min=5)
        job = executor.submit(CellJob([task]))
        job.result()
        assert f"CUDA_VISIBLE_DEVICES={seen[slot]}\n" in Path(task.log).read_text(), (slot, Path(task.log).read_text())


def test_local_jobs_asking_for_more_gpus_than_the_user_sees_are_refused_in_one_line(tmp_path, monkeypatch):
    from gcl.cluster.executors import JobOptions, slot_gpus
    with pytest.raises(ClusterError, match=r"^--executor local --gpus 1 --max-parallel 4 needs 4 GPUs, and 2 are "
                                           r"visible \(CUDA_VISIBLE_DEVICES='0,1'\)\. Fix: lower --max-parallel or --gpus$"):
        slot_gpus(JobOptions("local", gpus=1, max_parallel=4), {"CUDA_VISIBLE_DEVICES": "0,1"})


@pytest.mark.slow
def test_a_cell_asking_for_a_gpu_that_would_train_on_the_cpu_stops_in_one_line(tmp_path):
    """--gpus 1, and torch in the cell's environment sees no GPU (here: none visible): the cell fails before its
    first command, in one line, instead of training on the CPU."""
    task = stand_in_task(tmp_path, "gpu", 0)
    task = CellTask(task.cell, task.clone, task.commands, task.record, task.log, {"CUDA_VISIBLE_DEVICES": ""}, 1)
    cell = RunningCell(task, "7_1", "node")
    cell.start()
    wait_for(lambda: cell.poll() or cell.process is None)
    assert cell.outcome == "failed" and not (Path(task.clone) / "start-1").exists()
    assert cell.detail == ("its job asked for 1 GPU(s) (--gpus), but torch sees 0 CUDA devices with "
                           "CUDA_VISIBLE_DEVICES='': it would train on the CPU. Fix: run it where a GPU is visible (a "
                           "GPU partition, --setup 'module load cuda'), or without --gpus to train on the CPU"), cell.detail


class StubJobs:
    """Jobs that run until cancelled (then over), as Slurm's would: what the driver asks, and cancels."""

    def __init__(self):
        self.cancelled = []

    def phase(self, executor, job_id, fresh=False):
        from gcl.cluster.executors import Phase
        over = job_id in self.cancelled
        return Phase("over" if over else "running", "CANCELLED" if over else "RUNNING", Path("log"))

    def cancel(self, executor, job_id):
        self.cancelled.append(job_id)


def test_a_job_whose_cells_settings_changed_since_is_cancelled_and_its_cells_submitted_again(tmp_path):
    """A cell's settings changed after its job was submitted (another run-cache key): the driver waited for the
    obsolete job, then the gather failed. Now that job is cancelled and its cells are not waited for (submitted
    again), and a line says so; a job whose cells are as submitted is still waited for."""
    from gcl.cluster.driver import earlier_jobs
    from gcl.cluster.records import Submission, SubmittedJob
    from gcl.cluster.workspace import Cell
    scratch = Scratch(tmp_path / "scratch")
    scratch.prepare()
    Submission(str(scratch.root), str(scratch.jobs), {
        "5_0": SubmittedJob("slurm", ["a"], 1, submitted=1.0, keys={"a": "key-a"}),
        "5_1": SubmittedJob("slurm", ["b"], 1, submitted=1.0, keys={"b": "key-b"})}).save(tmp_path)
    jobs, said = StubJobs(), []
    submission, attached = earlier_jobs(tmp_path, scratch, jobs, [Cell("a", (), "key-a"), Cell("b", (), "key-b2")],
                                        said.append)
    assert jobs.cancelled == ["5_1"] and attached == {"a"}
    assert said == ["cancelled train@b (job 5_1): its settings changed since it was submitted; submitted again"]


def test_clean_removes_the_clones_no_job_uses_and_keeps_the_others(tmp_path):
    """Clones were never removed: a clone per cell of the paper grid, each with its data. `--clean` removes those
    whose job is over (and says which it kept), the clones' shared DVC cache once no job runs."""
    from gcl.cluster.cleanup import clean
    from gcl.cluster.records import Submission, SubmittedJob
    scratch = Scratch(tmp_path / "scratch")
    scratch.prepare()
    for cell in ("a", "b", "c"):
        (scratch.clone(cell) / "data").mkdir(parents=True)
        (scratch.clone(cell) / "data" / "big.pt").write_bytes(b"0" * 1000)
    (scratch.cache / "files").mkdir()
    Submission(str(scratch.root), str(scratch.jobs), {
        "5_0": SubmittedJob("slurm", ["a"], 1, submitted=1.0), "5_1": SubmittedJob("slurm", ["b"], 1, submitted=1.0)}
               ).save(tmp_path)
    jobs, said = StubJobs(), []
    jobs.cancelled.append("5_0")                  # over; 5_1 still runs; c has no job
    assert clean(tmp_path, None, said.append, jobs) == 0
    assert scratch.clones() == ["b"] and (scratch.cache / "files").exists()
    assert said == [f"removed the clones of 2 cells in DVC's run cache ({scratch.root / 'clones'}): a, c",
                    "kept the clones that jobs still use: b"]
    jobs.cancelled.append("5_1")
    said.clear()
    clean(tmp_path, None, said.append, jobs)
    assert scratch.clones() == [] and not any(scratch.cache.iterdir()), said
