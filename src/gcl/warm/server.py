"""The warm server: imports what the stage scripts import (torch and the library's stage-level modules) once,
then forks a child per stage that runs the stage's script as a cold `python <script>` would (gcl.warm.stage).

    python -m gcl.warm.server <key> <socket> <stages folder>    # started by the first stage that finds none
"""
from __future__ import annotations

import ast
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from gcl.warm import stage
from gcl.warm.protocol import ACK_TIMEOUT, GO_AHEAD, peer_uid, receive, send, server_key, unpublished

KEEP_ALIVE = float(os.environ.get("GCL_WARM_KEEP_ALIVE", "30"))   # seconds a server waits for a stage


def stage_imports(stages: Path) -> list[str]:
    """The modules the scripts in `stages` import at their top (plain imports, as any script's): what a server
    imports before it serves.

    Read from the scripts (their syntax tree) rather than listed here: the scripts are the one statement of what a
    stage needs, so a server imports exactly that, never a module no stage imports, and a refactor that moves a
    stage-level function to another module needs no edit here. A list kept here (torch and ten modules) would need
    one at each such move, and would tie this package to the modules of the layers above it."""
    names = []
    for script in sorted(stages.glob("*.py")):
        for node in ast.parse(script.read_bytes()).body:
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
    return list(dict.fromkeys(names))


def serve(key: str, path: Path, stages: Path) -> None:
    """Import what the scripts in `stages` import, then fork a child per stage until the owners of the stages
    served so far have all ended, or KEEP_ALIVE seconds pass with no stage."""
    for name in stage_imports(stages):
        importlib.import_module(name)
    if server_key() != key:      # the code changed while this server started: serve nothing
        return
    tmp = unpublished(path, os.getpid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp))
    listener.listen(64)
    os.replace(tmp, path)        # published whole: a client connects to a server that is ready
    mine = os.stat(path).st_ino
    children: dict[int, socket.socket] = {}
    owners: dict[int, int] = {}  # pidfd -> pid of a process that stages came from, while it lives
    served = blind = False       # blind: a stage's owner could not be watched, so only KEEP_ALIVE ends the server
    idle_since = time.monotonic()
    try:
        while children or (time.monotonic() - idle_since < KEEP_ALIVE and (owners or blind or not served)):
            for fd in select.select([listener, *owners], [], [], 0.1)[0]:
                if fd in owners:         # an owner ended
                    del owners[fd]
                    os.close(fd)
                    continue
                conn, _ = listener.accept()
                if peer_uid(conn) != os.getuid():   # another user's process: it gets nothing, not even a reply
                    conn.close()
                    continue
                pid, owner = _fork_stage(key, conn, listener)
                if pid is not None:
                    children[pid] = conn
                    served = True
                    blind |= not _watch_owner(owner, owners)
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    conn = children.pop(pid)
                    try:
                        send(conn, {"status": os.waitstatus_to_exitcode(status)})
                    except OSError:
                        pass     # the client is gone
                    conn.close()
                    idle_since = time.monotonic()
    finally:
        try:                      # the next stage starts a new server; a successor's socket is left alone
            if os.stat(path).st_ino == mine:
                path.unlink()
        except OSError:
            pass
        listener.close()


def _watch_owner(owner: int | None, owners: dict[int, int]) -> bool:
    """Watch `owner` (a pidfd in `owners`); False when it cannot be watched here (no pidfd on this kernel, or no
    owner sent), and KEEP_ALIVE alone must then end the server. An owner already gone needs no watching."""
    if owner is None:
        return False
    if owner in owners.values():
        return True
    try:
        owners[os.pidfd_open(owner)] = owner
    except ProcessLookupError:
        pass                      # already gone
    except (OSError, AttributeError):
        return False
    return True


def _fork_stage(key: str, conn: socket.socket, listener: socket.socket) -> tuple[int | None, int | None]:
    """Receive a stage and fork its child: (child, the stage's owner); (None, None) when the request is not for
    this server, or unreadable (its client then runs the stage cold)."""
    conn.settimeout(ACK_TIMEOUT)
    try:
        request = receive(conn)
    except (OSError, ValueError):
        request = None
    if request is None or request.get("key") != key:
        try:
            send(conn, {"stale": True})
        except OSError:
            pass
        conn.close()
        return None, None
    # the child holds Ctrl-C back until it has the stage's handler (_run_child): one passed on by the client before
    # that must reach the stage's script, not the server's code the child is still running
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            send(conn, {"child": pid})
        except OSError:
            pass       # the client is gone: the child gets no go-ahead and runs nothing
        return pid, request.get("owner")
    listener.close()
    fds = _go_ahead(conn)
    if fds is None:
        os._exit(125)            # the client gave up on this server (it runs the stage cold) or is gone
    conn.close()
    _run_child(request, fds)
    return None, None   # not reached


def _go_ahead(conn: socket.socket) -> list[int] | None:
    """In the child: the client's standard streams, sent with its confirmation (within ACK_TIMEOUT) that it still
    wants the stage run here; None without it."""
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 16, 3)
    except OSError:
        return None
    if msg != GO_AHEAD or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    return fds


def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the stage process and run its script; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())   # as Python sets up a stage's own stdout
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})    # one held back since the fork arrives here
        os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _end_with(request["client"])
        try:
            stage.run(stage.prepare(request["script"], request["argv"]))
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:  # noqa: BLE001  (the stage's own error, shown as a cold start shows it)
            stage.excepthook(type(exc), exc, exc.__traceback__)
            code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code < 0:     # Ctrl-C: end by SIGINT, as a cold Python does after a KeyboardInterrupt
            stage.die_by(-code)
        os._exit(code)   # not the server's exit handlers


def _end_with(client: int) -> None:
    """End this child (SIGTERM, as a cold stage gets from DVC's death) when the client process ends."""
    try:
        pidfd = os.pidfd_open(client)
    except (OSError, AttributeError):
        return

    def watch():
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
