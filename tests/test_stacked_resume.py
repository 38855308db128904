"""A stacked group stopped mid-stream and started again from its checkpoint ends with exactly the numbers of a
group that never stopped (CPU): every stackable method on the MLP, and on the augmented ResNet-18 across a task
boundary (each seed's augmentation generator resumes too)."""
import math

import pytest
import torch

from gcl.core.results import TIMINGS
from gcl.methods import METHODS
from gcl.training.checkpoint import Checkpoint
from gcl.training.progress import Progress
from gcl.training.train import train_stacked
from test_checkpoint import Stopped, stop_at
from test_stacked_resnet import RUNS as RESNET_RUNS
from test_stacked_resnet import tiny_cifar_like  # noqa: F401 (a fixture)
from test_stacking import RUNS as MLP_RUNS
from test_stacking import float64  # noqa: F401 (a fixture)

CPU = torch.device("cpu")
SEEDS = [0, 1, 2]


def interrupted_group(monkeypatch, tmp_path, bench, cfg, run, stop: int, every: float):
    """The group stopped at its `stop`-th stacked step, then trained again from its checkpoint; the results and the
    progress lines."""
    ckpt = Checkpoint(tmp_path / "group-0-1-2.ckpt", "fp", every)
    progress = Progress("cell", tmp_path / "train.log")
    with monkeypatch.context() as m:
        stop_at(m, METHODS[run.algorithm], stop)
        with pytest.raises(Stopped):
            train_stacked(bench, cfg, run, SEEDS, CPU, progress=progress, checkpoint=ckpt)
    assert ckpt.path.exists()
    results = train_stacked(bench, cfg, run, SEEDS, CPU, progress=progress, checkpoint=ckpt)
    return results, (tmp_path / "train.log").read_text()


def same_numbers(a: dict, b: dict) -> None:
    for seed in SEEDS:
        x, y = a[seed].to_json(), b[seed].to_json()
        assert set(x) == set(y)
        for key in x:
            if key not in TIMINGS:
                assert x[key] == y[key], (seed, key)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["sgd", "joint", "er", "er-ace", "agem", "der", "derpp", "clser", "coca"])
def test_a_stopped_stacked_group_resumes_to_the_same_numbers(key, tiny_mnist360, monkeypatch, tmp_path):
    """A checkpoint after every step (MNIST-360 has no task ends), the stream stopped at a third, the buffer full."""
    bench, cfg = tiny_mnist360
    run = MLP_RUNS[key]
    whole = train_stacked(bench, cfg, run, SEEDS, CPU)
    steps = whole[0].steps
    stop = steps // 3
    resumed, log = interrupted_group(monkeypatch, tmp_path, bench, cfg, run, stop=stop, every=0.0)
    same_numbers(whole, resumed)
    assert f"seeds {SEEDS} resumed from {tmp_path / 'group-0-1-2.ckpt'} at step {stop} of {steps}" in log


@pytest.mark.slow
@pytest.mark.parametrize("key", ["er", "coca"])
def test_a_stacked_resnet_group_resumes_from_its_last_task_end(key, tiny_cifar_like, monkeypatch, tmp_path):
    """Checkpoints only at task ends: stopped in the second task, the group goes back to the first task's end and
    trains the second again, drawing the same crops and flips, buffer slots and (CoCa) transformations."""
    bench, cfg = tiny_cifar_like
    run = RESNET_RUNS[key]
    whole = train_stacked(bench, cfg, run, SEEDS, CPU)
    steps = whole[0].steps
    resumed, log = interrupted_group(monkeypatch, tmp_path, bench, cfg, run, stop=steps - 1, every=math.inf)
    same_numbers(whole, resumed)
    assert f"at step {steps // 2} of {steps}" in log


def test_a_group_checkpoint_of_other_seeds_is_refused(tiny_mnist360, monkeypatch, tmp_path):
    """A checkpoint with another fingerprint (other seeds, settings or code) is named, deleted, and the group
    starts from the beginning: the numbers of a group that never stopped."""
    bench, cfg = tiny_mnist360
    run = MLP_RUNS["er"]
    whole = train_stacked(bench, cfg, run, SEEDS, CPU)
    path = tmp_path / "group-0-1-2.ckpt"
    with monkeypatch.context() as m:
        stop_at(m, METHODS["er"], 5)
        with pytest.raises(Stopped):
            train_stacked(bench, cfg, run, SEEDS, CPU, checkpoint=Checkpoint(path, "other-seeds", 0.0, "group"))
    progress = Progress("cell", tmp_path / "train.log")
    again = train_stacked(bench, cfg, run, SEEDS, CPU, progress=progress,
                          checkpoint=Checkpoint(path, "these-seeds", math.inf, "group"))
    same_numbers(whole, again)
    log = (tmp_path / "train.log").read_text()
    assert "fingerprint other-seeds, this group's is these-seeds); it is deleted and the group starts from the " \
        "beginning" in log and "resumed" not in log
