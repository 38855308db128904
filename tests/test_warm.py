"""Warm stage processes (gcl.warm): a stage runs in a child of a warm server exactly as it would cold."""
from __future__ import annotations

import os
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
from gcl.warm import run_warm

def main():
    print("pid", os.getpid(), "parent", os.getppid(), "args", sys.argv[1:], "cwd", os.getcwd(),
          "env", os.environ.get("STAGE_VALUE"), "path0", sys.path[0], flush=True)
    print("to stderr", file=sys.stderr)
    if sys.argv[1:] == ["sleep"]:
        open("child.pid", "w").write(str(os.getpid()))
        time.sleep(60)
    if sys.argv[1:] == ["message"]:
        sys.exit("a usage message")
    sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)

if __name__ == "__main__":
    run_warm(__file__, main)
'''


@pytest.fixture
def stage(tmp_path):
    script = tmp_path / "stages" / "probe.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GCL_WARM_KEEP_ALIVE": "20", "STAGE_VALUE": "v1",
           "TORCH_GCL_WARM_TEST": str(tmp_path)}    # an import-time variable: a server of this test's own

    def run(*args, **env_changes):
        done = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env={**env, **env_changes},
                              capture_output=True, text=True, timeout=120)
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


def test_exit_messages_and_errors_pass_through(stage):
    run, _, _ = stage
    done, _ = run("message")
    assert done.returncode == 1 and done.stderr.strip().endswith("a usage message")


def test_other_import_time_settings_get_a_server_of_their_own(stage):
    run, _, env = stage
    _, a = run("0")
    _, b = run("0", TORCH_GCL_WARM_TEST=env["TORCH_GCL_WARM_TEST"] + "-other")
    assert a["parent"] != b["parent"]


def test_the_child_ends_when_the_stage_process_is_killed(stage, tmp_path):
    _, script, env = stage
    client = subprocess.Popen([sys.executable, str(script), "sleep"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "child.pid"
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert child != client.pid
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.time() + 10
    while Path(f"/proc/{child}").exists() and time.time() < deadline:
        time.sleep(0.1)
    alive = Path(f"/proc/{child}/status").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text()
    assert not alive, "the warm child outlived its stage process"
