"""The training loop: determinism, boundaries hidden from general-continual methods, metrics shape."""
import pytest
import torch
import torch.nn.functional as F

from gcl.methods.base import METHODS, Method, register
from gcl.training.train import run_seed

CPU = torch.device("cpu")


def er_cfg(**kw):
    cfg = {"benchmark": "mnist-360", "method": "er", "algorithm": "er", "buffer": 50, "lr": 0.1,
           "batch": 4, "replay_batch": 8}
    cfg.update(kw)
    return cfg


def test_same_seed_same_numbers(tiny_mnist360):
    bench, cfg = tiny_mnist360
    a = run_seed(bench, cfg, er_cfg(), 0, CPU)
    b = run_seed(bench, cfg, er_cfg(), 0, CPU)
    c = run_seed(bench, cfg, er_cfg(), 1, CPU)
    assert a.acc_matrix == b.acc_matrix and a.loss_curve == b.loss_curve
    assert a.loss_curve != c.loss_curve


def test_metrics_shape_on_mnist360(tiny_mnist360):
    bench, cfg = tiny_mnist360
    r = run_seed(bench, cfg, er_cfg(), 0, CPU)
    assert len(r.acc_matrix) == 27 and all(len(row) == 9 for row in r.acc_matrix)
    assert r.task_il is None and r.task_il_matrix is None
    assert 0.0 <= r.class_il <= 100.0 and r.class_il == r.curve[-1]
    assert 0 < r.samples <= sum(bench["class_sizes"])
    assert r.train_seconds > 0 and r.samples_per_second > 0
    assert len(r.loss_curve) == 27


def test_a_seed_records_the_environment_it_was_computed_in(tiny_mnist360):
    bench, cfg = tiny_mnist360
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = run_seed(bench, cfg, er_cfg(), 0, CPU).environment
    finally:
        torch.set_num_threads(threads)
    assert env["torch"] == torch.__version__ and env["threads"] == 1 and env["precision"] == "fp32"
    assert isinstance(env["device"], str) and env["device"]


def test_er_learns_the_synthetic_digits(tiny_mnist360):
    bench, cfg = tiny_mnist360
    sgd = run_seed(bench, cfg, {**er_cfg(), "method": "sgd", "algorithm": "sgd", "buffer": "none"}, 0, CPU)
    er = run_seed(bench, cfg, er_cfg(buffer=100), 0, CPU)
    assert er.class_il > sgd.class_il


def test_general_continual_methods_are_never_told_boundaries(tiny_mnist360):
    calls = []

    @register
    class Spy(Method):
        name = "test-spy"
        needs_boundaries = False

        def observe(self, x, y, x_raw):
            calls.append("observe")
            return self.sgd_step(F.cross_entropy(self.net(x), y))

        def begin_task(self, task):
            calls.append("begin")

        def end_task(self, task):
            calls.append("end")

    try:
        bench, cfg = tiny_mnist360
        run_seed(bench, cfg, {**er_cfg(), "method": "test-spy", "algorithm": "test-spy", "buffer": "none"}, 0, CPU)
        assert calls and set(calls) == {"observe"}
    finally:
        del METHODS["test-spy"]


def test_joint_is_evaluated_once_after_training_on_everything(tiny_mnist360):
    bench, cfg = tiny_mnist360
    r = run_seed(bench, cfg, {**er_cfg(), "method": "joint", "algorithm": "joint", "buffer": "none"}, 0, CPU)
    assert len(r.acc_matrix) == 1 and r.forgetting is None
    sgd = run_seed(bench, cfg, {**er_cfg(), "method": "sgd", "algorithm": "sgd", "buffer": "none"}, 0, CPU)
    assert r.class_il > sgd.class_il


def test_joint_sees_each_image_once_and_makes_its_own_epochs(monkeypatch):
    from helpers import synthetic_source

    from gcl.data import sequential
    from gcl.methods.joint import Joint

    cfg = {"kind": "sequential", "source": "synthetic", "backbone": "mlp", "epochs": 3, "n_tasks": 5,
           "classes_per_task": 2, "augment": False}
    bench = sequential.build_benchmark(synthetic_source(per_class=20), cfg)
    seen, steps = [], []
    original_observe, original_step = Joint.observe, Joint.sgd_step
    monkeypatch.setattr(Joint, "observe",
                        lambda self, x, y, x_raw: (seen.append(len(y)), original_observe(self, x, y, x_raw))[1])
    monkeypatch.setattr(Joint, "sgd_step", lambda self, loss: (steps.append(1), original_step(self, loss))[1])
    r = run_seed(bench, cfg, {"method": "joint", "algorithm": "joint", "buffer": "none", "lr": 0.1, "batch": 10},
                 0, CPU)
    assert sum(seen) == 200                      # the stream shown once, not once per epoch
    assert len(steps) == 3 * 200 // 10          # three epochs of its own over the 200 images
    assert r.task_il is not None and len(r.acc_matrix) == 1


@pytest.mark.parametrize("method", ["er", "coca", "gss"])
def test_a_bf16_run_learns(method, tiny_mnist360):
    """bf16 autocast is entered per step: one context around the whole stream kept training on autocast's cached
    bf16 copies of the initial weights, and every method ended at chance. CoCa's label propagation and GSS's
    per-sample gradients run in fp32 inside it."""
    bench, cfg = tiny_mnist360
    fields = METHODS[method].Settings.model_fields
    given = {k: v for k, v in {**er_cfg(), "gss_minibatch": 8}.items() if k in fields}
    run = {**METHODS[method].Settings.model_validate(given).model_dump(), **er_cfg(method=method, algorithm=method)}
    fp32 = run_seed(bench, cfg, run, 0, CPU)
    bf16 = run_seed(bench, {**cfg, "bf16": True}, run, 0, CPU)
    chance = 100.0 / 9
    assert fp32.class_il > 2.5 * chance and bf16.class_il > 2.5 * chance
    assert abs(bf16.class_il - fp32.class_il) < 10
