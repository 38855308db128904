"""The user's workspace, through DVC: how the jobs hand results back to it (a DVC remote, or a DVC cache they share
with it), the shared stages, the cells a `dvc repro` would train (a cell DVC's run cache holds is restored, never
submitted), and the gathering `dvc repro`: the only command that writes this workspace's dvc.lock."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gcl.cluster import ClusterError

SHARED_STAGES = ("check", "prepare", "benchmark")     # what every cell reads, brought up to date once, here


@dataclass(frozen=True)
class Sharing:
    """How results travel: "remote" (jobs pull their inputs from the workspace's default DVC remote and push their
    outputs and run-cache entries to it) or "cache" (jobs use the workspace's own DVC cache folder)."""
    how: str
    clone_settings: dict[str, dict[str, str]]       # what each clone's .dvc/config.local sets

    @property
    def pull(self) -> bool:
        return self.how == "remote"


@dataclass(frozen=True)
class Cell:
    """A train stage to run: the run's key, the paths it depends on (what a job must fetch first), and its settings
    as DVC's run cache keys them (its command, dependencies' hashes and parameters: a job trained for another key
    trains what the workspace no longer asks for)."""
    name: str
    deps: tuple[str, ...]
    key: str = ""

    @property
    def stage(self) -> str:
        return f"train@{self.name}"


def sharing(root: Path, asked: str) -> Sharing:
    """`asked`: "remote", "cache", or "auto" (the default remote where there is one, else the cache)."""
    from dvc.repo import Repo
    with Repo(str(root)) as repo:
        remote = repo.config["core"].get("remote")
        if asked == "remote" and not remote:
            raise ClusterError("--share remote: this workspace has no default DVC remote. Fix: `dvc remote add -d "
                               "<name> <folder or URL the jobs reach>` (docs/running.md), or --share cache")
        if asked == "cache" or (asked == "auto" and not remote):
            return Sharing("cache", {"cache": {"dir": repo.cache.local_cache_dir}})
        # the URL as this workspace resolves it: a relative folder would point elsewhere from a clone
        return Sharing("remote", {f'remote "{remote}"': {"url": repo.config["remote"][remote]["url"]}})


def dvc(root: Path, *args: str) -> str:
    """Run a DVC command in the workspace; its output, or an error that quotes its end."""
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        how = f"was killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0 else \
            f"exited with {done.returncode}"
        raise ClusterError(f"`dvc {' '.join(args)}` {how} in {root}:\n{tail}")
    return done.stdout


def stages_run(output: str) -> list[str]:
    """The stages a `dvc repro` output says it ran."""
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")]


def run_shared_stages(root: Path, share: Sharing) -> list[str]:
    """Bring the stages every cell reads up to date (here, once); returns those that ran."""
    return stages_run(dvc(root, "repro", *(["--pull"] if share.pull else []), *SHARED_STAGES))


def push_inputs(root: Path, cells: list[Cell]) -> None:
    """Put what the cells' jobs read on the remote."""
    dvc(root, "push", "--quiet", *sorted({dep for cell in cells for dep in cell.deps}))


@contextmanager
def _quiet_dvc():
    """DVC's own lines about each restore: this command says it in its own."""
    logger = logging.getLogger("dvc")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def restore_or_list(root: Path, share: Sharing) -> tuple[list[str], list[Cell]]:
    """Every train stage a `dvc repro` would run now: restored from DVC's run cache where it holds the cell (pulled
    from the remote when sharing one), else listed. Returns (the cells restored, the cells to train)."""
    from dvc.repo import Repo, lock_repo
    from dvc.stage.cache import RunCacheNotFoundError
    restored, todo = [], []
    with _quiet_dvc(), Repo(str(root)) as repo, lock_repo(repo):
        if share.pull:
            repo.stage_cache.pull(None)        # the remote's run-cache entries (small), not their outputs
        for stage in repo.index.stages:
            if not stage.addressing.startswith("train@") or not stage.changed():
                continue
            try:
                repo.stage_cache.restore(stage, pull=share.pull)
                restored.append(stage.addressing.removeprefix("train@"))
            except RunCacheNotFoundError:
                todo.append(Cell(stage.addressing.removeprefix("train@"), tuple(d.def_path for d in stage.deps),
                                 run_cache_key(stage)))
    return restored, todo


def run_cache_key(stage) -> str:
    """The key DVC's run cache files the stage under (its dependencies' hashes were saved by the failed restore);
    "" where DVC cannot key it."""
    # DVC's own, so that the key is the one its run cache uses
    from dvc.stage.cache import _can_hash, _get_stage_hash
    return _get_stage_hash(stage) if _can_hash(stage) else ""


def gather(root: Path, share: Sharing) -> list[str]:
    """The final `dvc repro`: every cell restored from the run cache (dvc.lock records it), then the report.
    Returns the stages it ran; refuses to go on if a train stage would train here."""
    restored, todo = restore_or_list(root, share)
    if todo:
        raise ClusterError(f"not in DVC's run cache after their jobs: {', '.join(c.stage for c in todo)}; "
                           "run the command again to train them")
    ran = stages_run(dvc(root, "repro", *(["--pull"] if share.pull else [])))
    trained = [stage for stage in ran if stage.startswith("train@")]
    if trained:     # cannot happen after the check above, unless the workspace changed meanwhile
        raise ClusterError(f"the gathering `dvc repro` trained {', '.join(trained)} here instead of restoring it")
    return ran
