"""Errors a user can cause and fix: bad settings, missing or damaged data, a device the machine lacks, a run
that another process is training, a file system that refuses a write. A stage prints such an error as one line
naming the problem and the fix, without a traceback (error_line, used by gcl.warm.warm_start); any other
exception is a bug and keeps its traceback."""
from __future__ import annotations

import errno


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
