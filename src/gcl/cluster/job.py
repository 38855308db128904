"""What runs inside a job: its cells side by side, each in its own clone, each a short list of DVC commands run one
after the other (fetch the cell's inputs, `dvc repro -s train@<cell>`, hand its outputs and run-cache entry back).
Every attempt is written down in the cell's record and its output appended to the cell's log (gcl.cluster.records).

Stopping, and nothing lost: when Slurm warns of a preemption or of the time limit (SIGUSR2, which submitit handles;
the local executor sends it at its own time-out), submitit calls `checkpoint`, which stops the cells' processes
(SIGINT, the train stage's graceful stop, then SIGKILL: a train stage's progress files are written whole or not at
all) and has the job requeued with the same cells; the next attempt finds each cell's progress files in its clone
and resumes from them. Slurm signals every process of a job step, not the job's alone: its SIGUSR2 warning, and
the SIGTERM of a preemption, a requeue (`scontrol requeue`), a cancel or the end of the time limit. The cells'
commands ignore both (they are started so), and the job, on SIGTERM, stops them as above: the train stage sees
SIGINT, never SIGTERM (which would end it at once). A command killed by a signal from outside (SIGKILL, at the end
of Slurm's grace) is not a failure of the cell, so the job waits for its requeue (or its end) instead of reporting
one. Every command runs in a process group of its own, written down in the cell's record: whatever it leaves behind
is ended with it (the SIGTERM a train stage asks the kernel for when its parent dies is ignored too, so the group is
what ends it: here, and at a job's end by Slurm), and the driver can end it when it is stopped itself (Ctrl-C).

A killed DVC leaves its locks behind in the clone: its entries in .dvc/tmp/rwlock (which block the next attempt where
their process id has been given to another process, on this node or on the one the job is requeued to), the file
itself half-written where the kill came while DVC rewrote it, or a hardlink lock. An attempt owns its cell's clone
(the driver never submits a cell whose earlier job may still run), so it removes them before its first command.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import submitit

from gcl.cluster.records import HEARTBEAT_S, Attempt, read_attempts, write_attempts

STOP_GRACE_S = 20.0           # SIGINT to SIGKILL when the job stops its cells
OUTSIDE_STOP_WAIT_S = 300.0   # how long a job whose commands were killed from outside waits to be requeued or ended
OUTSIDE_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGUSR2, signal.SIGHUP}
STOPPED_BY_SIGTERM = "stopped by SIGTERM (preempted, requeued, cancelled or out of time): the train stage was sent SIGINT"
IGNORED_BY_COMMANDS = (signal.SIGTERM, signal.SIGUSR2)      # Slurm's, sent to every process of the job's step
DVC_LOCKS = (".dvc/tmp/rwlock", ".dvc/tmp/rwlock.lock", ".dvc/tmp/lock")   # DVC's, relative to the clone


class CellsFailed(RuntimeError):
    """A job's cells that failed, each with its reason (the driver reads the same from their records)."""


@dataclass(frozen=True)
class CellTask:
    """One cell as a job runs it: its clone, the commands to run there in order, its record and its log; what its
    commands' environment changes (a value None removes the variable), and the GPUs its job asked for (a cell that
    would see none stops before its first command, rather than train on the CPU)."""
    cell: str
    clone: str
    commands: tuple[tuple[str, ...], ...]
    record: str
    log: str
    environment: dict[str, str | None] = field(default_factory=dict)
    gpus: int = 0


class CellJob(submitit.helpers.Checkpointable):
    """A job's cells (submitted once, requeued as is: submitit pickles it)."""

    def __init__(self, tasks: list[CellTask]):
        self.tasks = list(tasks)

    def __getstate__(self) -> dict:
        return {"tasks": self.tasks}      # the running processes stay with this attempt

    def __call__(self) -> list[str]:
        environment = submitit.JobEnvironment()
        self._cells = [RunningCell(task, environment.job_id, socket.gethostname()) for task in self.tasks]
        self._terminated = False
        signal.signal(signal.SIGTERM, self._sigterm)       # over submitit's, which only logs it
        try:
            for cell in self._cells:
                cell.start()
            beat = time.monotonic()
            while any(cell.process is not None for cell in self._cells):
                time.sleep(0.5)
                if self._terminated:
                    self._stop_cells(STOPPED_BY_SIGTERM)
                for cell in self._cells:
                    cell.poll()
                if time.monotonic() - beat > HEARTBEAT_S:
                    beat = time.monotonic()
                    for cell in self._cells:
                        cell.beat()
        except KeyboardInterrupt:         # the local executor's job, stopped with its driver (Ctrl-C)
            self._stop_cells("stopped with the driver (Ctrl-C)")
            raise
        if any(cell.outcome == "stopped" for cell in self._cells):
            time.sleep(OUTSIDE_STOP_WAIT_S)       # Slurm requeues or ends this job meanwhile
        failed = [f"train@{c.task.cell}: {c.detail}" for c in self._cells if c.outcome != "done"]
        if failed:
            raise CellsFailed("; ".join(failed))
        return [cell.task.cell for cell in self._cells]

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on SIGUSR2 (preemption, time-out): stop the cells, and be requeued as submitted."""
        self._stop_cells("stopped for a requeue (preempted or timed out)")
        return super().checkpoint(*args, **kwargs)

    def _sigterm(self, signum, frame) -> None:
        self._terminated = True           # the loop stops the cells (a handler should not wait on processes)

    def _stop_cells(self, why: str) -> None:
        self._terminated = False
        for cell in getattr(self, "_cells", []):
            cell.stop(why)


class RunningCell:
    """One cell's attempt: its commands one after the other, in a process group of their own."""

    def __init__(self, task: CellTask, job: str, host: str):
        self.task, self.job, self.host = task, job, host
        self.process: subprocess.Popen | None = None
        self.step, self.outcome, self.detail = 0, None, ""

    def start(self) -> None:
        attempts = read_attempts(Path(self.task.record))
        attempts.append(Attempt(job=self.job, host=self.host, started=time.time(), seen=time.time()))
        write_attempts(Path(self.task.record), self.task.cell, attempts)
        Path(self.task.log).parent.mkdir(parents=True, exist_ok=True)
        removed = remove_dvc_locks(Path(self.task.clone))
        with open(self.task.log, "a") as log:
            log.write(f"=== train@{self.task.cell}: attempt {len(attempts)}, job {self.job} on {self.host}, "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}, in {self.task.clone}\n")
            if removed:
                log.write(f"=== removed the DVC lock files an earlier DVC left in the clone: {', '.join(removed)}\n")
        if self.task.gpus and (missing := missing_gpus(self.task.gpus, cell_environment(self.task))):
            self._finish("failed", missing)
            return
        self._launch()

    def _launch(self) -> None:
        command = self.task.commands[self.step]
        with open(self.task.log, "a") as log:
            log.write(f"$ {shlex.join(command)}\n")
            log.flush()
            # a session of its own: stop() reaches the command and every process it starts
            self.process = subprocess.Popen(command, cwd=self.task.clone, env=cell_environment(self.task),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_command_signals)
        self._update(group=self.process.pid)

    def poll(self) -> None:
        if self.process is None or not _exited(self.process):
            return
        _signal_group(self.process, signal.SIGKILL)     # what it left in its group (its pid, unreaped, is still its)
        code, self.process = self.process.wait(), None
        if code == 0:
            self.step += 1
            if self.step < len(self.task.commands):
                self._launch()
            else:
                self._finish("done")
        elif -code in OUTSIDE_SIGNALS:
            self._finish("stopped", f"`{self._command()}` was stopped by {signal.Signals(-code).name} from outside")
        else:
            self._finish("failed", f"`{self._command()}` exited with {code}")

    def _command(self) -> str:
        return shlex.join("python" if arg == sys.executable else arg for arg in self.task.commands[self.step])

    def stop(self, why: str) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        end_groups([process.pid])
        process.wait()
        self._finish("stopped", why)

    def beat(self) -> None:
        if self.process is not None:
            self._update(seen=time.time())

    def _finish(self, outcome: str, detail: str = "") -> None:
        self.outcome, self.detail = outcome, detail
        self._update(seen=time.time(), ended=time.time(), outcome=outcome, detail=detail)
        with open(self.task.log, "a") as log:
            log.write(f"=== train@{self.task.cell}: {outcome}{': ' + detail if detail else ''}\n")

    def _update(self, **changes) -> None:
        path = Path(self.task.record)
        attempts = read_attempts(path)
        for key, value in changes.items():
            setattr(attempts[-1], key, value)
        write_attempts(path, self.task.cell, attempts)


def remove_dvc_locks(clone: Path) -> list[str]:
    """Remove the DVC locks in `clone` (see the module's docstring); returns those there were."""
    removed = []
    for relative in DVC_LOCKS:
        try:
            (clone / relative).unlink()
            removed.append(relative)
        except FileNotFoundError:
            pass
    return removed


def cell_environment(task: CellTask) -> dict[str, str]:
    """The commands' environment: the clone's own code first on the import path (the train stage must run the code
    its settings were resolved for), cold stages (a warm server per job would serve one stage and outlive nothing), and
    the task's own changes (its GPUs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBMITIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(task.clone) / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["GCL_WARM"] = "0"
    for name, value in task.environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


GPU_COUNT = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


def missing_gpus(asked: int, env: dict[str, str]) -> str:
    """Why a cell whose job asked for `asked` GPUs would train on the CPU (torch, in the cell's environment, sees
    none), in one line; "" when it sees one."""
    done = subprocess.run([sys.executable, "-c", GPU_COUNT], env=env, capture_output=True, text=True, timeout=600)
    seen = done.stdout.strip()
    if done.returncode == 0 and seen.isdigit() and int(seen) > 0:
        return ""
    why = f"torch sees {seen} CUDA devices" if done.returncode == 0 else f"torch could not be asked ({done.returncode})"
    return (f"its job asked for {asked} GPU(s) (--gpus), but {why} with CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}: it would train on the CPU. Fix: run it where a GPU is "
            "visible (a GPU partition, --setup 'module load cuda'), or without --gpus to train on the CPU")


def dvc_command(*args: str) -> tuple[str, ...]:
    """A DVC command run by this Python (the job's environment has the DVC this package was installed with)."""
    return (sys.executable, "-m", "dvc", *args)


def _command_signals() -> None:
    """A cell's command: SIGINT stops it even where the job was started with it ignored (a background shell);
    Slurm's SIGTERM and SIGUSR2, which reach every process of the job's step, are the job's to act on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for sig in IGNORED_BY_COMMANDS:
        signal.signal(sig, signal.SIG_IGN)


def _exited(process: subprocess.Popen) -> bool:
    """Whether `process` ended, without reaping it (its pid, and so its process group's id, stays its own)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:        # reaped already
        return True


def group_members(group: int) -> list[int]:
    """The live processes (zombies aside) of process group `group`, from /proc (Linux)."""
    members = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()     # after "(comm)": state ppid pgrp
                if int(fields[2]) == group and fields[0] != "Z":
                    members.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return members


def end_groups(groups: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGINT to every process of each group (the train stage's graceful stop), SIGKILL to those left after
    `grace_s`."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 10.0)):
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):     # ended, or its id is now another user's
                pass
        end = time.monotonic() + wait_s
        while any(group_members(g) for g in groups) and time.monotonic() < end:
            time.sleep(0.1)


def commands_left(attempt, clone: Path) -> list[int]:
    """The processes of an attempt's command still at work in `clone`, on this host: its process group's members
    whose working folder is inside the clone (a reused group id is another's), [] where it ended or ran elsewhere."""
    if attempt is None or attempt.outcome is not None or not attempt.group or attempt.host != socket.gethostname():
        return []
    left = []
    for pid in group_members(attempt.group):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd == clone or clone in cwd.parents:
            left.append(pid)
    return left


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
