"""Where a run keeps its progress (finished seeds, checkpoints, the trainer's lock) until its metrics.json is
written, and the sweep of what a run that DVC later restored from its run cache left there. The training layer
writes these files; the report stage sweeps them without importing the training layer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from gcl.core.layout import run_dir
from gcl.core.processes import RunLock, RunLockedError

PROGRESS_DIR = Path(".gcl-progress")


def run_progress_dir(key: str) -> Path:
    """The folder of run `key`'s finished seeds and checkpoints."""
    return PROGRESS_DIR / key


def run_lock_path(key: str) -> Path:
    """The lock file that one trainer of run `key` holds."""
    return PROGRESS_DIR / f"{key}.lock"


def sweep_finished_progress(runs: dict[str, dict]) -> list[str]:
    """Delete the progress folders (and lock files) of runs whose metrics.json holds the settings `runs`
    gives them now (key -> resolved run settings), unless a process is training them: what an interrupted
    run leaves when a later `dvc repro` restores its output from DVC's run cache instead of training it.
    Returns the runs swept."""
    swept = []
    for key, run in runs.items():
        progress, metrics = run_progress_dir(key), run_dir(run) / "metrics.json"
        lock = run_lock_path(key)
        if not (progress.exists() or lock.exists()) or not metrics.exists():
            continue
        try:
            finished = json.loads(metrics.read_text())["config"]["run"] == json.loads(json.dumps(run))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not finished:
            continue          # the folder may hold the progress of the settings params.yaml asks for now
        try:
            with RunLock(lock, key):   # which removes the lock file as it lets go
                shutil.rmtree(progress, ignore_errors=True)
        except RunLockedError:
            continue
        swept.append(key)
    return swept
