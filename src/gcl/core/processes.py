"""Processes that end with their parent, and one trainer per run at a time."""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import sys
from pathlib import Path

from gcl.core.errors import UserError, writing

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux; elsewhere a no-op), so that
    a killed `dvc repro` or train stage leaves no trainer writing results behind it."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() == 1:      # the parent died before the request took effect
        os.kill(os.getpid(), sig)


class RunLockedError(UserError, RuntimeError):
    """Another process is training this run."""


class RunLock:
    """An exclusive, non-blocking lock on one run, held for the life of the training process (the kernel
    releases it when the process ends, however it ends). Its holder removes the file as it lets go, so a
    finished run leaves nothing behind; a killed one leaves the file (the report stage sweeps it)."""

    def __init__(self, path: str | Path, run: str):
        self.path, self.run, self.fd = Path(path), run, None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(self.fd)
                raise RunLockedError(f"run {self.run} is being trained by another process (pid {holder}); wait for "
                                     f"it to finish or stop it, then run again") from None
            if self._still_named():
                break
            os.close(self.fd)   # its previous holder removed the file between our open and our lock: take the new one
        try:
            with writing(self.path):    # a full disk: one line naming the lock file, and no file left behind
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _still_named(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self.fd).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)   # while still held: no one can hold the file being removed
        os.close(self.fd)
