"""One clone of the workspace per cell, on the scratch folder (`<scratch>/clones/<cell>`: named after the cell, not
after a job, so that a requeued or resubmitted job finds the cell's progress files in it). Before it submits, the
driver brings each clone to the workspace as it is now: the workspace's last commit (a shallow fetch), then every
file that differs from it (params.yaml, dvc.lock, edits not committed yet), then the DVC settings a job needs. What
git ignores stays: the progress files under .gcl-progress/, DVC's outputs and cache.

The clones share one DVC cache (`clone_settings`): the workspace's own with --share cache, else one on the scratch
folder, and DVC links its files into each clone where the filesystem allows it, rather than copying them. A cell's
clone is removed once its results are in DVC's run cache (`remove_clones`): the driver does so after the gather, and
`--clean` for every cell no job uses."""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from configobj import ConfigObj

from gcl.cluster import ClusterError
from gcl.core.atomic import atomic_path

LOCAL_CONFIG = Path(".dvc") / "config.local"     # DVC's settings for one clone alone (git ignores it)
LINKS = "reflink,hardlink,copy"       # how DVC puts a cached file in a clone: a link where the filesystem allows one


@dataclass(frozen=True)
class WorkspaceState:
    """What a clone copies: the workspace's last commit, and the paths whose files differ from it."""
    root: Path
    head: str
    changed: tuple[str, ...]        # modified, deleted or new (not ignored), relative to the root


def workspace_state(root: Path) -> WorkspaceState:
    """The workspace against its last commit: every path that differs, staged or not (a rename as the old path,
    gone, and the new one), and the new files git does not ignore."""
    head = git(root, "rev-parse", "--verify", "HEAD", fix="commit the workspace once (`git commit`)").strip()
    differ = git(root, "diff", "HEAD", "--name-only", "--no-renames", "-z", "--")
    new = git(root, "ls-files", "-z", "--others", "--exclude-standard")
    return WorkspaceState(root, head, tuple(sorted({p for p in (differ + new).split("\0") if p})))


def sync_clones(state: WorkspaceState, clones: list[Path], dvc_settings: dict[str, dict[str, str]],
                threads: int = 4) -> None:
    """Bring every clone to `state` (several at once: most of the time is git's, waiting on the disk);
    `dvc_settings`: section -> {option: value} for each clone's .dvc/config.local, over the workspace's own."""
    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(sync_clone, state, clone, dvc_settings) for clone in clones]:
            done.result()


def sync_clone(state: WorkspaceState, clone: Path, dvc_settings: dict[str, dict[str, str]]) -> None:
    clone.mkdir(parents=True, exist_ok=True)
    if not (clone / ".git").exists():
        git(clone, "init", "-q")         # in place: the folder may already hold a cell's progress files
    current = git(clone, "rev-parse", "--verify", "-q", "HEAD", check=False).strip()
    if current != state.head:
        git(clone, "fetch", "-q", "--depth=1", f"file://{state.root}", "HEAD")
        fetched = git(clone, "rev-parse", "FETCH_HEAD").strip()
        if fetched != state.head:
            raise ClusterError(f"the workspace's HEAD moved while the clones were made ({state.head[:10]} -> "
                               f"{fetched[:10]}): run again")
    git(clone, "checkout", "-q", "-f", "--detach", state.head)     # tracked files as committed
    git(clone, "clean", "-q", "-f", "-d")                          # untracked files of an earlier sync; not ignored ones
    for relative in state.changed:
        source, target = state.root / relative, clone / relative
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif not source.exists() and (target.is_file() or target.is_symlink()):
            target.unlink()
    write_local_config(state.root / LOCAL_CONFIG, clone / LOCAL_CONFIG, dvc_settings)


def clone_settings(share_settings: dict[str, dict[str, str]], scratch_cache: Path) -> dict[str, dict[str, str]]:
    """Each clone's DVC settings: how results travel (gcl.cluster.workspace.Sharing), one cache for every clone (the
    workspace's where the results travel through it, else `scratch_cache`), and links into it."""
    settings = {section: dict(options) for section, options in share_settings.items()}
    cache = settings.setdefault("cache", {})
    cache.setdefault("dir", str(scratch_cache))
    cache["type"] = LINKS
    return settings


def remove_clones(clones: list[Path]) -> list[Path]:
    """Remove these clones (their cells' results are in DVC's run cache); returns those there were."""
    removed = []
    for clone in clones:
        if clone.is_symlink():
            raise ClusterError(f"{clone} is a symbolic link (to {clone.readlink()}): it is not followed. Fix: remove it")
        if clone.exists():
            shutil.rmtree(clone)
            removed.append(clone)
    return removed


def write_local_config(workspace_config: Path, clone_config: Path, settings: dict[str, dict[str, str]]) -> None:
    """The clone's .dvc/config.local, mode 0600: the workspace's (a remote's credentials, say) with `settings` over
    it."""
    config = ConfigObj(str(workspace_config) if workspace_config.exists() else None)
    for section, options in settings.items():
        config.setdefault(section, {}).update(options)
    config.filename = None           # write() then returns the lines, written here whole or not at all
    with atomic_path(clone_config) as tmp:
        tmp.chmod(0o600)             # a remote's password: the clone's copy is the user's alone, before it is written
        tmp.write_text("\n".join(config.write()) + "\n")


def git(cwd: Path, *args: str, check: bool = True, fix: str = "") -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(f"`git {' '.join(args)}` in {cwd} failed: {done.stderr.strip() or done.stdout.strip()}"
                           + (f". Fix: {fix}" if fix else ""))
    return done.stdout
