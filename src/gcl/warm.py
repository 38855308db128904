"""Warm stage processes: a stage starts in milliseconds instead of the seconds that importing torch takes.

`dvc repro` starts one Python process per stage, and importing torch and the library costs each of them
~1.5-2.5 s, most of a short run's wall time. Instead, a stage script hands itself to a warm server: a Python
process that has imported them once and forks a child per stage. The child takes over the stage's
standard streams, working directory, environment and arguments, runs the script exactly as a fresh
process would, and its exit status becomes the stage's. The numbers cannot differ from a cold start: the
server never runs a torch operation or any stage code itself, and it serves only stages whose interpreter,
import path, import-time environment and library code (every byte of src/gcl) are the ones it was started
with, and whose process context (CPU affinity, priority, resource limits, cgroup: what a fork inherits from
the server, not from the stage) is the server's; anything else gets a server of its own, started on first
use. A server exits as soon as the processes its stages belong to (`dvc repro`, say) have all ended, or after
`KEEP_ALIVE` seconds without a stage, and removes only its own socket: nothing stays behind a finished `dvc
repro`. What it imports is what the stage scripts beside the first one it serves import at their top. A stage
waits at most `ACK_TIMEOUT` seconds for a server to take it, then runs cold; the child runs only on the
stage's go-ahead, so a server that wakes up after its client gave up runs nothing. If the client (the stage
process DVC started) dies, its child ends too, and the child's worker processes with it; a child killed by
a signal ends its client by the same signal, and Ctrl-C reaches the child. GCL_WARM=0, or any failure to
reach a server, runs the stage cold.

A stage script is a plain script that calls `warm_start()` first, before its imports:

    from gcl.warm import warm_start
    warm_start()   # a warm process runs this script when one is available (gcl.warm)

    import ...     # the script's imports, then its code, as in any script

Longer than ~300 lines because the client and the server speak one small protocol (request, ack, go-ahead
with the streams, exit status) and are kept side by side.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gcl.core.fingerprint import LIBRARY, library_digest

KEEP_ALIVE = float(os.environ.get("GCL_WARM_KEEP_ALIVE", "30"))   # seconds a server waits for a stage
START_TIMEOUT = 60.0
ACK_TIMEOUT = float(os.environ.get("GCL_WARM_ACK_TIMEOUT", "10"))   # seconds a stage waits to be taken, then runs cold
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}   # a stage's parent that only runs its command line
# environment variables read while torch and the library are imported: a server serves only stages that agree
IMPORT_TIME_ENV = ("OMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_", "LD_", "PYTHON")


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


SOCKET_PATH_MAX = 107   # bytes of a Unix socket's path (sun_path, less its terminating NUL)


def socket_path(key: str) -> Path:
    """The server's socket, in a folder of this user's made if needed; an OSError when that folder cannot be made
    (XDG_RUNTIME_DIR naming a missing or unwritable folder, as SLURM jobs, cron and sudo hand down) or the path is
    too long for a socket."""
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"gcl-warm-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{key}.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, "too long a path for a socket", str(path))
    return path


# ---------------------------------------------------------------------------- client

CHILD_FLAG = "GCL_WARM_CHILD"


def warm_start() -> None:
    """A stage script's first call: hand the script over to a warm child (this process then only relays, and
    exits with the child's status), or return when warm processes are off or unavailable, or when this already
    is the warm child, and the script runs here. Either way an error the user can fix ends the stage as one
    line (gcl.core.errors.error_line), any other keeps its traceback."""
    from gcl.core.processes import die_with_parent
    die_with_parent()   # a killed `dvc repro` must not leave this stage (and so its child) running
    sys.excepthook = _one_line_errors
    if os.environ.get(CHILD_FLAG) != "1":
        script = sys.modules["__main__"].__file__
        status = run_stage(script, sys.argv[1:])
        if status is not None:
            sys.exit(status)


def _one_line_errors(kind, exc, tb) -> None:
    from gcl.core.errors import error_line
    line = error_line(exc)
    if line is None:
        sys.__excepthook__(kind, exc, tb)
    else:
        print(f"error: {line}", file=sys.stderr)


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


def run_stage(script: str, argv: list[str]) -> int | None:
    """Run `script` with `argv` in a warm child and return its exit status; None when the stage should run cold
    (warm processes switched off or unavailable, or a server that does not take the stage within ACK_TIMEOUT),
    which the caller then does itself. The child starts only on this process's go-ahead, so a server that takes
    the request after this process gave up runs nothing. A child killed by a signal ends this process by the
    same signal, and Ctrl-C here reaches the child, so the caller sees what a cold stage would give it."""
    if os.environ.get("GCL_WARM", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    key = server_key()
    try:
        path = socket_path(key)
        conn = _connect(path) or _start_server(key, path, script)
    except OSError:     # no socket folder, or one this user cannot write to: the stage runs cold, silently
        return None
    if conn is None:
        return None
    request = {"key": key, "script": str(Path(script).resolve()), "argv": argv, "cwd": os.getcwd(),
               "env": dict(os.environ), "umask": _umask(), "client": os.getpid(), "owner": _owner()}
    try:
        conn.settimeout(ACK_TIMEOUT)
        conn.sendall(json.dumps(request).encode() + b"\n")
        ack = _read_line(conn)
        if ack is None or "child" not in ack:   # a stale server (it shuts down) or a lost connection
            conn.close()
            return None
        # the standard streams go with the go-ahead, never before: a server that never takes the request must not
        # hold them (a caller reading this stage's output through a pipe would wait for it forever)
        socket.send_fds(conn, [b"go\n"], [0, 1, 2])
        conn.settimeout(None)
    except OSError:                             # socket.timeout included: a stopped or stuck server
        conn.close()
        return None
    status = _wait_status(conn, ack["child"])
    if status is None:
        sys.exit("error: the warm stage process was lost (its server ended); run the stage again, or with GCL_WARM=0")
    if status < 0:            # killed by a signal: end this process the same way
        _die_by(-status)
    return status


def _die_by(signum: int) -> None:
    """End this process by signal `signum`, its default action restored (SIGKILL's cannot be changed)."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _wait_status(conn: socket.socket, child: int) -> int | None:
    """The child's exit status; Ctrl-C here is passed on to the child (it is not in the terminal's process group)."""
    while True:
        try:
            reply = _read_line(conn)
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
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        return conn
    except OSError:
        conn.close()
        return None


def _start_server(key: str, path: Path, script: str) -> socket.socket | None:
    """Start a server for `key` (one at a time: a lock beside the socket) and connect to it; it imports what the
    stage scripts in `script`'s folder import."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)       # another stage started it while this one waited
        if conn is not None:
            return conn
        with open(path.with_suffix(".log"), "ab") as log:
            server = subprocess.Popen([sys.executable, "-m", "gcl.warm", key, str(path), str(Path(script).parent)],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                      start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and server.poll() is None:   # a server that failed to start: cold
            conn = _connect(path)
            if conn is not None:
                return conn
            time.sleep(0.05)
    return None


def _read_line(conn: socket.socket) -> dict | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


# ---------------------------------------------------------------------------- server


def stage_imports(stages: Path) -> list[str]:
    """The modules the stage scripts in `stages` import at their top level (what a server imports once)."""
    import ast
    names = []
    for script in sorted(stages.glob("*.py")):
        for node in ast.parse(script.read_text()).body:
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
    return [n for n in dict.fromkeys(names) if n != "gcl.warm"]


def serve(key: str, path: Path, stages: Path) -> None:
    """Import what the stages import, then fork a child per stage until the owners of the stages served so far
    have all ended, or KEEP_ALIVE seconds pass with no stage."""
    import importlib
    for name in stage_imports(stages):
        importlib.import_module(name)
    if server_key() != key:      # the code changed while this server started: serve nothing
        return
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
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
                        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
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
        request = _read_line(conn)
    except (OSError, ValueError):
        request = None
    if request is None or request.get("key") != key:
        try:
            conn.sendall(b'{"stale": true}\n')
        except OSError:
            pass
        conn.close()
        return None, None
    pid = os.fork()
    if pid:
        try:
            conn.sendall(json.dumps({"child": pid}).encode() + b"\n")
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
    if msg != b"go\n" or len(fds) != 3:
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
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[CHILD_FLAG] = "1"
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = str(Path(request["script"]).parent)    # as `python <script>` sets it
        _end_with(request["client"])
        import runpy
        try:
            runpy.run_path(request["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:  # noqa: BLE001  (the stage's own error, shown as a cold start shows it)
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != request["script"]:
                tb = tb.tb_next       # from the script's own frame on, without runpy's and this module's
            # set on the exception itself: the interpreter's hook prints the exception's own traceback, not its argument
            exc = exc.with_traceback(tb or exc.__traceback__)
            _one_line_errors(type(exc), exc, exc.__traceback__)   # what warm_start's hook prints cold
            code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code < 0:     # Ctrl-C: end by SIGINT, as a cold Python does after a KeyboardInterrupt
            _die_by(-code)
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
