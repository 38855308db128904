"""Warm stage processes: a stage starts in milliseconds instead of the seconds that importing torch takes.

`dvc repro` starts one Python process per stage, and importing torch and the library costs each of them
~1.5-2.5 s, most of a short run's wall time. Instead, a stage script hands itself to a warm server: a Python
process that has imported them once and forks a child per stage. The child takes over the stage's
standard streams, working directory, environment and arguments, runs the script exactly as a fresh
process would, and its exit status becomes the stage's. The numbers cannot differ from a cold start: the
server never runs a torch operation or any stage code itself, and it serves only stages whose interpreter,
import path, import-time environment and library code (every byte of src/gcl) are the ones it was started
with; anything else gets a server of its own, started on first use. A server exits after `KEEP_ALIVE`
seconds without a stage. If the client (the stage process DVC started) dies, its child ends too, and the
child's worker processes with it. GCL_WARM=0, or any failure to reach a server, runs the stage cold.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from gcl.training.fingerprint import LIBRARY, library_digest

KEEP_ALIVE = float(os.environ.get("GCL_WARM_KEEP_ALIVE", "120"))   # seconds a server waits for a stage
START_TIMEOUT = 60.0
PRELOAD = ("torch", "gcl.config", "gcl.training.run", "gcl.data.sources", "gcl.report")   # what the stages import
# environment variables read while torch and the library are imported: a server serves only stages that agree
IMPORT_TIME_ENV = ("OMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_", "LD_", "PYTHON")


def server_key() -> str:
    """What a server must share with a stage for the stage to run in it."""
    env = {k: v for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV)}
    parts = [sys.executable, sys.version, str(LIBRARY), json.dumps(env, sort_keys=True), library_digest()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def socket_path(key: str) -> Path:
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"gcl-warm-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{key}.sock"


# ---------------------------------------------------------------------------- client

CHILD_FLAG = "GCL_WARM_CHILD"


def run_warm(script: str, main) -> None:
    """A stage script's entry: run `main` in a warm child (this process only relays), or here when warm
    processes are off or unavailable, or when this already is the warm child."""
    from gcl.processes import die_with_parent
    die_with_parent()   # a killed `dvc repro` must not leave this stage (and so its child) running
    if os.environ.get(CHILD_FLAG) != "1":
        status = run_stage(script, sys.argv[1:])
        if status is not None:
            sys.exit(status)
    run_main(main)


def run_main(main) -> None:
    """`main`, with an error the user can fix (gcl.errors.UserError, or a file-system error with a known fix)
    printed as one line; any other exception keeps its traceback."""
    from gcl.errors import UserError, file_system_error
    try:
        main()
    except UserError as exc:
        sys.exit(f"error: {exc}")
    except OSError as exc:
        line = file_system_error(exc)
        if line is None:
            raise
        sys.exit(f"error: {line}")


def run_stage(script: str, argv: list[str]) -> int | None:
    """Run `script` with `argv` in a warm child and return its exit status; None when the stage should run cold
    (warm processes switched off or unavailable), which the caller then does itself."""
    if os.environ.get("GCL_WARM", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    key = server_key()
    path = socket_path(key)
    conn = _connect(path) or _start_server(key, path)
    if conn is None:
        return None
    request = {"key": key, "script": str(Path(script).resolve()), "argv": argv, "cwd": os.getcwd(),
               "env": dict(os.environ), "client": os.getpid()}
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        reply = _read_line(conn)
    except OSError:
        return None
    if reply is None or "status" not in reply:    # a stale server (it shuts down) or a lost connection
        return None
    return int(reply["status"])


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        return conn
    except OSError:
        conn.close()
        return None


def _start_server(key: str, path: Path) -> socket.socket | None:
    """Start a server for `key` (one at a time: a lock beside the socket) and connect to it."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)       # another stage started it while this one waited
        if conn is not None:
            return conn
        with open(path.with_suffix(".log"), "ab") as log:
            subprocess.Popen([sys.executable, "-m", "gcl.warm", key, str(path)], stdin=subprocess.DEVNULL,
                             stdout=log, stderr=log, cwd="/", start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
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


def serve(key: str, path: Path) -> None:
    """Import once, then fork a child per stage until KEEP_ALIVE seconds pass with none."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    if server_key() != key:      # the code changed while this server started: serve nothing
        return
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp))
    listener.listen(64)
    os.replace(tmp, path)        # published whole: a client connects to a server that is ready
    children: dict[int, socket.socket] = {}
    idle_since = time.monotonic()
    try:
        while children or time.monotonic() - idle_since < KEEP_ALIVE:
            if select.select([listener], [], [], 0.1)[0]:
                conn, _ = listener.accept()
                pid = _fork_stage(key, conn, listener)
                if pid is not None:
                    children[pid] = conn
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
        path.unlink(missing_ok=True)   # the next stage starts a new server
        listener.close()


def _fork_stage(key: str, conn: socket.socket, listener: socket.socket) -> int | None:
    """Receive a stage and fork its child; None when the request is not for this server (its client then
    runs the stage cold)."""
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(msg)
    if request.get("key") != key or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.sendall(b'{"stale": true}\n')
        conn.close()
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    listener.close()
    conn.close()
    _run_child(request, fds)
    return None   # not reached


def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the stage process and run its script; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
            traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
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
    serve(sys.argv[1], Path(sys.argv[2]))
