"""LwF, online EWC and SI: hand-computed Fisher, path integral and distillation on tiny networks, the boundary
calls of the training loop, checkpoints of the cross-task state, and learning on a small sequential benchmark."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gcl.core.backbones import MLP
from gcl.data import sequential
from gcl.data.transforms import to_unit_float
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import Method, TaskData, register
from gcl.methods.lwf import lwf_distillation, lwf_loss
from gcl.methods.oewc import diagonal_fisher
from gcl.training.train import run_seed
from helpers import run_settings, sequential_settings, synthetic_source

CPU = torch.device("cpu")


class TwoParam(nn.Module):
    """logits = [w * x + b, 0] for a scalar input x: two parameters, every gradient by hand."""

    def __init__(self, w: float, b: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor(b, dtype=torch.float64))

    def forward(self, x):
        z = self.w * x[:, 0] + self.b
        return torch.stack([z, torch.zeros_like(z)], 1)


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def loglik_grad(w, b, x, y):
    """d log p(y | x) / d(w, b) for logits [w x + b, 0]: p(0 | x) = sigmoid(z)."""
    dz = (1.0 - sigmoid(w * x + b)) if y == 0 else -sigmoid(w * x + b)
    return dz * x, dz


def make(name, net=None, n_classes=2, transform=None, **cfg):
    net = net if net is not None else MLP((1, 28, 28), n_classes)
    ctx = MethodContext(device=CPU, n_classes=n_classes, generator=torch.Generator().manual_seed(0),
                        train_transform=transform or (lambda x: x), plain_transform=transform or (lambda x: x))
    return METHODS[name](net, run_settings(name, **cfg), ctx)     # validated, with the declared defaults


def task(index, x, y, classes):
    return TaskData(index=index, x_raw=x, y=y, classes=classes)


# --- online EWC ------------------------------------------------------------------------------------

X3 = torch.tensor([[1.0], [2.0], [-1.0]], dtype=torch.float64)
Y3 = torch.tensor([0, 1, 0])


def hand_fisher(w, b, xs, ys):
    grads = [loglik_grad(w, b, x, y) for x, y in zip(xs, ys)]
    return [sum(g[0] ** 2 for g in grads) / len(grads), sum(g[1] ** 2 for g in grads) / len(grads)]


def test_fisher_is_the_mean_of_squared_per_sample_gradients():
    net = TwoParam(0.5, -0.25)
    fw, fb = diagonal_fisher(net, X3, Y3, chunk=2)   # chunks of 2 and 1: chunking changes nothing
    ew, eb = hand_fisher(0.5, -0.25, [1.0, 2.0, -1.0], [0, 1, 0])
    assert fw.item() == pytest.approx(ew, rel=1e-12) and fb.item() == pytest.approx(eb, rel=1e-12)


def test_fisher_of_a_batchnorm_network_equals_a_per_sample_loop_in_eval_mode():
    """vmap'd per-sample gradients through conv + BatchNorm (running statistics) = one backward per image."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))
    net[1].running_mean.uniform_(-0.5, 0.5)
    net[1].running_var.uniform_(0.5, 2.0)
    net.eval()
    x, y = torch.randn(5, 2, 6, 6), torch.tensor([0, 3, 1, 1, 2])
    stats = {k: v.clone() for k, v in net.state_dict().items()}
    fisher = diagonal_fisher(net, x, y, chunk=2)
    loop = [torch.zeros_like(p) for p in net.parameters()]
    for i in range(5):
        grads = torch.autograd.grad(-F.cross_entropy(net(x[i:i + 1]), y[i:i + 1]), list(net.parameters()))
        for acc, g in zip(loop, grads):
            acc += g ** 2 / 5
    assert all(torch.allclose(f, g, rtol=1e-5, atol=1e-8) for f, g in zip(fisher, loop))
    assert all(torch.equal(v, stats[k]) for k, v in net.state_dict().items())   # running statistics untouched


def test_oewc_folds_each_tasks_fisher_into_a_running_one():
    m = make("oewc", TwoParam(0.5, -0.25), lr=0.1, batch=3, e_lambda=2.0, gamma=0.7, fisher_batch=64)
    m.end_task(task(0, X3, Y3, (0, 2)))
    f1 = hand_fisher(0.5, -0.25, [1.0, 2.0, -1.0], [0, 1, 0])
    assert [f.item() for f in m.fisher] == pytest.approx(f1, rel=1e-12)
    with torch.no_grad():                       # the network moves during the second task
        m.net.w.fill_(-0.3)
        m.net.b.fill_(0.4)
    x2, y2 = torch.tensor([[0.5], [3.0]], dtype=torch.float64), torch.tensor([1, 1])
    m.end_task(task(1, x2, y2, (0, 2)))
    f2 = hand_fisher(-0.3, 0.4, [0.5, 3.0], [1, 1])
    assert [f.item() for f in m.fisher] == pytest.approx([0.7 * a + b for a, b in zip(f1, f2)], rel=1e-12)
    assert [c.item() for c in m.checkpoint] == [-0.3, 0.4]   # theta* = the parameters at the task's end
    with torch.no_grad():
        m.net.w.fill_(0.2)
        m.net.b.fill_(0.0)
    expected = 2.0 * ((0.7 * f1[0] + f2[0]) * 0.5 ** 2 + (0.7 * f1[1] + f2[1]) * 0.4 ** 2)
    assert m.penalty().item() == pytest.approx(expected, rel=1e-12)


def test_oewc_fisher_is_measured_in_eval_mode_and_leaves_the_mode_as_it_was():
    class ModeSpy(TwoParam):
        seen = []

        def forward(self, x):
            ModeSpy.seen.append(self.training)
            return super().forward(x)

    m = make("oewc", ModeSpy(0.5, -0.25), lr=0.1, batch=3, e_lambda=1.0)
    m.net.train()
    m.end_task(task(0, X3, Y3, (0, 2)))
    assert ModeSpy.seen and not any(ModeSpy.seen) and m.net.training


def test_oewc_step_follows_the_gradient_of_ce_plus_penalty():
    torch.manual_seed(0)
    m = make("oewc", lr=0.1, batch=8, e_lambda=3.0, gamma=1.0, transform=to_unit_float, n_classes=4)
    src = synthetic_source(per_class=8, classes=4)
    x_raw, y = src["train_x"], src["train_y"]
    m.begin_task(task(0, x_raw[:16], y[:16], (0, 2)))
    m.observe(to_unit_float(x_raw[:8]), y[:8], x_raw[:8])
    m.end_task(task(0, x_raw[:16], y[:16], (0, 2)))
    m.begin_task(task(1, x_raw[16:], y[16:], (2, 4)))
    for i in (16, 24):   # the first step has theta = theta* (zero penalty gradient); the second does not
        xb = to_unit_float(x_raw[i:i + 8])
        expected = F.cross_entropy(m.net(xb), y[i:i + 8]) + m.penalty()
        grads = torch.autograd.grad(expected, m.params)
        target = [p.detach() - 0.1 * g for p, g in zip(m.params, grads)]
        loss = m.observe(xb, y[i:i + 8], x_raw[i:i + 8])
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        assert all(torch.allclose(p, t, atol=1e-6) for p, t in zip(m.params, target))
    assert m.penalty().item() > 0


# --- SI ----------------------------------------------------------------------------------------------

def ce_grad(w, b, x, y):
    """d CE / d(w, b) for one sample, = -d log p(y | x)."""
    gw, gb = loglik_grad(w, b, x, y)
    return -gw, -gb


def test_si_path_integral_importance_and_penalty_match_hand_computation():
    lr, c, xi = 0.5, 0.3, 0.1
    m = make("si", TwoParam(0.5, -0.25), lr=lr, batch=1, c=c, xi=xi, clip=0.0)
    theta0 = (0.5, -0.25)
    batches = [(torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([1])),
               (torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([0]))]
    w, b = theta0
    omega = [0.0, 0.0]
    m.begin_task(task(0, X3, Y3, (0, 2)))
    for xb, yb in batches:
        gw, gb = ce_grad(w, b, xb.item(), yb.item())
        dw, db = -lr * gw, -lr * gb
        omega = [omega[0] - gw * dw, omega[1] - gb * db]
        w, b = w + dw, b + db
        m.observe(xb, yb, xb)
    assert [m.net.w.item(), m.net.b.item()] == pytest.approx([w, b], rel=1e-12)
    assert [o.item() for o in m.omega] == pytest.approx(omega, rel=1e-12)
    m.end_task(task(0, X3, Y3, (0, 2)))
    big = [omega[0] / ((w - theta0[0]) ** 2 + xi), omega[1] / ((b - theta0[1]) ** 2 + xi)]
    assert [o.item() for o in m.big_omega] == pytest.approx(big, rel=1e-12)
    assert [o.item() for o in m.omega] == [0.0, 0.0] and [t.item() for t in m.checkpoint] == pytest.approx([w, b])
    # a step of the second task: the update uses CE + penalty, omega only the CE's gradient
    xb, yb = torch.tensor([[1.0]], dtype=torch.float64), torch.tensor([1])
    with torch.no_grad():
        m.net.w.add_(0.2)            # away from theta* so that the penalty pulls
    w2 = w + 0.2
    assert m.penalty().item() == pytest.approx(c * big[0] * 0.2 ** 2, rel=1e-12)
    gw, gb = ce_grad(w2, b, 1.0, 1)
    aw, ab = gw + 2 * c * big[0] * 0.2, gb
    loss = m.observe(xb, yb, xb)
    assert loss.item() == pytest.approx(-math.log(1 - sigmoid(w2 + b)) + c * big[0] * 0.2 ** 2, rel=1e-12)
    assert [m.net.w.item(), m.net.b.item()] == pytest.approx([w2 - lr * aw, b - lr * ab], rel=1e-12)
    assert [o.item() for o in m.omega] == pytest.approx([lr * gw * aw, lr * gb * ab], rel=1e-12)


def test_si_clips_the_applied_gradient_elementwise():
    m = make("si", TwoParam(3.0, 0.0), lr=1.0, batch=1, c=0.0, xi=1.0, clip=0.05)
    xb, yb = torch.tensor([[10.0]], dtype=torch.float64), torch.tensor([1])
    gw, gb = ce_grad(3.0, 0.0, 10.0, 1)       # |gw| ~ 10, |gb| ~ 1: both clipped to 0.05
    m.observe(xb, yb, xb)
    assert [m.net.w.item(), m.net.b.item()] == pytest.approx([3.0 - 0.05, -0.05])
    assert [o.item() for o in m.omega] == pytest.approx([gw * 0.05, gb * 0.05])   # -g_task * delta_theta


# --- LwF ---------------------------------------------------------------------------------------------

def softmax(v):
    e = [math.exp(a - max(v)) for a in v]
    return [a / sum(e) for a in e]


def test_lwf_loss_matches_hand_computation():
    logits = torch.tensor([[1.0, -0.5, 2.0, 0.0], [0.3, 0.8, -1.0, 0.5]])
    old = torch.tensor([[2.0, 0.0, 5.0, 5.0], [-1.0, 1.0, 0.0, 0.0]])
    y = torch.tensor([2, 3])
    alpha, temp = 1.5, 2.0
    ce = sum(-math.log(softmax(r)[k]) for r, k in zip(logits.tolist(), y.tolist())) / 2
    kd = 0.0
    for r, o in zip(logits.tolist(), old.tolist()):
        target, new = softmax([a / temp for a in o[:2]]), softmax([a / temp for a in r[:2]])
        kd -= sum(t * math.log(n) for t, n in zip(target, new)) / 2
    got = lwf_loss(logits, y, old, seen=4, old=2, alpha=alpha, temp=temp)
    assert got.item() == pytest.approx(ce + alpha * kd, rel=1e-6)
    # CE over the classes seen so far only: class 3's logit is left out when seen = 3
    ce3 = sum(-math.log(softmax(r[:3])[k]) for r, k in zip(logits.tolist(), [2, 1])) / 2
    assert lwf_loss(logits, torch.tensor([2, 1]), None, 3, 0, alpha, temp).item() == pytest.approx(ce3, rel=1e-6)


def test_lwf_distillation_is_the_papers_softened_probabilities_and_stays_finite():
    """Eq. 4 of LwF softens probabilities, y^(1/T) / sum y^(1/T); that is softmax(z / T), which the code
    computes in log space: where the literal form takes log(0) (NaN) the code's value is finite."""
    new, old, temp = torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([[1.0, 0.2, -0.7]]), 2.0
    soften = lambda p: p ** (1 / temp) / (p ** (1 / temp)).sum(1, keepdim=True)
    literal = -(soften(F.softmax(old, 1)) * torch.log(soften(F.softmax(new, 1)))).sum(1).mean()
    assert lwf_distillation(new, old, temp).item() == pytest.approx(literal.item(), rel=1e-6)
    new, old = torch.tensor([[0.0, -400.0]]), torch.tensor([[0.0, -400.0]])
    literal = -(soften(F.softmax(old, 1)) * torch.log(soften(F.softmax(new, 1)))).sum(1).mean()
    assert torch.isnan(literal)
    assert lwf_distillation(new, old, temp).item() == pytest.approx(0.0, abs=1e-6)


def lwf_setup(**cfg):
    torch.manual_seed(0)
    settings = dict(lr=0.1, batch=8, alpha=1.0, softmax_temp=2.0, wd_reg=0.01, warmup_epochs=1)
    settings.update(cfg)
    m = make("lwf", transform=to_unit_float, n_classes=4, **settings)
    src = synthetic_source(per_class=8, classes=4)
    return m, src["train_x"], src["train_y"]


def test_lwf_old_network_is_frozen_and_the_step_follows_the_full_loss():
    m, x_raw, y = lwf_setup()
    m.begin_task(task(0, x_raw[:16], y[:16], (0, 2)))
    for i in (0, 8):
        m.observe(to_unit_float(x_raw[i:i + 8]), y[i:i + 8], x_raw[i:i + 8])
    m.end_task(task(0, x_raw[:16], y[:16], (0, 2)))
    before = copy.deepcopy(m.net.state_dict())
    m.begin_task(task(1, x_raw[16:], y[16:], (2, 4)))
    snapshot = copy.deepcopy(m.old_net.state_dict())
    assert all(torch.equal(snapshot[k], before[k]) for k in before)          # the network at the task's start
    after = m.net.state_dict()   # the warm-up moved the new classes' head rows only
    for k in before:
        if k.startswith("classifier"):
            assert torch.equal(after[k][:2], before[k][:2]) and not torch.equal(after[k][2:], before[k][2:])
        else:
            assert torch.equal(after[k], before[k])
    for i in (16, 24, 16, 24):
        xb, yb = to_unit_float(x_raw[i:i + 8]), y[i:i + 8]
        with torch.no_grad():
            old_logits = m.old_net(xb)
        expected = (lwf_loss(m.net(xb), yb, old_logits, 4, 2, 1.0, 2.0)
                    + 0.01 * sum(p.pow(2).sum() for p in m.net.parameters()))
        grads = torch.autograd.grad(expected, m.params)
        target = [p.detach() - 0.1 * g for p, g in zip(m.params, grads)]
        loss = m.observe(xb, yb, x_raw[i:i + 8])
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        assert all(torch.allclose(p, t, atol=1e-6) for p, t in zip(m.params, target))
    assert all(not p.requires_grad and p.grad is None for p in m.old_net.parameters())
    assert all(torch.equal(v, snapshot[k]) for k, v in m.old_net.state_dict().items())
    assert not m.old_net.training
    assert not torch.equal(m.net.state_dict()["body.1.weight"], snapshot["body.1.weight"])


# --- the loop's boundary calls -----------------------------------------------------------------------

def test_boundary_methods_get_begin_and_end_of_each_task_in_order():
    calls = []

    @register
    class Recorder(Method):
        name = "test-recorder"
        needs_boundaries = True

        def observe(self, x, y, x_raw):
            calls.append(("observe", y.clone()))
            return self.sgd_step(F.cross_entropy(self.net(x), y))

        def begin_task(self, t):
            calls.append(("begin", t.index, t.classes, t.x_raw.clone(), t.y.clone()))

        def end_task(self, t):
            calls.append(("end", t.index, t.classes, t.x_raw.clone(), t.y.clone()))

    settings = sequential_settings(epochs=2, augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=12), settings.data())
    try:
        run_seed(bench, settings.training(), run_settings("test-recorder", lr=0.1, batch=5), 0, CPU)
    finally:
        del METHODS["test-recorder"]
    kinds = [c[0] for c in calls]
    boundary = [(c[0], c[1]) for c in calls if c[0] != "observe"]
    assert boundary == [(k, t) for t in range(5) for k in ("begin", "end")]
    assert kinds[0] == "begin" and kinds[-1] == "end"
    rows = lambda x: torch.unique(x.flatten(1), dim=0)
    for t in range(5):
        begin = kinds.index("begin", 0) if t == 0 else [i for i, c in enumerate(calls) if c[:2] == ("begin", t)][0]
        end = [i for i, c in enumerate(calls) if c[:2] == ("end", t)][0]
        mine = bench["train_task"] == t
        for c in (calls[begin], calls[end]):
            assert c[2] == (2 * t, 2 * t + 2)
            assert torch.equal(rows(c[3]), rows(bench["train_x"][mine]))            # that task's images
            assert torch.equal(torch.sort(c[4]).values, torch.sort(bench["train_y"][mine]).values)
        seen = torch.cat([c[1] for c in calls[begin + 1:end]])
        assert len(seen) == 2 * int(mine.sum())                                     # both epochs inside
        assert bool(((seen >= 2 * t) & (seen < 2 * t + 2)).all())
        assert all(c[0] == "observe" for c in calls[begin + 1:end])


# --- checkpoints ---------------------------------------------------------------------------------------

SETTINGS = {
    "oewc": dict(lr=0.1, batch=8, e_lambda=5.0, gamma=0.9, fisher_batch=7),
    "si": dict(lr=0.1, batch=8, c=0.5, xi=1.0, clip=1.0),
    "lwf": dict(lr=0.1, batch=8, alpha=1.0, softmax_temp=2.0, wd_reg=0.001, warmup_epochs=1),
}


def two_tasks(name):
    torch.manual_seed(0)
    m = make(name, transform=to_unit_float, n_classes=6, **SETTINGS[name])
    src = synthetic_source(per_class=8, classes=6)
    x_raw, y = src["train_x"], src["train_y"]
    for t in range(2):
        part = slice(16 * t, 16 * t + 16)
        m.begin_task(task(t, x_raw[part], y[part], (2 * t, 2 * t + 2)))
        for i in (16 * t, 16 * t + 8):
            m.observe(to_unit_float(x_raw[i:i + 8]), y[i:i + 8], x_raw[i:i + 8])
        m.end_task(task(t, x_raw[part], y[part], (2 * t, 2 * t + 2)))
    m.begin_task(task(2, x_raw[32:], y[32:], (4, 6)))
    m.observe(to_unit_float(x_raw[40:48]), y[40:48], x_raw[40:48])   # away from theta*: a non-zero penalty
    return m, to_unit_float(x_raw[32:40]), y[32:40], x_raw[32:40]


def flat_tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flat_tensors(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    return []


@pytest.mark.parametrize("name", ["oewc", "si", "lwf"])
def test_state_dict_round_trips_the_cross_task_state(name):
    m, xb, yb, xb_raw = two_tasks(name)
    state = m.state_dict()
    torch.manual_seed(123)
    fresh = make(name, transform=to_unit_float, n_classes=6, **SETTINGS[name])
    fresh.load_state_dict(state)
    again = fresh.state_dict()
    assert set(again) == set(state) == {"net", *m.state_attrs}
    for key in state:
        a, b = flat_tensors(state[key]), flat_tensors(again[key])
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    if name == "lwf":
        assert fresh.old_classes == m.old_classes == 4 and fresh.classes == m.classes == (4, 6)
        with torch.no_grad():
            assert torch.equal(fresh.old_net(xb), m.old_net(xb))
    else:
        assert m.penalty().item() > 0 and fresh.penalty().item() == m.penalty().item()
    # the restored method takes the same next step
    assert fresh.observe(xb, yb, xb_raw).item() == m.observe(xb, yb, xb_raw).item()
    assert all(torch.equal(p, q) for p, q in zip(fresh.params, m.params))


def test_boundary_methods_are_refused_on_mnist360():
    from gcl.config import ParamsError, resolve_run
    mlp = {"source": "bundled", "backbone": "mlp", "epochs": 1}
    settings = {"lwf": {"alpha": 1.0}, "oewc": {"e_lambda": 10.0, "gamma": 1.0}, "si": {"c": 0.5, "xi": 1.0}}
    params = {"seeds": [0], "sources": {"bundled": {}}, "methods": {name: {} for name in settings},
              "benchmarks": {"m360": {"kind": "mnist-360", **mlp},
                             "seq": {"kind": "sequential", "n_tasks": 5, "classes_per_task": 2, **mlp}},
              "runs": {f"{b}-{name}": {"benchmark": b, "method": name, "buffer": "none", "lr": 0.1, "batch": 10, **kw}
                       for name, kw in settings.items() for b in ("m360", "seq")}}
    for name in settings:
        with pytest.raises(ParamsError, match="needs task boundaries"):
            resolve_run(params, f"m360-{name}")
        assert resolve_run(params, f"seq-{name}").run.algorithm == name


# --- learning ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, extra", [("oewc", dict(e_lambda=10.0, gamma=1.0)), ("si", dict(c=0.5, xi=1.0)),
                                         ("lwf", dict(alpha=1.0, softmax_temp=2.0))])
def test_each_method_learns_a_small_sequential_benchmark(name, extra):
    settings = sequential_settings(augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=40), settings.data())
    r = run_seed(bench, settings.training(), run_settings(name, lr=0.1, batch=10, **extra), 0, CPU)
    assert r.task_il > 85.0                      # chance: 50
    assert len(r.acc_matrix) == 5 and r.class_il > 10.0
