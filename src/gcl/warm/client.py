"""The stage's side: hand a stage script to a warm server (started on first use) and relay its child's exit
status; None where the stage should run cold instead."""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from gcl.warm.protocol import ACK_TIMEOUT, GO_AHEAD, Untrusted, peer_uid, receive, send, server_key, socket_path
from gcl.warm.stage import die_by

START_TIMEOUT = 60.0
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}   # a stage's parent that only runs its command line


def run_stage(script: str, args: list[str]) -> int | None:
    """Run `script` (`python <script> <args>`) in a warm child and return its exit status; None when the stage
    should run cold (warm processes switched off or unavailable, or a server that does not take the stage within
    ACK_TIMEOUT), which the caller then does itself. The child starts only on this process's go-ahead, so a
    server that takes the request after this process gave up runs nothing. A child killed by a signal ends this
    process by the same signal, and Ctrl-C here reaches the child, so the caller sees what a cold stage would
    give it."""
    if os.environ.get("GCL_WARM", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    key = server_key()
    try:
        path = socket_path(key)
        conn = _connect(path) or _start_server(key, path, Path(script).parent)
    except Untrusted as exc:    # a folder or server that is not this user's alone: cold, and the user is told why
        print(f"gcl.warm: running cold: {exc.filename}: {exc.strerror}", file=sys.stderr, flush=True)
        return None
    except OSError:     # no socket folder, or one this user cannot write to: the stage runs cold, silently
        return None
    if conn is None:
        return None
    request = {"key": key, "script": script, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ),
               "umask": _umask(), "client": os.getpid(), "owner": _owner()}
    try:
        conn.settimeout(ACK_TIMEOUT)
        send(conn, request)
        ack = receive(conn)
        if ack is None or "child" not in ack:   # a stale server (it shuts down) or a lost connection
            conn.close()
            return None
        # from the go-ahead on a Ctrl-C is the child's: held back until _wait_status passes it on, so that one
        # arriving before this process waits (the child may be running the script already) is not lost
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # the standard streams go with the go-ahead, never before: a server that never takes the request must not
        # hold them (a caller reading this stage's output through a pipe would wait for it forever)
        socket.send_fds(conn, [GO_AHEAD], [0, 1, 2])
        conn.settimeout(None)
    except OSError:                             # socket.timeout included: a stopped or stuck server
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        conn.close()
        return None
    status = _wait_status(conn, ack["child"])
    if status is None:
        sys.exit("error: the warm stage process was lost (its server ended); run the stage again, or with GCL_WARM=0")
    if status < 0:            # killed by a signal: end this process the same way
        die_by(-status)
    return status


def _owner() -> int:
    """The process this stage belongs to (DVC, or whoever started the stage), seen through a shell that only runs
    the stage's command line: the server lives no longer than the owners of its stages."""
    parent = os.getppid()
    try:
        if Path(f"/proc/{parent}/comm").read_text().strip() in SHELLS:
            return int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return parent


def _wait_status(conn: socket.socket, child: int) -> int | None:
    """The child's exit status; Ctrl-C here (held back since the go-ahead) is passed on to the child (it is not in the
    terminal's process group)."""
    while True:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})    # a Ctrl-C held back arrives here
            reply = receive(conn)
            return None if reply is None or "status" not in reply else int(reply["status"])
        except KeyboardInterrupt:
            try:
                os.kill(child, signal.SIGINT)
            except ProcessLookupError:
                pass
        except OSError:
            return None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _connect(path: Path) -> socket.socket | None:
    """A connection to the server at `path`; None where none listens. Untrusted when the process listening there
    belongs to another user: the request (this stage's environment) and its standard streams go to no one else."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise Untrusted(1, f"not a socket of this user's (uid {info.st_uid})", str(path))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    if peer_uid(conn) != os.getuid():
        conn.close()
        raise Untrusted(1, "a server of another user listens there", str(path))
    return conn


def _start_server(key: str, path: Path, stages: Path) -> socket.socket | None:
    """Start a server for `key` (one at a time: a lock beside the socket) and connect to it; it imports what the
    scripts in `stages` (the folder of the script to run) import."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)       # another stage started it while this one waited
        if conn is not None:
            return conn
        with open(path.with_suffix(".log"), "ab") as log:
            server = subprocess.Popen([sys.executable, "-m", "gcl.warm.server", key, str(path),
                                       str(stages.resolve())], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      cwd="/", start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and server.poll() is None:   # a server that failed to start: cold
            conn = _connect(path)
            if conn is not None:
                return conn
            time.sleep(0.05)
    return None
