"""File-system faults: a full disk at any write is one line naming the file and the fix, leaving nothing
half-written; progress on another file system than the outputs still finishes its run. Each fault is simulated
at the lowest layer it comes from (a write to an open file carries no file name), and also met on a real small
file system where this machine lets a test mount one."""
import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import gcl.core.atomic as atomic
import gcl.training.progress as progress_module
from gcl.core.atomic import move_file, save_tensors, write_json
from gcl.core.errors import error_line
from gcl.core.processes import RunLock
from gcl.core.progress_files import PROGRESS_DIR
from gcl.training.checkpoint import Checkpoint
from gcl.training.progress import Progress
from gcl.training.run import train_run
from helpers import small_er_run

FULL = "No space left on device. Fix: free disk space"


def enospc(*_, **__):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))    # as a write to an open file raises it: no file name


class FullFile:
    """An open file on a full disk: every write fails."""

    def __init__(self, path, mode="r", **kwargs):
        self.file = open(path, mode, **kwargs)

    def write(self, data):
        enospc()

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def refusal(call) -> str:
    """The line a stage prints for the error `call` raises (gcl.core.errors.error_line)."""
    with pytest.raises(Exception) as failed:
        call()
    line = error_line(failed.value)
    assert line is not None, f"no one-line message for {failed.value!r}"
    return line


# ------------------------------------------------------------------ a full disk, simulated at each write site

def test_a_full_disk_inside_torch_save_names_the_checkpoint(tmp_path, monkeypatch):
    """torch.save re-raises the file's OSError as RuntimeError('[enforce fail at inline_container.cc...]')."""
    path = tmp_path / "seed-0.ckpt"
    save_tensors(path, {"step": 1})
    monkeypatch.setattr(atomic, "open", FullFile, raising=False)
    checkpoint = Checkpoint(path, "print", 60.0)
    line = refusal(lambda: checkpoint.save({"weights": torch.zeros(1000)}))
    assert line.startswith(f"cannot use {path}: {FULL}") and "\n" not in line
    assert os.listdir(tmp_path) == ["seed-0.ckpt"] and torch.load(path)["step"] == 1   # the old one, whole


def test_a_full_disk_in_a_json_write_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "runs" / "metrics.json"
    monkeypatch.setattr(Path, "write_text", enospc)
    assert refusal(lambda: write_json(path, {"a": 1})).startswith(f"cannot use {path}: {FULL}")
    assert os.listdir(path.parent) == []                   # no temporary left


def test_a_full_disk_writing_the_lock_names_it_and_leaves_no_lock(tmp_path, monkeypatch):
    path = tmp_path / "er-50.lock"
    monkeypatch.setattr(os, "pwrite", enospc)
    assert refusal(lambda: RunLock(path, "er-50").__enter__()).startswith(f"cannot use {path}: {FULL}")
    assert not path.exists()
    monkeypatch.undo()
    with RunLock(path, "er-50"):       # not held by the failed attempt
        assert path.read_text() == str(os.getpid())


def test_a_full_disk_writing_the_log_names_it(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    monkeypatch.setattr(progress_module, "open", FullFile, raising=False)
    assert refusal(lambda: Progress("er-50", log).say("step 1")).startswith(f"cannot use {log}: {FULL}")


def test_an_error_naming_another_file_keeps_its_name(tmp_path):
    """Only a nameless failure, or one naming the temporary, is renamed after the file being written."""
    other = tmp_path / "elsewhere"
    with pytest.raises(OSError) as failed:
        with atomic.atomic_path(tmp_path / "out.json"):
            raise OSError(errno.EACCES, "Permission denied", str(other))
    assert failed.value.filename == str(other)
    with pytest.raises(ValueError):                        # not a file-system error: untouched
        with atomic.atomic_path(tmp_path / "out.json"):
            raise ValueError("a bug")


# ------------------------------------------------------------------ progress on another file system

@pytest.fixture
def run_spec(tmp_path, monkeypatch):
    """One seed of a small ER run, in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return small_er_run([0])


def across_file_systems(monkeypatch):
    """os.replace as between two file systems: a rename out of its own folder fails with EXDEV."""
    real = os.replace

    def replace(source, target, **kwargs):
        if Path(source).parent.resolve() != Path(target).parent.resolve():
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(source), None, str(target))
        return real(source, target, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def test_a_file_moves_across_file_systems_whole(tmp_path, monkeypatch):
    across_file_systems(monkeypatch)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "out").mkdir()
    source, target = tmp_path / "scratch" / "features.pt", tmp_path / "out" / "features.pt"
    source.write_bytes(b"features")
    target.write_bytes(b"older")
    move_file(source, target)
    assert target.read_bytes() == b"features" and not source.exists()
    assert os.listdir(tmp_path / "out") == ["features.pt"]


def test_a_run_finishes_with_its_progress_on_another_file_system(run_spec, monkeypatch):
    across_file_systems(monkeypatch)
    out = train_run(run_spec)
    assert json.loads(out.read_text())["seeds"]["0"]["class_il"] >= 0
    assert torch.load(out.parent / "features.pt")["seed"] == 0
    assert not (PROGRESS_DIR / "er-50").exists()


# ------------------------------------------------------------------ the same on real small file systems

@pytest.fixture
def small_fs(tmp_path):
    """A 256 kB tmpfs mounted in tmp_path, where this machine allows a test to mount one (root, no container
    restriction); skipped elsewhere."""
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("this machine does not let a test mount a file system")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk_is_one_line_naming_the_file(small_fs):
    tensors, js = small_fs / "seed-0.ckpt", small_fs / "metrics.json"
    line = refusal(lambda: save_tensors(tensors, {"weights": torch.zeros(100_000)}))     # 400 kB
    assert line.startswith(f"cannot use {tensors}: {FULL}"), line
    line = refusal(lambda: write_json(js, {"values": list(range(100_000))}))
    assert line.startswith(f"cannot use {js}: {FULL}"), line
    assert os.listdir(small_fs) == []                      # nothing half-written


def test_a_run_finishes_with_its_progress_on_a_real_other_file_system(run_spec, small_fs):
    PROGRESS_DIR.symlink_to(small_fs)        # as clusters do: .gcl-progress a link to a scratch disk
    out = train_run(run_spec)
    assert torch.load(out.parent / "features.pt")["seed"] == 0
    assert os.listdir(small_fs) == []


def test_a_real_full_disk_stops_a_run_in_one_line_and_the_rerun_loses_nothing(run_spec, small_fs):
    """.gcl-progress on a file system too small for the seed's features: one line naming the file, and once
    there is room the rerun finishes with the numbers of a run that never stopped."""
    subprocess.run(["mount", "-o", "remount,size=8k", str(small_fs)], check=True)   # the features take 13 kB
    PROGRESS_DIR.symlink_to(small_fs)
    line = refusal(lambda: train_run(run_spec))
    assert line.startswith(f"cannot use {PROGRESS_DIR / 'er-50'}/") and FULL in line, line
    assert not [p for p in small_fs.rglob("*") if p.name.endswith(".tmp")]          # nothing half-written
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)   # room made
    resumed = json.loads(train_run(run_spec).read_text())["seeds"]["0"]
    again = json.loads(train_run(run_spec).read_text())["seeds"]["0"]                # from scratch, uninterrupted
    assert resumed["acc_matrix"] == again["acc_matrix"] and resumed["class_il"] == again["class_il"]
