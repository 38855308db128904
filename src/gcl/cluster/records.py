"""What jobs and the driver write down, so that any process can tell where a cell stands (the driver may be gone:
jobs outlive it): each cell's attempts, written by the job that runs it, and the submission, written by the driver.
Every write is write-then-rename (gcl.core.atomic).

The scratch folder is its user's alone (Scratch.prepare): compute nodes unpickle the job files in it and the driver
runs git in its clones, so anyone who could write there could run code as the user or have git wipe a folder of
theirs through a link. It is created 0700; one that another user owns, that others can write, or that sits in a
folder others can write without the sticky bit (or that another user owns) is refused in one line, and so is a
symbolic link where a clone, a record, a log or a job folder belongs: it is never followed.

    <scratch>/clones/<cell>/     the cell's clone (gcl.cluster.clones): named after the cell, not the job
    <scratch>/cells/<cell>.json  its attempts: job, host, start, last sign of life, end, outcome
    <scratch>/logs/<cell>.log    the output of its DVC commands, every attempt appended
    <scratch>/jobs/              submitit's folder: each job's pickles and its own log
    <scratch>/dvc-cache/         the DVC cache every clone shares (unless they share the workspace's own)
    <scratch>/workspace          the workspace this scratch folder serves (one each)
    .gcl-progress/cluster.json   in the workspace: the jobs submitted from it (read by `--status`)
"""
from __future__ import annotations

import json
import os
import pwd
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gcl.cluster import ClusterError
from gcl.core.atomic import write_json, write_text
from gcl.core.progress_files import PROGRESS_DIR

HEARTBEAT_S = 60.0            # how often a running cell's record says it is alive
LOST_AFTER_S = 3 * HEARTBEAT_S      # silence after which an attempt that never ended counts as lost
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
    group: int | None = None             # the process group of its current command (on its host)

    def hours(self, now: float) -> float:
        """Its hours so far: to its end, or to now while it beats; a lost attempt (its job killed, or its node) to
        its last heartbeat, LOST_AFTER_S late at most, however long ago that was."""
        end = self.ended or (min(now, self.seen + LOST_AFTER_S) if self.outcome is None else self.seen)
        return (end - self.started) / 3600


@dataclass(frozen=True)
class Scratch:
    """The scratch folder's layout (the module's docstring). Every path it gives is checked: no link on the way
    from the root to it (ScratchError otherwise)."""
    root: Path

    def clone(self, cell: str) -> Path:
        return self._inside("clones", cell)

    def record(self, cell: str) -> Path:
        return self._inside("cells", f"{cell}.json")

    def log(self, cell: str) -> Path:
        return self._inside("logs", f"{cell}.log")

    @property
    def jobs(self) -> Path:
        return self._inside("jobs")

    @property
    def cache(self) -> Path:
        return self._inside("dvc-cache")

    def clones(self) -> list[str]:
        """The cells that have a clone."""
        return sorted(p.name for p in self._inside("clones").iterdir())

    def _inside(self, *parts: str) -> Path:
        path = self.root
        for part in parts:
            path = path / part
            refuse_link(path)
        return path

    def prepare(self) -> None:
        """Create the folder (0700) and its subfolders, or check the one there is: see the module's docstring."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for folder in reversed(self.root.parents):
            check_above(folder, self.root)
        try:
            self.root.mkdir(mode=0o700)
            self.root.chmod(0o700)          # whatever the umask
        except FileExistsError:
            pass
        check_own(self.root)
        for sub in ("clones", "cells", "logs", "jobs", "dvc-cache"):
            path = self._inside(sub)
            path.mkdir(mode=0o700, exist_ok=True)
            check_own(path)

    def claim(self, workspace: Path) -> None:
        """Make this folder (prepared, safe) the scratch of `workspace`, refusing one that serves another workspace
        (their cells' clones and records would mix)."""
        self.prepare()
        mark = self._inside("workspace")
        if mark.exists() and mark.read_text().strip() != str(workspace):
            raise ClusterError(f"{self.root} is the scratch folder of {mark.read_text().strip()}, not of {workspace}: "
                               "give each workspace its own (--scratch)")
        if not mark.exists():
            write_text(mark, f"{workspace}\n")


FIX = "Fix: use a folder of your own, e.g. --scratch /shared/$USER/coca-scratch, that no one else can write"


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise ClusterError(f"{path} is a symbolic link (to {os.readlink(path)}), where the scratch folder keeps its "
                           f"own files: it is not followed. Fix: remove the link (rm {path}), or use another --scratch")


def check_own(folder: Path) -> None:
    """`folder` (in the scratch folder, or the folder itself): a real folder of this user's that no one else may
    write."""
    refuse_link(folder)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise ClusterError(f"{folder} is not a folder: the scratch folder's layout needs one there. {FIX}")
    if info.st_uid != os.geteuid():
        raise ClusterError(f"{folder} belongs to {_owner(info.st_uid)}, not to you ({_owner(os.geteuid())}): a "
                           f"scratch folder must be your own. {FIX}")
    if info.st_mode & 0o022:
        raise ClusterError(f"{folder} can be written by others (mode {stat.S_IMODE(info.st_mode):o}): they could plant "
                           f"links or job files there. Fix: chmod 700 {folder}")


def check_above(folder: Path, scratch: Path) -> None:
    """A folder above the scratch folder: owned by this user or by root, and written by no one else unless it has
    the sticky bit (as /tmp has: others may not rename what is yours in it)."""
    info = folder.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise ClusterError(f"--scratch {scratch}: {folder} belongs to {_owner(info.st_uid)}, who could replace the "
                           f"scratch folder. {FIX}")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise ClusterError(f"--scratch {scratch}: {folder} can be written by others without the sticky bit (mode "
                           f"{stat.S_IMODE(info.st_mode):o}), who could replace the scratch folder. {FIX}")


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
    keys: dict[str, str] = field(default_factory=dict)      # cell -> its run-cache key then (gcl.cluster.workspace.Cell)


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
