"""Warm stage processes (gcl.warm): `python -m gcl.warm <script>` runs a stage script in a child of a warm server
exactly as `python <script>` would run it cold."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm processes are Linux-only")

SCRIPT = '''
import os, sys, time
from gcl.core.errors import UserError

def main():
    print("pid", os.getpid(), "parent", os.getppid(), "args", sys.argv[1:], "cwd", os.getcwd(),
          "env", os.environ.get("STAGE_VALUE"), "path0", sys.path[0], "argv0", sys.argv[0], "file", __file__,
          "main", sys.modules["__main__"].__file__, flush=True)
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["sleep"]:
        open("child.pid", "w").write(str(os.getpid()))
        time.sleep(600)
        sys.exit("slept through the signal")
    if sys.argv[1:] == ["message"]:
        sys.exit("a usage message")
    if sys.argv[1:] == ["user-error"]:
        raise UserError("bad setting: fix it")
    if sys.argv[1:] == ["bug"]:
        raise ValueError("a bug")
    if sys.argv[1:] == ["record"]:
        with open("ran.txt", "a") as f:
            f.write(f"{os.getpid()} {os.getppid()}\\n")
        sys.exit(0)
    sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)

if __name__ == "__main__":
    main()
'''


@pytest.fixture
def stage(tmp_path):
    import shutil
    script = tmp_path / "stages" / "probe.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    # the library as it is now: a server serves only the code it started with, so an edit of the working tree
    # while the test runs (another window, another process) would otherwise send a stage cold
    library = tmp_path / "library"
    shutil.copytree(ROOT / "src" / "gcl", library / "gcl", ignore=shutil.ignore_patterns("__pycache__"))
    # generous waits for a server, so that a busy machine cannot make a warm stage run cold (ACK_TIMEOUT) or a test's
    # second stage find its server gone (KEEP_ALIVE); the server still ends with this process, the stages' owner
    env = {**os.environ, "PYTHONPATH": str(library), "GCL_WARM_KEEP_ALIVE": "60", "GCL_WARM_ACK_TIMEOUT": "60",
           "STAGE_VALUE": "v1", "TORCH_GCL_WARM_TEST": str(tmp_path)}    # an import-time variable: a server of its own

    def run(*args, preexec_fn=None, direct=False, **env_changes):
        launcher = [] if direct else ["-m", "gcl.warm"]     # as dvc.yaml runs a stage, or the script itself
        done = subprocess.run([sys.executable, *launcher, "stages/probe.py", *args], cwd=tmp_path,
                              env={**env, **env_changes}, capture_output=True, text=True, timeout=120,
                              preexec_fn=preexec_fn)
        fields = done.stdout.split()
        info = dict(zip(fields[::2], fields[1::2])) if fields else {}
        return done, info

    return run, script, env


def test_a_stage_runs_in_a_warm_child_as_it_would_cold(stage, tmp_path):
    run, script, _ = stage
    first, a = run("3")
    second, b = run("0", STAGE_VALUE="v2")
    assert first.returncode == 3 and second.returncode == 0
    assert a["parent"] == b["parent"]                    # both forked by one server ...
    assert a["pid"] != b["pid"]                          # ... each in a child of its own
    assert "'0']" in second.stdout and b["env"] == "v2"  # the client's arguments and environment
    assert b["cwd"] == str(tmp_path) and b["path0"] == str(script.parent)
    assert second.stderr == "to stderr\n"
    cold, c = run("0", GCL_WARM="0")
    assert cold.returncode == 0 and c["parent"] != a["parent"]   # switched off: in the client itself


@pytest.mark.parametrize("warm", ["1", "0"])
def test_exit_messages_and_errors_pass_through(stage, warm):
    """Warm or cold, the same: a usage message, a user's error as one line, a bug with its traceback."""
    run, _, _ = stage
    done, _ = run("message", GCL_WARM=warm)
    assert done.returncode == 1 and done.stderr.strip().endswith("a usage message")
    done, _ = run("user-error", GCL_WARM=warm)
    assert done.returncode == 1 and done.stderr == "to stderr\nerror: bad setting: fix it\n"
    done, _ = run("bug", GCL_WARM=warm)
    assert done.returncode == 1 and "Traceback" in done.stderr and done.stderr.strip().endswith("ValueError: a bug")


def test_the_launcher_runs_a_script_as_python_runs_it_warm_or_cold(stage):
    """`python -m gcl.warm stages/probe.py ...`, warm or cold (GCL_WARM=0), and `python stages/probe.py ...`: the
    same exit status, output and view of itself (sys.argv, __file__, sys.path[0], sys.modules["__main__"])."""
    run, _, _ = stage
    for args in (["3"], ["message"], ["bug"]):
        runs = {"warm": run(*args), "cold": run(*args, GCL_WARM="0"), "direct": run(*args, direct=True)}
        assert runs["warm"][1]["parent"] != str(os.getpid())                  # in a server's child ...
        assert runs["cold"][1]["parent"] == runs["direct"][1]["parent"] == str(os.getpid())   # ... or not
        seen = {how: (done.returncode, done.stderr, {k: v for k, v in info.items() if k not in ("pid", "parent")})
                for how, (done, info) in runs.items()}
        assert seen["warm"] == seen["cold"] == seen["direct"], seen
    _, info = runs["direct"]
    assert info["argv0"] == "stages/probe.py" and info["file"] == info["main"] == info["path0"] + "/probe.py"
    # an error the user can fix: one line through the launcher (as dvc.yaml runs a stage), a traceback by itself
    assert run("user-error", direct=True)[0].stderr.strip().endswith("UserError: bad setting: fix it")


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_script_that_does_not_compile_fails_as_python_says(stage, tmp_path, warm):
    run, script, _ = stage
    script.write_text("x = (\n")
    launched, direct = run(GCL_WARM=warm)[0], run(direct=True)[0]
    assert launched.returncode == direct.returncode == 1 and launched.stderr == direct.stderr, launched.stderr
    assert "SyntaxError" in direct.stderr and "Traceback" not in direct.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", ["check", "train"])
def test_a_stage_script_runs_alike_through_the_launcher_and_by_itself(tmp_path, script):
    """The project's own stage scripts (here refusing to run without their arguments): warm, cold and direct."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TORCH_GCL_WARM_TEST": str(tmp_path)}
    said = set()
    for launcher, warm in ((["-m", "gcl.warm"], "1"), (["-m", "gcl.warm"], "0"), ([], "1")):
        done = subprocess.run([sys.executable, *launcher, f"stages/{script}.py"], cwd=ROOT,
                              env={**env, "GCL_WARM": warm}, capture_output=True, text=True, timeout=120)
        said.add((done.returncode, done.stdout, done.stderr))
    assert len(said) == 1, said
    code, out, err = said.pop()
    assert code == 1 and out == "" and err.startswith(f"usage: python stages/{script}.py"), err


def test_every_stage_runs_through_the_launcher_and_the_server_imports_what_the_scripts_import():
    """dvc.yaml runs each stage script through gcl.warm; the scripts are plain scripts, whose imports (at their
    top) a server makes before it serves."""
    import yaml

    from gcl.warm.server import stage_imports
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    commands = [stage.get("do", stage)["cmd"] for stage in stages.values()]
    assert commands and all(c.startswith("python -m gcl.warm stages/") for c in commands), commands
    assert not [s for s in (ROOT / "stages").glob("*.py") if "gcl.warm" in s.read_text()]
    imported = stage_imports(ROOT / "stages")
    assert {"sys", "gcl.config", "gcl.core.layout"} <= set(imported) and len(imported) == len(set(imported))
    assert any(name.startswith("gcl.training") for name in imported)      # torch, through the library


def test_other_import_time_settings_get_a_server_of_their_own(stage):
    run, _, env = stage
    _, a = run("0")
    _, b = run("0", TORCH_GCL_WARM_TEST=env["TORCH_GCL_WARM_TEST"] + "-other")
    assert a["parent"] != b["parent"]


def test_edited_library_code_gets_a_server_of_its_own(stage, tmp_path):
    """A server serves only the library code (every byte of src/gcl) it imported: an edit starts a new one."""
    import shutil
    run, _, _ = stage
    library = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "gcl", library / "gcl", ignore=shutil.ignore_patterns("__pycache__"))
    _, before = run("0", PYTHONPATH=str(library))
    _, same = run("0", PYTHONPATH=str(library))
    with open(library / "gcl" / "core" / "layout.py", "a") as f:
        f.write("# an edit\n")
    _, after = run("0", PYTHONPATH=str(library))
    assert before["parent"] == same["parent"] != after["parent"] and before["parent"] != str(os.getpid())


def test_the_child_ends_when_the_stage_process_is_killed(stage, tmp_path):
    _, script, env = stage
    client = subprocess.Popen([sys.executable, "-m", "gcl.warm", str(script), "sleep"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = wait_for_child(tmp_path)
    assert child != client.pid
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.time() + 30
    while Path(f"/proc/{child}").exists() and time.time() < deadline:
        time.sleep(0.1)
    alive = Path(f"/proc/{child}/status").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text()
    assert not alive, "the warm child outlived its stage process"


def pinned_to_first_cpu():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def lower_cpu_limit():
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (10_000, resource.getrlimit(resource.RLIMIT_CPU)[1]))


@pytest.mark.parametrize("context", [pinned_to_first_cpu, lower_cpu_limit, lambda: os.nice(1)])
def test_a_stage_under_another_process_context_gets_a_server_of_its_own(stage, context):
    """A fork inherits the server's CPU set, priority and limits, not the stage's: a stage started under
    others (taskset, nice, ulimit) must not be served by a server started under these, nor the reverse."""
    run, _, _ = stage
    _, plain = run("0")
    _, other = run("0", preexec_fn=context)
    _, again = run("0")
    assert other["parent"] != plain["parent"] and again["parent"] == plain["parent"]


def server_of(stage) -> int:
    run, _, _ = stage
    _, info = run("0")
    return int(info["parent"])


def test_a_stopped_server_is_given_up_on_and_then_runs_nothing(stage, tmp_path):
    run, _, _ = stage
    server = server_of(stage)
    os.kill(server, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done, _ = run("record", GCL_WARM_ACK_TIMEOUT="1")
        waited = time.monotonic() - started
    finally:
        os.kill(server, signal.SIGCONT)
    assert done.returncode == 0 and waited < 60
    # the server, awake again, takes the abandoned request before the next one (in the order they came) and forks a
    # child for it, which must run nothing: wait for the next stage served, then for that child to have ended
    assert run("0")[1]["parent"] == str(server)
    wait_until(lambda: not live_children(server), "the abandoned request's child to end")
    lines = (tmp_path / "ran.txt").read_text().splitlines()
    assert len(lines) == 1 and int(lines[0].split()[1]) != server, lines    # run once, cold, by the stage itself


def live_children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, zombies left out."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue            # ended meanwhile
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def wait_until(condition, what: str, seconds: float = 60.0) -> None:
    """Wait for `condition()` (a busy machine may take long), failing with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_an_exiting_server_leaves_its_successors_socket(stage, tmp_path):
    import socket as sockets
    run, _, env = stage
    _, info = run("0", GCL_WARM_KEEP_ALIVE="2")
    code = "from gcl.warm.protocol import server_key, socket_path; print(socket_path(server_key()))"
    path = Path(subprocess.run([sys.executable, "-c", code], env={**env, "GCL_WARM_KEEP_ALIVE": "2"},
                               capture_output=True, text=True, check=True).stdout.strip())
    assert path.exists()
    successor = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    tmp = path.with_suffix(".successor.tmp")
    successor.bind(str(tmp))
    os.replace(tmp, path)            # a newer server published its socket under the same name
    try:
        deadline = time.time() + 30
        while Path(f"/proc/{info['parent']}").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{info['parent']}/status").exists() or \
            "zombie" in Path(f"/proc/{info['parent']}/status").read_text()
        assert path.exists()         # the old server went without removing it
    finally:
        successor.close()
        path.unlink(missing_ok=True)


def wait_for_child(tmp_path) -> int:
    pid_file = tmp_path / "child.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the stage to start")   # created, then written
    return int(pid_file.read_text())


# the SIGINT disposition a stage inherits: Python's default, or ignored, as a shell starts a script's background
# commands (`dvc repro &`, and so `nohup pytest &`); set explicitly, so that the tests do not take pytest's own
SIGINT_DISPOSITIONS = {"sigint-default": lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                       "sigint-ignored": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}


def started_stage(script: Path, cwd: Path, env: dict, inherited: str) -> subprocess.Popen:
    """The launcher running the probe's "sleep", started with the `inherited` SIGINT disposition."""
    return subprocess.Popen([sys.executable, "-m", "gcl.warm", str(script), "sleep"], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=SIGINT_DISPOSITIONS[inherited])


def stderr_at_end(client: subprocess.Popen) -> str:
    """What the stage wrote to stderr once it ended; one that does not end within two minutes is killed (its warm
    child with it) and the test fails."""
    try:
        return client.communicate(timeout=120)[1]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def assert_the_scripts_own_ctrl_c_traceback(err: str) -> None:
    """The stage's own traceback, as a cold `python <script>` prints it after Ctrl-C: the script's frames (the
    signal may come while it writes its pid or while it sleeps), none of the launcher's or the server's."""
    assert err.rstrip().endswith("KeyboardInterrupt") and 'probe.py", line' in err and "in main" in err, err
    assert "run_stage" not in err and "receive" not in err, err
    assert "runpy" not in err and "gcl/warm" not in err, err


@pytest.mark.parametrize("inherited", sorted(SIGINT_DISPOSITIONS))
@pytest.mark.parametrize("how, returncode", [("kill the child", -signal.SIGKILL), ("ctrl-c", -signal.SIGINT)])
def test_a_killed_or_interrupted_warm_stage_ends_as_a_cold_one_would(stage, tmp_path, how, returncode, inherited):
    """Killed, or stopped by Ctrl-C (what the terminal sends the stage's process group): also when the stage was
    started with SIGINT ignored, where the launcher restores it (gcl.warm.__main__.react_to_ctrl_c)."""
    _, script, env = stage
    client = started_stage(script, tmp_path, env, inherited)
    child = wait_for_child(tmp_path)
    assert child != client.pid
    if how == "kill the child":
        os.kill(child, signal.SIGKILL)
    else:
        client.send_signal(signal.SIGINT)
    err = stderr_at_end(client)
    assert client.returncode == returncode, err
    if how == "ctrl-c":
        assert_the_scripts_own_ctrl_c_traceback(err)


@pytest.mark.parametrize("inherited", sorted(SIGINT_DISPOSITIONS))
def test_ctrl_c_in_a_cold_stage_shows_the_scripts_traceback_alone(stage, tmp_path, inherited):
    """Run cold in the launcher's own process (GCL_WARM=0), as `python <script>` ends on Ctrl-C; started with SIGINT
    ignored, it stops all the same."""
    _, script, env = stage
    client = started_stage(script, tmp_path, {**env, "GCL_WARM": "0"}, inherited)
    assert wait_for_child(tmp_path) == client.pid
    client.send_signal(signal.SIGINT)
    err = stderr_at_end(client)
    assert client.returncode == -signal.SIGINT, err
    assert_the_scripts_own_ctrl_c_traceback(err)

OWNER = """
import subprocess, sys
from pathlib import Path
done = subprocess.run(COMMAND, shell=SHELL, capture_output=True, text=True)
fields = done.stdout.split()
server = dict(zip(fields[::2], fields[1::2]))["parent"]
# while this process lives, its stage's server lives on: it is a warm server
print(server, "gcl.warm" in Path(f"/proc/{server}/cmdline").read_text())
"""


@pytest.mark.parametrize("through_shell", [False, True])
def test_the_server_ends_with_the_process_its_stages_came_from(stage, tmp_path, through_shell):
    """What `dvc repro` starts ends with it: the server exits once the stages' owner (here a Python process that
    runs one stage, as DVC does, directly or through `sh -c`) has ended, long before its idle time (60 s)."""
    _, script, env = stage
    command = f"{sys.executable} -m gcl.warm {script} 0"
    code = OWNER.replace("COMMAND", repr(command if through_shell else command.split())).replace(
        "SHELL", str(through_shell))
    owner = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    server, warm = owner.stdout.split()
    assert warm == "True", owner.stderr
    wait_until(lambda: not alive(int(server)), "the server to end with its stages' owner", 30)   # idle: 60 s


def alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


def test_an_owner_that_cannot_be_watched_leaves_the_server_to_its_idle_time(monkeypatch):
    """Where pidfds are missing (an old kernel), the server must not take an unwatched owner for an ended one."""
    from gcl.warm.server import _watch_owner
    owners: dict[int, int] = {}
    assert _watch_owner(os.getpid(), owners) and list(owners.values()) == [os.getpid()]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert _watch_owner(gone.pid, owners) and len(owners) == 1          # ended already: nothing to watch
    assert not _watch_owner(None, owners)                               # a request without an owner
    for fd in owners:
        os.close(fd)

    def no_pidfd(pid):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    assert not _watch_owner(12345, {})


@pytest.mark.parametrize("runtime_dir", ["missing", "a file", "too long a path"])
def test_a_socket_folder_that_cannot_be_made_or_used_runs_the_stage_cold(stage, tmp_path, runtime_dir):
    """XDG_RUNTIME_DIR naming a folder that does not exist (what SLURM jobs, cron and sudo hand down), a file, or a
    folder whose socket path is too long for a Unix socket: the stage runs cold, with nothing said about it."""
    run, _, _ = stage
    folder = tmp_path / {"missing": "gone", "a file": "file", "too long a path": "x" * 100}[runtime_dir]
    if runtime_dir == "a file":
        folder.write_text("")
    elif runtime_dir == "too long a path":
        folder.mkdir()
    done, info = run("0", XDG_RUNTIME_DIR=str(folder))
    assert done.returncode == 0 and done.stderr == "to stderr\n", done.stderr
    assert info["parent"] == str(os.getpid())        # in the stage process itself: cold
    sockets = folder / f"gcl-warm-{os.getuid()}"
    assert not sockets.is_dir() or not any(sockets.iterdir())   # no server was started for a socket it cannot bind


# ------------------------------------------------------------------------ a shared host: whom the launcher trusts

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user (CI runs as root)")


def sockets_folder(runtime: Path) -> Path:
    return runtime / f"gcl-warm-{os.getuid()}"


def fork_as_other_user(action) -> int:
    """Run `action()` in a forked child that dropped to another user's ids; its pid (it exits 0 where action
    returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = 0 if action() else 2
        finally:
            os._exit(code)
    return pid


def exit_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("made_by", ["another user", "mode 0777", "a link"])
def test_a_socket_folder_not_this_users_alone_is_not_used_and_the_stage_runs_cold(stage, tmp_path, made_by):
    """/tmp/gcl-warm-<uid> made first by someone else (or left open to others, or a link to elsewhere): the stage
    neither serves from it nor connects to it, says so in one line, and runs cold."""
    if made_by == "another user" and os.geteuid() != 0:
        pytest.skip("needs root, to make a folder owned by another user")
    run, _, _ = stage
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    folder = sockets_folder(runtime)
    if made_by == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir()
        os.chmod(folder, 0o700 if made_by == "another user" else 0o777)
        if made_by == "another user":
            os.chown(folder, NOBODY, NOBODY)
    done, info = run("0", XDG_RUNTIME_DIR=str(runtime))
    assert done.returncode == 0 and info["parent"] == str(os.getpid())      # ran, cold
    why = {"another user": f"owned by uid {NOBODY}", "mode 0777": "mode 0777", "a link": "not a directory"}[made_by]
    said, rest = done.stderr.split("\n", 1)
    assert said.startswith(f"gcl.warm: running cold: {folder}: ") and why in said and rest == "to stderr\n", done.stderr
    assert not any(folder.iterdir())                 # no server, lock or log was made there
    assert not any((tmp_path / "elsewhere").iterdir()) if made_by == "a link" else True


@as_root
def test_the_server_serves_only_its_own_user(stage, tmp_path, request):
    """A connection from another uid (SO_PEERCRED) gets no reply and no child, even with the right request; the
    server goes on serving its own user."""
    import shutil
    import socket
    import tempfile

    from gcl.warm.protocol import receive, send
    run, _, _ = stage
    runtime = Path(tempfile.mkdtemp(prefix="gw"))     # short: pytest's own folders are too long a path for a socket
    request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
    first, a = run("0", XDG_RUNTIME_DIR=str(runtime))
    assert first.returncode == 0 and a["parent"] != str(os.getpid())        # warm: a server listens
    folder = sockets_folder(runtime)
    [path] = folder.glob("*.sock")
    key = path.stem
    os.chmod(runtime, 0o755)
    os.chmod(folder, 0o755)           # let the other user reach the socket (the test opens what a server relies on)
    os.chmod(path, 0o777)

    def knock() -> bool:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(10)
        conn.connect(str(path))
        try:
            send(conn, {"key": key, "script": "stages/probe.py", "argv": ["record"], "cwd": str(tmp_path), "env": {},
                        "umask": 0o022, "client": os.getpid(), "owner": None})
            return receive(conn) is None    # closed without a word
        except (BrokenPipeError, ConnectionResetError):
            return True                     # closed before the request was read
    try:
        assert exit_status(fork_as_other_user(knock)) == 0
    finally:
        os.chmod(folder, 0o700)
    assert not (tmp_path / "ran.txt").exists()
    second, b = run("0", XDG_RUNTIME_DIR=str(runtime))
    assert second.returncode == 0 and b["parent"] == a["parent"]     # the same server, still serving its user


@as_root
def test_the_client_connects_only_to_a_server_of_its_own_user(request):
    """A socket owned by another user, or a server process of another user behind a socket that looks like ours:
    refused (Untrusted), so the stage's environment and streams go to no one else."""
    import shutil
    import socket
    import tempfile

    from gcl.warm.client import _connect
    from gcl.warm.protocol import Untrusted
    folder = Path(tempfile.mkdtemp(prefix="gw"))       # in /tmp, where the other user can reach it
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.chmod(folder, 0o777)
    path = folder / "server.sock"
    ready_r, ready_w = os.pipe()

    def listen() -> bool:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)
        os.write(ready_w, b"x")
        time.sleep(30)
        return True
    pid = fork_as_other_user(listen)
    os.close(ready_w)                                   # a child that fails ends the read below
    try:
        assert os.read(ready_r, 1) == b"x", "the other user's server did not start"
        assert os.stat(path).st_uid == NOBODY
        with pytest.raises(Untrusted, match=f"uid {NOBODY}"):
            _connect(path)                             # the socket file is another user's
        os.chown(path, os.getuid(), os.getgid())
        with pytest.raises(Untrusted, match="another user listens"):
            _connect(path)                             # looks like ours; the process behind it is not
    finally:
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        exit_status(pid)


@pytest.mark.slow
def test_a_stage_of_another_checkout_refuses_to_run_this_checkouts_library(tmp_path):
    """A worktree at another commit, with `pip install -e` pointing elsewhere, would train the other checkout's code
    while DVC records its own: the launcher stops before the script runs, naming both and the fix. A copy with the
    same code (a DVC experiment's temporary copy of the workspace) runs."""
    root = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "GCL_WARM": "0"}
    other = tmp_path / "other-checkout"
    (other / "src" / "gcl").mkdir(parents=True)           # other code: an empty library
    (other / "stages").mkdir()
    ran = tmp_path / "ran"
    (other / "stages" / "train.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    done = subprocess.run([sys.executable, "-m", "gcl.warm", "stages/train.py"], cwd=other, env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0 and not ran.exists()
    assert f"belongs to the project at {other}" in done.stderr and f"PYTHONPATH={other / 'src'}" in done.stderr
    # the same code elsewhere (an experiment's copy) runs, as does the library's own checkout
    same = tmp_path / "same-code"
    shutil.copytree(root / "src" / "gcl", same / "src" / "gcl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(other / "stages", same / "stages")
    done = subprocess.run([sys.executable, "-m", "gcl.warm", "stages/train.py"], cwd=same, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and ran.exists(), done.stderr
    here = subprocess.run([sys.executable, "-m", "gcl.warm", "stages/train.py"], cwd=root, env=env,
                          capture_output=True, text=True)
    assert "belongs to the project" not in here.stderr and "usage: python stages/train.py" in here.stderr
