"""Write-then-rename helpers: a reader never sees a half-written file, and a failed write is an OSError naming
the file the user asked for (gcl.core.errors.writing), never the temporary written in its stead."""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from gcl.core.errors import writing


def umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the body succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~umask())   # mkstemp makes it 0600; a plain open() would honour the umask (a shared group)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        with writing(path, tmp_path):
            yield tmp_path
            os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; it replaces `path` only if the body succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~umask())      # as for files: mkdtemp makes it 0700
    try:
        with writing(path, tmp):
            yield tmp
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def move_file(source: str | Path, target: str | Path) -> None:
    """Move `source` onto `target`, also from another file system (a rename cannot cross one: EXDEV, as when
    .gcl-progress is a link to a scratch disk): a copy to a temporary beside `target`, renamed onto it, then
    `source` removed. A reader never sees a half-copied `target`, and a failed copy leaves `source` in place."""
    try:
        os.replace(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    Path(source).unlink()


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: Any) -> None:
    """Strict JSON: a NaN or infinity raises (bare NaN is not JSON, and no reader should get one)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the `.<name>.*.tmp` files and folders a killed write left in `folder` (not recursive)."""
    folder = Path(folder)
    stale = sorted(folder.glob(".*.tmp")) if folder.is_dir() else []
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return stale


def save_tensors(path: str | Path, obj: Any) -> None:
    """torch.save, atomically and byte-reproducibly: given a path, torch names the archive's records
    after the (random) temporary file; given a file object, always "archive/", so the same tensors
    give the same bytes and DVC's hash of an output does not change between runs."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)
