"""python -m gcl.bench grid (gcl.bench.grid): a profile's device-hours projected from timed steps (a 2-method, 2-step
profile on CPU); python -m gcl.bench compile (gcl.bench.compiled): eager and compiled steps timed side by side (whether
they train alike: tests/test_compile.py)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from gcl.bench import compiled
from gcl.bench import grid as grid_module
from gcl.data.random_sources import MNIST_PIXELS, SOURCE_SHAPES, SourceShape
from image_fixtures import SEQ_BENCHMARK

PER_CLASS, TEST_PER_CLASS = 12, 3


@pytest.fixture
def grid(monkeypatch):
    # the benchmarks look shapes up through gcl.data.random_sources.shape_of, in its SOURCE_SHAPES
    small = SourceShape(10, PER_CLASS, TEST_PER_CLASS, (1, 28, 28), MNIST_PIXELS)
    monkeypatch.setitem(SOURCE_SHAPES, "mnist-bundled", small)
    yield grid_module
    torch.set_num_threads(1)


def write_profile(tmp_path: Path) -> Path:
    bench = {**SEQ_BENCHMARK, "epochs": 3}
    params = {"seeds": [0, 1], "device": "cpu", "sources": {"mnist-bundled": {}}, "benchmarks": {"b": bench},
              "methods": {"er": {}, "joint": {}, "sgd": {}},
              "runs": {"b-er-20": {"benchmark": "b", "method": "er", "buffer": 20, "lr": 0.1, "batch": 4,
                                   "replay_batch": 4},
                       "b-er-40": {"benchmark": "b", "method": "er", "buffer": 40, "lr": 0.1, "batch": 4,
                                   "replay_batch": 4, "seeds": [0, 1, 2]},
                       "b-joint-none": {"benchmark": "b", "method": "joint", "buffer": "none", "lr": 0.1, "batch": 5},
                       "b-sgd-none": {"benchmark": "b", "method": "sgd", "buffer": "none", "lr": 0.1, "batch": 4}}}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_a_profiles_projection_from_two_timed_steps(grid, tmp_path, capsys):
    rows = grid.main(["--profile", str(write_profile(tmp_path)), "--methods", "er,joint", "--steps", "2",
                          "--warmup", "2", "--device", "cpu", "--threads", "1"])
    by = {r["method"]: r for r in rows}
    assert set(by) == {"er", "joint"}                       # sgd filtered out
    er, joint = by["er"], by["joint"]
    assert (er["runs"], er["seeds"]) == (2, 5)              # b-er-40's own three seeds count
    per_task = math.ceil(2 * PER_CLASS / 4)                 # 2 classes per task, batch 4
    assert er["real_steps"] == 5 * 3 * per_task and er["real_evals"] == 5 and er["n_tasks"] == 5
    assert joint["real_steps"] == math.ceil(10 * PER_CLASS / 5) * 3 and joint["real_evals"] == 1
    assert er["timed_steps"] == 2 and er["step"] > 0 and er["evaluation"] > 0
    for r in rows:
        per_seed = (r["real_steps"] * r["step"] + r["n_tasks"] * r["boundary"]
                    + (r["real_evals"] + 1) * r["evaluation"])
        assert r["effective"] == r["step"]                   # one process: its own throughput
        assert r["hours"] == pytest.approx(r["seeds"] * per_seed / 3600)
    out = capsys.readouterr().out
    assert "whole profile" in out and "device-hours" in out and "b" in out


@pytest.mark.slow
def test_several_processes_divide_the_step_time(grid, tmp_path):
    rows = grid.main(["--profile", str(write_profile(tmp_path)), "--methods", "sgd", "--steps", "2",
                          "--warmup", "1", "--device", "cpu", "--processes", "2", "--threads", "1"])
    (sgd,) = rows
    assert sgd["effective"] == pytest.approx(sgd["step"] / 2)


def test_the_timed_stream_is_the_warmup_then_the_second_tasks_first_steps(grid):
    from gcl.data.stream import Stream
    bounds = [0, 4, 8, 10, 14, 18, 20]              # task 0: steps 0-2, task 1: steps 3-5
    stream = Stream(images=torch.zeros(20, 1, 2, 2, dtype=torch.uint8), labels=torch.zeros(20, dtype=torch.long),
                    order=torch.arange(20), bounds=bounds, eval_after=[2, 5], task_ends=[2, 5],
                    task_classes=[(0, 2), (2, 4)])
    cut, timed = grid.timing_stream(stream, True, warmup=2, steps=2)
    assert timed == 2 and cut.bounds == [0, 4, 8, 12, 16]
    assert cut.order.tolist() == list(range(8)) + list(range(10, 18))
    assert cut.task_ends == cut.eval_after == [1, 3]
    flat, _ = grid.timing_stream(dataclasses_replace(stream, task_ends=[]), False, warmup=2, steps=3)
    assert flat.task_ends == [] and flat.eval_after == [1, 4] and flat.bounds == bounds[:6]


def dataclasses_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_compile_reaches_the_timed_cells(grid, tmp_path, monkeypatch):
    """--compile on times the compiled backbone (here dynamo without code generation, counted); off, eager."""
    from gcl.core import backbones
    calls = []

    def compile_extractor(fn, mode):
        compiled = torch.compile(fn, backend="aot_eager", dynamic=False)
        return lambda *args: calls.append(mode) or compiled(*args)

    monkeypatch.setattr(backbones, "compile_extractor", compile_extractor)
    backbones.compiled_extract.cache_clear()
    # the first task holds 18 steps (3 epochs of 6); the loop's first 20 steps are eager
    argv = ["--profile", str(write_profile(tmp_path)), "--methods", "er", "--steps", "4", "--warmup", "18",
            "--device", "cpu", "--threads", "1"]
    try:
        grid.main(argv + ["--compile", "off"])
        assert calls == []
        grid.main(argv + ["--compile", "on"])
        assert calls and set(calls) == {"default"}
    finally:
        backbones.compiled_extract.cache_clear()
        torch._dynamo.reset()


def test_the_compile_command_times_eager_and_compiled_steps(grid, tmp_path, monkeypatch, capsys):
    """Every pair that compiles is trained both ways and timed (here dynamo without code generation); JOINT, which
    trains after the stream, is named as skipped."""
    from gcl.core import backbones
    argv = ["--profile", str(write_profile(tmp_path)), "--benchmarks", "b", "--methods", "er,joint", "--steps", "30",
            "--warmup", "25", "--device", "cpu"]
    try:
        monkeypatch.setattr(backbones, "compile_extractor",
                            lambda fn, mode: torch.compile(fn, backend="aot_eager", dynamic=False))
        backbones.compiled_extract.cache_clear()
        (row,) = compiled.main(argv)
        assert row["method"] == "er" and row["mode"] == "default"
        assert row["eager_ms"] > 0 and row["compiled_ms"] > 0 and row["speedup"] == row["eager_ms"] / row["compiled_ms"]
        out = capsys.readouterr().out
        assert "b joint: not compiled" in out and "compiled ms" in out and "30 steps each way" in out
        with pytest.raises(SystemExit):
            compiled.main([*argv[:-4], "--warmup", "10", "--device", "cpu"])   # inside the loop's eager steps
    finally:
        backbones.compiled_extract.cache_clear()
        torch._dynamo.reset()
