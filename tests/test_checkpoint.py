"""Checkpoints inside a seed: a seed stopped mid-stream and started again ends with exactly the numbers of a
seed that never stopped (CPU), for every method; a checkpoint of other settings is refused."""
import math

import pytest
import torch

from gcl.core.results import TIMINGS, SeedResult
from gcl.data import sequential
from gcl.methods import METHODS
from gcl.training.checkpoint import Checkpoint, global_rng_states, restore_global_rng_states
from gcl.training.progress import Progress
from gcl.training.train import run_seed
from helpers import run_settings, sequential_settings, synthetic_source

CPU = torch.device("cpu")
# small settings for every method (what the loop needs to run, not tuned values)
SETTINGS = {
    "sgd": {}, "joint": {}, "er": {}, "er-ace": {}, "agem": {}, "coca": {}, "clser": {},
    "der": {"alpha": 0.3}, "derpp": {"alpha": 0.3, "beta": 0.5},
    "er-star": {"lam": 0.5}, "derpp-star": {"alpha": 0.3, "beta": 0.5, "lam": 0.5},
    "gss": {"gss_minibatch": 4}, "gem": {}, "icarl": {}, "fdr": {},
    "hal": {"hal_lambda": 0.1, "beta": 0.5, "gamma": 0.1, "anchor_steps": 3, "finetune_steps": 1},
    "lwf": {"alpha": 1.0}, "oewc": {"e_lambda": 10.0}, "si": {"c": 1.0}, "pcr": {}, "esmer": {},
    "cndpm": {"arch": "mlp", "lr_vae": 1e-3, "log_alpha": -60.0, "stm_capacity": 20, "sleep_steps_vae": 20,
              "sleep_steps_cls": 20, "sleep_batch": 10, "z_dim": 4, "z_samples": 2, "vae_width": 8, "vae_ext": 4,
              "cls_width": 8, "cls_ext": 4},
}


class Stopped(Exception):
    """Stands in for a killed process."""


def run_cfg(name: str, buffer=30):
    cls = METHODS[name]
    given = {"lr": 0.05, "batch": 4, **({"replay_batch": 4} if "replay_batch" in cls.Settings.model_fields else {}),
             **SETTINGS[name]}
    return run_settings(name, buffer=buffer if cls.uses_buffer else "none", **given)


@pytest.fixture(scope="module")
def seq():
    # augmentation: the transforms' random draws resume too
    settings = sequential_settings(epochs=2, n_tasks=3, augment=True)
    bench = sequential.build_benchmark(synthetic_source(per_class=12, test_per_class=4, classes=6), settings.data())
    return bench, settings.training()


def stop_at(monkeypatch, cls, calls: int):
    """Make `cls.observe` raise on its `calls`-th call (0-based), as a kill would stop the stream there."""
    original, seen = cls.observe, [0]

    def observe(self, *args):
        if seen[0] == calls:
            raise Stopped
        seen[0] += 1
        return original(self, *args)

    monkeypatch.setattr(cls, "observe", observe)


def interrupted_run(monkeypatch, tmp_path, bench, cfg, run, stop: int, every: float,
                    compiled: str | None = None) -> tuple[SeedResult, list[str]]:
    """Stop the seed at stream step `stop`, then run it again from its checkpoint; returns the result and the
    progress lines."""
    ckpt = Checkpoint(tmp_path / "seed-0.ckpt", "fp", every)
    lines = []
    progress = Progress("cell", tmp_path / "train.log", seed=0)
    with monkeypatch.context() as m:
        stop_at(m, METHODS[run.algorithm], stop)
        with pytest.raises(Stopped):
            run_seed(bench, cfg, run, 0, CPU, progress=progress, checkpoint=ckpt, compiled=compiled)
    assert ckpt.path.exists()
    result = run_seed(bench, cfg, run, 0, CPU, progress=progress, checkpoint=ckpt, compiled=compiled)
    lines = (tmp_path / "train.log").read_text().splitlines()
    return result, lines


def same_numbers(a: SeedResult, b: SeedResult) -> None:
    a, b = a.to_json(), b.to_json()
    assert set(a) == set(b)
    for key in a:
        if key not in TIMINGS:
            assert a[key] == b[key], key


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_stopped_seed_resumes_to_the_same_numbers(name, seq, monkeypatch, tmp_path):
    """A checkpoint after every step; the stream stops in the middle of the second task (epoch 2)."""
    bench, cfg = seq
    run = run_cfg(name)
    plain = run_seed(bench, cfg, run, 0, CPU)
    steps = plain.steps
    resumed, lines = interrupted_run(monkeypatch, tmp_path, bench, cfg, run, stop=steps // 2 + 2, every=0.0)
    same_numbers(plain, resumed)
    assert any(f"resumed from {tmp_path / 'seed-0.ckpt'} at step {steps // 2 + 2} of {steps}" in line
               for line in lines)


@pytest.mark.parametrize("name", ["er", "derpp", "coca", "lwf", "icarl"])
def test_resume_from_the_last_task_end(name, seq, monkeypatch, tmp_path):
    """Checkpoints at task ends only: the seed goes back to the end of task 1 (begin_task of task 2 already ran
    before that checkpoint, and does not run twice)."""
    bench, cfg = seq
    run = run_cfg(name)
    plain = run_seed(bench, cfg, run, 0, CPU)
    resumed, lines = interrupted_run(monkeypatch, tmp_path, bench, cfg, run, stop=plain.steps - 2, every=math.inf)
    same_numbers(plain, resumed)
    task_end = plain.steps // 3
    assert any(f"at step {2 * task_end} of" in line for line in lines)   # the end of task 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["er", "derpp", "coca", "clser"])
def test_mnist360_resumes_to_the_same_numbers(name, tiny_mnist360, monkeypatch, tmp_path):
    """No tasks: checkpoints come by time only (here after every step)."""
    bench, cfg = tiny_mnist360
    run = run_cfg(name, buffer=50)
    plain = run_seed(bench, cfg, run, 0, CPU)
    resumed, _ = interrupted_run(monkeypatch, tmp_path, bench, cfg, run, stop=plain.steps // 3, every=0.0)
    same_numbers(plain, resumed)
    assert plain.class_il > 100 / 9 * 1.5     # it learned: the comparison is not between two failures


def test_a_checkpoint_of_other_settings_is_refused(seq, monkeypatch, tmp_path, capsys):
    bench, cfg = seq
    run = run_cfg("er")
    foreign = Checkpoint(tmp_path / "seed-0.ckpt", "other-settings", 0.0)
    with monkeypatch.context() as m:
        stop_at(m, METHODS["er"], 7)
        with pytest.raises(Stopped):
            run_seed(bench, cfg, run, 0, CPU, checkpoint=foreign)
    mine = Checkpoint(tmp_path / "seed-0.ckpt", "these-settings", 0.0)
    result = run_seed(bench, cfg, run, 0, CPU, checkpoint=mine)
    out = capsys.readouterr().out
    assert f"checkpoint {mine.path} refused: it was written for other settings, data or code" in out
    assert "fingerprint other-settings, this seed's is these-settings" in out and "resumed" not in out
    same_numbers(run_seed(bench, cfg, run, 0, CPU), result)


def test_an_unreadable_checkpoint_is_refused(seq, tmp_path, capsys):
    bench, cfg = seq
    path = tmp_path / "seed-0.ckpt"
    path.write_bytes(b"PK\x03\x04 truncated")
    run_seed(bench, cfg, run_cfg("er"), 0, CPU, checkpoint=Checkpoint(path, "fp", 1e9))
    assert "refused: it cannot be read" in capsys.readouterr().out


def test_a_checkpoint_with_foreign_objects_is_refused_without_pytorchs_advice(seq, tmp_path, capsys):
    """weights_only loading refuses arbitrary objects; PyTorch's message then advises weights_only=False, which
    would run the file's code: the project's message says what to make of the file instead."""
    import argparse
    bench, cfg = seq
    path = tmp_path / "seed-0.ckpt"
    torch.save({"fingerprint": "fp", "state": argparse.Namespace(a=1)}, path)
    run_seed(bench, cfg, run_cfg("er"), 0, CPU, checkpoint=Checkpoint(path, "fp", 1e9))
    out = capsys.readouterr().out
    assert "refused: it cannot be read (UnpicklingError: damaged, or not a checkpoint this project wrote)" in out
    assert "weights_only" not in out


def test_random_states_round_trip(tmp_path):
    import random

    import numpy as np
    ckpt = Checkpoint(tmp_path / "c.ckpt", "fp", 0.0)
    ckpt.save({"rng": global_rng_states(CPU)})
    draws = (random.random(), np.random.rand(), torch.rand(2))
    restore_global_rng_states(ckpt.load(print)["rng"], CPU)
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])


@pytest.mark.parametrize("stop", [10, 25])
def test_a_compiled_seed_resumes_with_the_same_steps_compiled(stop, seq, monkeypatch, tmp_path):
    """The loop's first EAGER_STEPS steps run eager even where the backbone is compiled: a seed resumed before
    or after that point must compile exactly the steps the uninterrupted seed compiled. The stand-in compiler
    here scales the features, so a step compiled on one side only would change the numbers."""
    from gcl.core import backbones
    from gcl.training.loop import EAGER_STEPS
    assert 10 < EAGER_STEPS < 25   # one stop before the eager steps end, one after
    monkeypatch.setattr(backbones, "compile_extractor", lambda fn, mode: lambda net, x: 1.5 * fn(net, x))
    backbones.compiled_extract.cache_clear()
    from gcl.training.compilation import compile_mode
    bench, cfg = seq
    run = run_cfg("er")
    compiled = compile_mode(True, CPU, METHODS["er"])
    try:
        plain = run_seed(bench, cfg, run, 0, CPU, compiled=compiled)
        eager = run_seed(bench, cfg, run, 0, CPU)
        assert plain.loss_curve != eager.loss_curve and plain.steps > 25   # the stand-in changes the numbers
        resumed, _ = interrupted_run(monkeypatch, tmp_path, bench, cfg, run, stop=stop, every=0.0, compiled=compiled)
    finally:
        backbones.compiled_extract.cache_clear()
    same_numbers(plain, resumed)
