"""What the driver tidies on the scratch folder: the clones no job uses any more (their cells in DVC's run cache:
after the gather, or all of them with `--clean`), and the refusal of a cell whose earlier commands still run in its
clone (their driver and job killed outright)."""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gcl.cluster import ClusterError, clones
from gcl.cluster.executors import Jobs
from gcl.cluster.job import commands_left
from gcl.cluster.records import Scratch, Submission, read_attempts
from gcl.cluster.watch import FINAL
from gcl.cluster.workspace import Cell

ENDING_WAIT_S = 120.0               # how long the jobs whose cells are over may take to end, before their clones go


def remove_idle_clones(scratch: Scratch, submission: Submission, jobs: Jobs, cells: list[str],
                       say: Callable[[str], None]) -> list[str]:
    """Remove the clones of `cells` (in DVC's run cache) that no job may still use: their latest job is over (or
    they have none) and no command of theirs runs in them. Returns the cells whose clone was removed."""
    latest = submission.job_of()
    idle, end = [], time.monotonic() + ENDING_WAIT_S
    for cell in cells:
        job = latest.get(cell)
        attempts = read_attempts(scratch.record(cell))
        last = attempts[-1] if attempts else None
        while job is not None and jobs.phase(submission.jobs[job].executor, job, fresh=True).name != "over":
            if last is None or last.job != job or last.outcome not in FINAL or time.monotonic() > end:
                break           # its job may still work in it; one whose cell is over is ending: waited for a while
            time.sleep(2.0)
        else:
            if not commands_left(last, scratch.clone(cell)):
                idle.append(cell)
    removed = [clone.name for clone in clones.remove_clones([scratch.clone(cell) for cell in idle])]
    if removed:
        say(f"removed the clones of {len(removed)} cells in DVC's run cache ({scratch.root / 'clones'}): "
            f"{', '.join(removed)}")
    return removed


def clean(root: Path, scratch_path: Path | None, say: Callable[[str], None] = print, jobs: Jobs | None = None) -> int:
    """`--clean`: remove every clone no job uses (their cells' progress files go with them: a cell not yet in the
    run cache then starts over), and the scratch folder's DVC cache when no job runs at all."""
    submission = Submission.load(root)
    if scratch_path is None and submission is None:
        raise ClusterError("--clean: name the --scratch folder (no jobs were submitted from this workspace)")
    scratch = Scratch((scratch_path or Path(submission.scratch)).resolve())
    scratch.prepare()
    submission = submission or Submission(str(scratch.root), str(scratch.jobs))
    jobs = jobs or Jobs(Path(submission.folder))
    removed = remove_idle_clones(scratch, submission, jobs, scratch.clones(), say)
    busy = sorted(set(scratch.clones()) - set(removed))
    if busy:
        say(f"kept the clones that jobs still use: {', '.join(busy)}")
    elif any(scratch.cache.iterdir()):
        shutil.rmtree(scratch.cache)
        scratch.cache.mkdir(mode=0o700)
        say(f"removed the DVC cache the clones shared ({scratch.cache})")
    if not removed and not busy:
        say(f"no clones in {scratch.root / 'clones'}")
    return 0


def refuse_live_commands(scratch: Scratch, cells: list[Cell]) -> None:
    """A cell whose earlier attempt's commands still run in its clone (their job gone: a driver killed outright)
    is refused, in one line: syncing its clone under them, or a second attempt beside them, would break both."""
    for cell in cells:
        attempts = read_attempts(scratch.record(cell.name))
        left = commands_left(attempts[-1] if attempts else None, scratch.clone(cell.name))
        if left:
            group = attempts[-1].group
            raise ClusterError(f"train@{cell.name}: an earlier attempt's commands still run in its clone (process group "
                               f"{group}: pids {', '.join(map(str, left))}). Fix: wait for them to end, or stop them "
                               f"(`kill -INT -- -{group}`), then run again")
