"""Errors a user can cause and fix: bad settings, missing or damaged data, a device the machine lacks, a run
that another process is training, a file system that refuses a write. A stage prints such an error as one line
naming the problem and the fix, without a traceback (error_line, used by the stage launcher, gcl.warm); any other
exception is a bug and keeps its traceback."""
from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class UserError(Exception):
    """The message says what is wrong and what to do; nothing in the traceback would help the user."""


# file-system errors the machine or the user causes, and what to do about each
_FIXES = {
    errno.EACCES: "make it writable (and readable) for this user, or work in a clone you own",
    errno.EPERM: "make it writable (and readable) for this user, or work in a clone you own",
    errno.EROFS: "the file system is read-only: work in a clone on a writable one",
    errno.ENOSPC: "free disk space (`dvc gc` trims DVC's cache) and run again",
    errno.EDQUOT: "your disk quota is full: free space and run again",
    errno.EISDIR: "a folder stands where a file belongs: remove it and run again",
    errno.ENOTDIR: "a file stands where a folder belongs: remove it and run again",
}


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind `exc`: `exc` itself, or the one a library raised it while handling (torch.save's
    RuntimeError "[enforce fail at inline_container.cc...]" hides the file's OSError as its context)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def writing(target: str | Path, temporary: str | Path | None = None) -> Iterator[None]:
    """Re-raise a failure to write `target` as an OSError naming it, whatever layer raised it: a write to an open
    file (a full disk, a quota) carries no file name, torch.save hides that OSError in a RuntimeError, and a file
    written as `temporary` (a file, or a folder of files) in `target`'s stead would name a path that is gone.
    An OSError naming any other path already says where it happened, and is left alone."""
    try:
        yield
    except Exception as exc:
        cause = os_error_in(exc)
        if cause is None:
            raise
        named = _target_of(cause.filename2 or cause.filename, Path(target), temporary)
        if named is None:
            raise
        raise OSError(cause.errno, cause.strerror, str(named)) from exc


def _target_of(name, target: Path, temporary: str | Path | None) -> Path | None:
    """The path a failure naming `name` is about: `target` when it names nothing, `target` or the temporary, the
    same file under `target` when it names one inside a temporary folder; None for any other path."""
    if name is None or Path(name) == target:
        return target
    if temporary is not None:
        try:
            return target / Path(name).relative_to(temporary)
        except ValueError:
            pass
    return None


def file_system_error(exc: OSError) -> str | None:
    """One line for a file-system error with a known fix (permissions, read-only, disk full, a folder where a
    file belongs), naming the path; None for any other OSError, which keeps its traceback."""
    fix = _FIXES.get(exc.errno)
    path = exc.filename2 or exc.filename
    if fix is None or path is None:
        return None
    return f"cannot use {path}: {exc.strerror or errno.errorcode.get(exc.errno, exc.errno)}. Fix: {fix}"


def error_line(exc: BaseException) -> str | None:
    """The one line a stage prints for an error the user can fix (a UserError, or a file-system error with a
    known fix); None for any other exception, which keeps its traceback."""
    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, OSError):
        return file_system_error(exc)
    return None
