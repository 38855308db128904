"""What a warm server and its stages share: the key that says which server may serve a stage, where the server's
socket is, and the messages they exchange.

The protocol, one connection per stage: the stage sends its request (a JSON line: key, script, arguments,
directory, environment, umask, its own pid and its owner's); the server forks a child and acks with the child's
pid (or says it is stale); the stage sends its go-ahead with its standard streams (SCM_RIGHTS); when the child
exits the server sends its exit status.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import socket
import stat
import struct
import sys
from pathlib import Path

from gcl.core.fingerprint import LIBRARY, library_digest

ACK_TIMEOUT = float(os.environ.get("GCL_WARM_ACK_TIMEOUT", "10"))   # seconds a stage waits to be taken, then runs cold
# environment variables read while torch and the library are imported: a server serves only stages that agree
IMPORT_TIME_ENV = ("OMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_", "LD_", "PYTHON")
SOCKET_PATH_MAX = 107   # bytes of a Unix socket's path (sun_path, less its terminating NUL)
GO_AHEAD = b"go\n"


def process_context() -> str:
    """What a forked child inherits from its server rather than from the stage that asked for it: the CPUs it
    may run on, its priority, its resource limits and its cgroup (a job's memory cap on a cluster)."""
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = ""
    return json.dumps([sorted(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0), limits, cgroup],
                      sort_keys=True)


def server_key() -> str:
    """What a server must share with a stage for the stage to run in it: the interpreter, the library's code, the
    import-time environment and the process context (a stage under another CPU set, priority, limit or cgroup
    gets a server started from its own context)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV)}
    parts = [sys.executable, sys.version, str(LIBRARY), json.dumps(env, sort_keys=True), library_digest(),
             process_context()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


class Untrusted(OSError):
    """A socket folder or a peer that is not this user's alone: the stage runs cold and says why, in one line."""


def socket_path(key: str) -> Path:
    """The server's socket, in a private folder of this user's (made if needed); an OSError when that folder cannot
    be made (XDG_RUNTIME_DIR naming a missing or unwritable folder, as SLURM jobs, cron and sudo hand down) or the
    path is too long for a socket, and Untrusted when the folder is not this user's alone (see private_folder)."""
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"gcl-warm-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    private_folder(folder)
    path = folder / f"{key}.sock"
    if len(os.fsencode(unpublished(path, 10 ** 10 - 1))) > SOCKET_PATH_MAX:   # the longer of the two names it has
        raise OSError(errno.ENAMETOOLONG, "too long a path for a socket", str(path))
    return path


def unpublished(path: Path, pid: int) -> Path:
    """Where server `pid` binds its socket before it renames it to `path`, once it is ready."""
    return path.with_suffix(f".{pid}.tmp")


def private_folder(folder: Path) -> None:
    """Refuse a socket folder that another user could have made or can write to: in /tmp (where XDG_RUNTIME_DIR is
    unset) anyone may create `gcl-warm-<uid>` first, and whoever controls the folder controls which server a stage
    talks to. It must be a real directory (not a link), owned by this user, with no access for group or others."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise Untrusted(errno.ENOTDIR, "not a directory (a link or a file)", str(folder))
    if info.st_uid != os.getuid():
        raise Untrusted(errno.EPERM, f"owned by uid {info.st_uid}, not by this user (uid {os.getuid()})", str(folder))
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise Untrusted(errno.EPERM, f"mode {stat.S_IMODE(info.st_mode):04o}: others may use it (0700 expected)",
                        str(folder))


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket, as the kernel recorded it when the
    connection was made (SO_PEERCRED: it cannot be forged by the peer)."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def receive(conn: socket.socket) -> dict | None:
    """The next message; None when the other side closed the connection first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)
