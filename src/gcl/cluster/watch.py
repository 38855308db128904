"""Where each submitted cell stands, from its job's phase (gcl.cluster.executors) and its record (written by the
job, gcl.cluster.records), and the lines the driver prints: one per change (submitted, running, requeued, done,
failed), a summary (cells done / running / pending / failed, GPU-hours so far) and, for a failed cell, one line with
its log's path and its last lines. `--status` prints the same view, from the records alone."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from gcl.cluster.executors import Jobs
from gcl.cluster.records import Attempt, Scratch, Submission, read_attempts

STATUSES = ("done", "running", "pending", "failed")     # the summary's; "requeued" counts as pending
FINAL = ("done", "failed")                               # a cell's statuses (and its attempts' outcomes) that end it
LAST_LINES = 3
REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED"}


@dataclass(frozen=True)
class CellView:
    cell: str
    job: str
    status: str          # pending (submitted, not started), running, requeued (waits to run again), done, failed
    attempts: int        # how many times its job started it
    host: str
    detail: str          # why it failed, how long it took
    hours: float         # its share of its job's hours so far (a job's cells share it evenly)
    gpus: int            # its job's GPUs
    log: str             # where to look: the cell's log once it started, else its job's

    def line(self) -> str:
        """The line for this cell's status (the driver prints it when the status changes)."""
        where = f"job {self.job}" + (f" on {self.host}" if self.host else "")
        if self.status == "pending":
            return f"submitted train@{self.cell} ({where})"
        if self.status == "running":
            again = f", attempt {self.attempts}" if self.attempts > 1 else ""
            return f"running   train@{self.cell} ({where}{again})"
        if self.status == "requeued":
            return f"requeued  train@{self.cell} ({where}): it resumes from its checkpoints when it runs again"
        if self.status == "done":
            return f"done      train@{self.cell} ({where}, {self.detail})"
        return f"failed    train@{self.cell} ({where}): {self.detail} | {last_lines(self.log)} (log: {self.log})"


def cell_views(submission: Submission, jobs: Jobs, scratch: Scratch, cells: set[str] | None = None,
               now: float | None = None) -> list[CellView]:
    """The submission's cells (or those of `cells`), each where its latest job left it."""
    now = now or time.time()
    views = []
    for cell, job_id in sorted(submission.job_of().items()):
        if cells is not None and cell not in cells:
            continue
        job = submission.jobs[job_id]
        attempts = [a for a in read_attempts(scratch.record(cell)) if a.job == job_id]
        phase = jobs.phase(job.executor, job_id)
        status, detail = _status(attempts, phase.name, phase.state)
        if status == "done":
            detail = _duration(sum(a.hours(now) for a in attempts))
        log = str(scratch.log(cell) if attempts else phase.log)
        views.append(CellView(cell, job_id, status, len(attempts), attempts[-1].host if attempts else "", detail,
                              sum(a.hours(now) for a in attempts) / len(job.cells), job.gpus, log))
    return views


def _status(attempts: list[Attempt], phase: str, state: str) -> tuple[str, str]:
    last = attempts[-1] if attempts else None
    if last is not None and last.outcome in ("done", "failed"):
        return last.outcome, last.detail
    if phase == "over":        # the job ended without the cell's own end: cancelled, out of time or memory, lost
        why = f"its job ended {state}" + (f" after the cell {last.detail}" if last is not None and last.detail else "")
        return "failed", why + ("" if last is not None else " before the cell started")
    if last is None:
        return "pending", ""
    # sacct may say PENDING for a while after a job started: only a stop the job wrote down, or Slurm's own word
    if last.outcome == "stopped" or state in REQUEUED:
        return "requeued", last.detail
    return "running", ""


def summary_line(views: list[CellView]) -> str:
    counts = Counter("pending" if v.status == "requeued" else v.status for v in views)
    cells = f"cells: {', '.join(f'{counts[s]} {s}' for s in STATUSES)} (of {len(views)})"
    if any(v.gpus for v in views):
        return f"{cells}; {sum(v.hours * v.gpus for v in views):.2f} GPU-hours so far"
    return f"{cells}; {sum(v.hours for v in views):.2f} job-hours so far (no GPUs asked)"


def last_lines(log: str, n: int = LAST_LINES) -> str:
    """The last `n` lines of `log` that say something, as one line."""
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip() and not line.startswith("===")]
    except OSError:
        return "no log yet"
    return " / ".join(lines[-n:]) or "the log is empty"


def _duration(hours: float) -> str:
    seconds = round(hours * 3600)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
