"""Sequential benchmarks: task split, validation hold-out, stream schedule, transforms, and a real
seq-cifar10 run from tiny CIFAR-10 pickles through the source, the benchmark and the training loop."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torchvision.datasets import CIFAR10

from gcl.config import ParamsError, check_data
from gcl.data import sequential
from gcl.data.augment import Normalize, TrainAugment
from gcl.data.benchmarks import KINDS, BenchmarkError, build_benchmark, load_benchmark
from gcl.data.sequential import Sequential
from gcl.data.sources import load_source, prepare_source
from gcl.training.train import run_seed
from helpers import run_settings, synthetic_source
from image_fixtures import cifar_checksums, write_cifar10
from image_fixtures import labelled_source as source

CPU = torch.device("cpu")


def cfg(**kw):
    """A sequential benchmark's data settings: 5 tasks of 2 classes unless `kw` says otherwise."""
    return Sequential.Data(**{"source": "s", "n_tasks": 5, "classes_per_task": 2, **kw})


def test_tasks_hold_consecutive_labels_and_test_groups_are_tasks():
    src = source()
    bench = sequential.build_benchmark(src, cfg())
    assert bench["n_classes"] == 10 and bench["n_tasks"] == 5 and bench["classes_per_task"] == 2
    assert torch.equal(bench["train_task"], bench["train_y"] // 2)
    assert bench["train_y"].tolist() == sorted(bench["train_y"].tolist())          # grouped by class
    assert torch.equal(bench["train_x"][:, 0, 0, 0].long(), bench["train_y"])    # images stay with labels
    assert torch.equal(bench["test_group"], bench["test_y"] // 2)
    assert torch.equal(bench["test_x"], src["test_x"]) and bench["evaluated_on"] == "test"
    assert bench["group_names"][0] == "c0, c1" and len(bench["group_names"]) == 5
    assert bench["train_x"].dtype == torch.uint8 and bench["input_shape"] == [1, 8, 8]
    assert bench["mean"] is None


def test_fewer_tasks_use_the_first_classes_and_too_many_are_refused():
    bench = sequential.build_benchmark(source(), cfg(n_tasks=2, classes_per_task=3))
    assert set(bench["train_y"].tolist()) == set(range(6)) and set(bench["test_y"].tolist()) == set(range(6))
    with pytest.raises(sequential.SequentialConfigError, match="need 12 classes"):
        sequential.build_benchmark(source(), cfg(n_tasks=4, classes_per_task=3))
    with pytest.raises(ValidationError, match="n_tasks"):     # the settings refuse it before any build
        cfg(n_tasks=0)


def test_validation_fraction_holds_out_the_last_images_of_each_class():
    src = source(per_class=10)
    bench = sequential.build_benchmark(src, cfg(validation_fraction=0.2))
    assert bench["class_sizes"] == [8] * 10 and len(bench["test_y"]) == 20 and bench["evaluated_on"] == "validation"
    for c in range(10):
        idx = torch.nonzero(src["train_y"] == c).squeeze(1)   # source order of class c
        held = bench["test_x"][bench["test_y"] == c][:, 0, 0, 1]
        kept = bench["train_x"][bench["train_y"] == c][:, 0, 0, 1]
        assert held.tolist() == idx[8:].tolist() and kept.tolist() == idx[:8].tolist()


def test_stream_epochs_permute_each_task_and_eval_at_task_ends():
    bench = sequential.build_benchmark(source(per_class=12), cfg())
    stream = sequential.build_stream(bench, 3, 5, torch.Generator().manual_seed(0))
    # 24 images per task, batch 5: 5 batches per pass (5, 5, 5, 5, 4), 3 passes, 5 tasks
    sizes = np.diff(stream.bounds)
    assert stream.steps == 75 and sizes.tolist() == [5, 5, 5, 5, 4] * 15
    assert stream.task_ends == [14, 29, 44, 59, 74] and stream.eval_after == stream.task_ends
    task_of = stream.labels[stream.order] // 2
    for t in range(5):
        part = stream.order[t * 72:(t + 1) * 72]
        assert (task_of[t * 72:(t + 1) * 72] == t).all()
        passes = part.view(3, 24)
        assert all(sorted(p.tolist()) == sorted(passes[0].tolist()) for p in passes)   # each pass = the whole task
        assert not torch.equal(passes[0], passes[1])                                  # freshly shuffled
    assert torch.equal(stream.origin, torch.arange(len(bench["train_x"])))
    again = sequential.build_stream(bench, 3, 5, torch.Generator().manual_seed(0))
    other = sequential.build_stream(bench, 3, 5, torch.Generator().manual_seed(1))
    assert torch.equal(stream.order, again.order) and not torch.equal(stream.order, other.order)


def test_transforms_follow_the_source_statistics_and_the_augment_switch():
    bench = sequential.build_benchmark(source(channels=3, stats=True), cfg())
    train, test = sequential.transforms(bench, augment=True)
    assert isinstance(train, TrainAugment) and isinstance(test, Normalize) and train.padding == 4
    x = bench["test_x"][:4]
    assert torch.allclose(test(x), (x.float() / 255 - 0.5) / 0.25)
    plain = sequential.build_benchmark(source(), cfg())
    train, test = sequential.transforms(plain, augment=False)
    assert train is test and torch.equal(test(plain["test_x"]), plain["test_x"].float() / 255)


def test_params_accept_the_sequential_keys():
    assert {"n_tasks", "classes_per_task", "augment"} <= set(Sequential.model_fields)
    params = {"seeds": [0], "sources": {"mnist-bundled": {}}, "methods": {"sgd": {}},
              "benchmarks": {"seq-mnist": {"kind": "sequential", "source": "mnist-bundled", "backbone": "mlp",
                                           "epochs": 1, "n_tasks": 5, "classes_per_task": 2, "augment": False}},
              "runs": {"seq-mnist-sgd": {"benchmark": "seq-mnist", "method": "sgd", "buffer": "none",
                                         "lr": 0.1, "batch": 10}}}
    check_data(params)
    params["benchmarks"]["seq-mnist"]["n_tasks"] = "5"
    with pytest.raises(ParamsError, match="benchmarks.seq-mnist.n_tasks = '5' is not accepted: input should be a valid integer"):
        check_data(params)


def test_sequential_is_a_kind_with_tasks():
    assert KINDS["sequential"].has_tasks and not KINDS["mnist-360"].has_tasks


@pytest.mark.slow
def test_seq_cifar10_from_cifar_pickles_trains_and_scores_every_task(tmp_path, monkeypatch):
    """tiny CIFAR-10 pickles -> cifar10 source -> seq-cifar10 benchmark on disk -> ER with ResNet-18."""
    write_cifar10(tmp_path / "dl", train_per_class=2, test_per_class=1)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "dl" / "cifar-10-batches-py")
    raw = prepare_source("cifar10", {"download": False, "download_dir": str(tmp_path / "dl")}, tmp_path / "raw")
    settings = Sequential(kind="sequential", source="cifar10", backbone="resnet18", epochs=1, n_tasks=5,
                          classes_per_task=2)
    path = build_benchmark(settings.data(), load_source(raw), tmp_path / "bench")
    bench = load_benchmark(path, settings.data())
    assert bench["group_names"][0] == "airplane, automobile" and bench["input_shape"] == [3, 32, 32]
    with pytest.raises(BenchmarkError, match="was built with .* but params.yaml now says"):
        load_benchmark(path, settings.data().model_copy(update={"normalize": False}))   # a data setting changed
    torch.set_num_threads(1)
    r = run_seed(bench, settings.training(), run_settings("er", 8, lr=0.05, batch=4, replay_batch=4), 0, CPU)
    assert r.steps == 5 and r.samples == 20
    assert len(r.acc_matrix) == 5 and all(len(row) == 5 for row in r.acc_matrix)
    assert len(r.task_il_matrix) == 5
    for cil_row, til_row in zip(r.acc_matrix, r.task_il_matrix):
        assert all(t >= c for c, t in zip(cil_row, til_row))              # masking can only help
    assert r.task_il >= r.class_il and r.task_il is not None
    assert isinstance(r.forgetting, float)
    assert r.class_il == pytest.approx(sum(r.acc_matrix[-1]) / 5)


def test_both_kinds_hold_out_the_same_images_for_validation():
    """The validation split is made in one place (gcl.data.split) for MNIST-360 and the sequential kinds:
    the last round(n * fraction) training images of each class, in source order."""
    from gcl.data import mnist360
    src = synthetic_source(per_class=30, test_per_class=4)
    m360 = mnist360.build_benchmark(src, mnist360.Mnist360.Data(source="s", validation_fraction=0.2))
    seq = sequential.build_benchmark(src, cfg(validation_fraction=0.2))
    for j in range(9):
        kept = src["train_x"][src["train_y"] == j][:24]
        assert torch.equal(m360["train_x"][m360["train_y"] == j], kept)
        assert torch.equal(seq["train_x"][seq["train_y"] == j], kept)
    assert torch.equal(seq["test_x"][seq["test_y"] == 4], src["train_x"][src["train_y"] == 4][24:])
