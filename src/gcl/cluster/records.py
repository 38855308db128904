"""What jobs and the driver write down, so that any process can tell where a cell stands (the driver may be gone:
jobs outlive it): each cell's attempts, written by the job that runs it, and the submission, written by the driver.
Every write is write-then-rename (gcl.core.atomic).

    <scratch>/clones/<cell>/     the cell's clone (gcl.cluster.clones): named after the cell, not the job
    <scratch>/cells/<cell>.json  its attempts: job, host, start, last sign of life, end, outcome
    <scratch>/logs/<cell>.log    the output of its DVC commands, every attempt appended
    <scratch>/jobs/              submitit's folder: each job's pickles and its own log
    <scratch>/workspace          the workspace this scratch folder serves (one each)
    .gcl-progress/cluster.json   in the workspace: the jobs submitted from it (read by `--status`)
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gcl.cluster import ClusterError
from gcl.core.atomic import write_json, write_text
from gcl.core.progress_files import PROGRESS_DIR

SUBMISSION = PROGRESS_DIR / "cluster.json"
DRIVER_LOCK = PROGRESS_DIR / "cluster.lock"


@dataclass
class Attempt:
    """One run of a cell inside a job (a requeued job runs it again, under the same job id)."""
    job: str
    host: str
    started: float
    seen: float                          # the last time its job said it was alive
    ended: float | None = None
    outcome: str | None = None           # None while it runs; "done", "failed" or "stopped" (preempted, timed out)
    detail: str = ""                     # why it failed or stopped

    def hours(self, now: float) -> float:
        return ((self.ended or (now if self.outcome is None else self.seen)) - self.started) / 3600


@dataclass(frozen=True)
class Scratch:
    """The scratch folder's layout (the module's docstring)."""
    root: Path

    def clone(self, cell: str) -> Path:
        return self.root / "clones" / cell

    def record(self, cell: str) -> Path:
        return self.root / "cells" / f"{cell}.json"

    def log(self, cell: str) -> Path:
        return self.root / "logs" / f"{cell}.log"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def claim(self, workspace: Path) -> None:
        """Make this folder the scratch of `workspace`, refusing one that serves another workspace (their cells'
        clones and records would mix)."""
        mark = self.root / "workspace"
        if mark.exists() and mark.read_text().strip() != str(workspace):
            raise ClusterError(f"{self.root} is the scratch folder of {mark.read_text().strip()}, not of {workspace}: "
                               "give each workspace its own (--scratch)")
        if not mark.exists():
            write_text(mark, f"{workspace}\n")


def read_attempts(path: Path) -> list[Attempt]:
    if not path.exists():
        return []
    return [Attempt(**a) for a in json.loads(path.read_text())["attempts"]]


def write_attempts(path: Path, cell: str, attempts: list[Attempt]) -> None:
    write_json(path, {"cell": cell, "attempts": [asdict(a) for a in attempts]})


@dataclass
class SubmittedJob:
    executor: str                       # "slurm" or "local"
    cells: list[str]
    gpus: int                           # the GPUs it asked for, shared by its cells
    submitted: float = field(default_factory=time.time)


@dataclass
class Submission:
    """The jobs submitted from a workspace, by job id (the latest job of each cell is the one that counts)."""
    scratch: str
    folder: str                          # submitit's folder
    jobs: dict[str, SubmittedJob] = field(default_factory=dict)

    def job_of(self) -> dict[str, str]:
        """cell -> the id of its latest job."""
        latest = {}
        for job_id, job in sorted(self.jobs.items(), key=lambda item: item[1].submitted):
            for cell in job.cells:
                latest[cell] = job_id
        return latest

    def save(self, workspace: Path) -> None:
        write_json(workspace / SUBMISSION, {"scratch": self.scratch, "folder": self.folder,
                                            "jobs": {k: asdict(v) for k, v in self.jobs.items()}})

    @classmethod
    def load(cls, workspace: Path) -> Submission | None:
        path = workspace / SUBMISSION
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(data["scratch"], data["folder"], {k: SubmittedJob(**v) for k, v in data["jobs"].items()})
