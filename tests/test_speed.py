"""benchmarks/speed.py: the table of step times and the one-cell timer, on shrunken shapes (fast on CPU)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gcl.data.benchmarks import build_benchmark
from gcl.config import resolve_benchmark
from image_fixtures import write_er_params, labelled_source as source

SPEED = Path(__file__).resolve().parents[1] / "benchmarks" / "speed.py"


@pytest.fixture
def speed(monkeypatch):
    spec = importlib.util.spec_from_file_location("speed_under_test", SPEED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the real shapes cost seconds per CPU step; the code path is the same on 8x8 images
    monkeypatch.setattr(module, "SHAPE", (3, 8, 8))
    monkeypatch.setattr(module, "STREAM", 4)
    monkeypatch.setattr(module, "REPLAY", 4)
    monkeypatch.setattr(module, "HPARAMS", {**module.HPARAMS, "batch": 4, "replay_batch": 4})
    return module


def test_table_has_bare_er_derpp_and_skips_unknown_methods(speed, capsys):
    rows = speed.main(["--device", "cpu", "--methods", "er,derpp,no-such-method", "--steps", "2", "--rounds", "2"])
    loops = [r["loop"] for r in rows]
    assert loops[:2] == ["bare", "er"] and "no-such-method" not in loops
    assert all(r["seconds"] > 0 and r["device"] == "cpu" and r["precision"] == "fp32" for r in rows)
    out = capsys.readouterr()
    assert "no-such-method" in out.err and "vs bare" in out.out and "1.00x" in out.out


def test_bf16_and_channels_last_options_run(speed, capsys):
    rows = speed.main(["--device", "cpu", "--methods", "er", "--steps", "1", "--rounds", "1",
                       "--bf16", "--channels-last"])
    assert {(r["precision"], r["layout"]) for r in rows} == {("bf16", "channels_last")}


def test_time_one_cell_of_a_params_file(speed, tmp_path, monkeypatch, capsys):
    params = write_er_params(tmp_path)
    data = resolve_benchmark(params, "seq")["data"]
    build_benchmark(data, source(per_class=8), tmp_path / "data" / "benchmarks" / "seq")
    monkeypatch.chdir(tmp_path)
    assert speed.main(["--cell", "seq-er-50"]) is None
    out = capsys.readouterr().out
    assert "seq-er-50 seed 0 on cpu" in out and "samples/s" in out and "task-il" in out
    assert not (tmp_path / "runs").exists()   # timing only: nothing written
    torch.set_num_threads(1)
