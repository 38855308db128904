"""CLS-ER: the memories' moving averages and their random schedule by hand, the per-sample choice of memory,
the loss against a hand computation, the evaluated network, the state round trip, and a checkpoint resume
that ends with the numbers of an uninterrupted seed."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gcl.methods.clser as clser_module
from gcl.methods.base import METHODS, MethodContext
from gcl.methods.clser import memory_targets
from gcl.training.train import run_seed
from helpers import run_settings

CPU = torch.device("cpu")
N_CLASSES = 4


class TinyNet(nn.Module):
    """A backbone in the project's shape (features + classifier), small enough to follow by hand;
    with `norm`, a BatchNorm layer (running statistics, train/eval behaviour)."""

    def __init__(self, d_in: int = 6, hidden: int = 5, n_classes: int = N_CLASSES, norm: bool = False):
        super().__init__()
        self.feat_dim = hidden
        layers = [nn.Linear(d_in, hidden)] + ([nn.BatchNorm1d(hidden)] if norm else []) + [nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(hidden, n_classes)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.classifier(self.features(x))


def settings(buffer: int = 20, **cfg):
    return run_settings("clser", buffer, **{"lr": 0.1, "batch": 4, "replay_batch": 3, **cfg})


def make(seed: int = 0, norm: bool = False, **cfg):
    torch.manual_seed(seed)
    net = TinyNet(norm=norm)
    ctx = MethodContext(device=CPU, n_classes=N_CLASSES, train_transform=lambda x: x.float() / 255,
                        generator=torch.Generator().manual_seed(seed))
    return METHODS["clser"](net, settings(**cfg), ctx)


def batch(seed: int, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    x_raw = torch.randint(0, 256, (n, 6), generator=g, dtype=torch.uint8)
    return x_raw.float() / 255, torch.randint(0, N_CLASSES, (n,), generator=g), x_raw


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def force(monkeypatch, method, plastic: float, stable: float):
    """Fix the method's two draws of every step."""
    monkeypatch.setattr(clser_module, "memory_draws", lambda generator: (plastic, stable))


# ---------------------------------------------------------------- the memories' moving averages


def test_the_memories_start_as_copies_of_the_network_outside_its_parameters():
    m = make()
    for memory in (m.plastic, m.stable):
        assert memory is not m.net and all(torch.equal(a, b) for a, b in zip(params(memory), params(m.net)))
        assert all(not p.requires_grad for p in memory.parameters())
        assert not ({id(p) for p in memory.parameters()} & {id(p) for p in m.params})


def test_first_step_updates_with_the_warm_up_decay_one_half(monkeypatch):
    """Step 1: a = min(1 - 1/2, 0.999) = 0.5. Forced draws: the plastic memory updates (0.3 < 0.9), the stable
    one does not (0.8 >= 0.7); the update follows the SGD step, so it averages in the updated network."""
    m = make()
    force(monkeypatch, m, plastic=0.3, stable=0.8)
    before = params(m.net)
    m.observe(*batch(1))
    after = params(m.net)
    assert m.global_step == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    for p, b, a in zip(m.plastic.parameters(), before, after):
        assert torch.allclose(p, 0.5 * b + 0.5 * a, atol=1e-7, rtol=0)
    for p, b in zip(m.stable.parameters(), before):
        assert torch.equal(p, b)


def test_the_decisions_compare_each_draw_with_its_frequency(monkeypatch):
    m = make(plastic_update_freq=0.5, stable_update_freq=0.5)
    force(monkeypatch, m, plastic=0.5, stable=0.4999)     # strictly below updates: the stable one only
    before = params(m.net)
    m.observe(*batch(1))
    assert all(torch.equal(p, b) for p, b in zip(m.plastic.parameters(), before))
    assert any(not torch.equal(p, b) for p, b in zip(m.stable.parameters(), before))


@pytest.mark.parametrize("freq, updated", [(1.0, True), (0.0, False)])
def test_frequency_one_always_and_zero_never_updates(freq, updated):
    m = make(plastic_update_freq=freq, stable_update_freq=freq)
    init = params(m.net)
    for step in range(5):
        m.observe(*batch(step))
    for memory in (m.plastic, m.stable):
        assert any(not torch.equal(p, b) for p, b in zip(memory.parameters(), init)) == updated


@pytest.mark.parametrize("step, alpha, expected", [(1, 0.999, 0.5), (3, 0.999, 0.75), (3, 0.6, 0.6),
                                                   (999, 0.999, 0.999), (10, 0.0, 0.0)])
def test_the_decay_is_capped_by_the_step(step, alpha, expected):
    """a = min(1 - 1/(t + 1), alpha) with t the steps taken; memory <- a * memory + (1 - a) * net."""
    m = make()
    with torch.no_grad():
        for p in m.stable.parameters():
            p.uniform_(-1, 1)
    memory, net, plastic = params(m.stable), params(m.net), params(m.plastic)
    m.global_step = step
    m.update_memory(m.stable, alpha, [True])
    for p, old, w in zip(m.stable.parameters(), memory, net):
        assert torch.allclose(p, expected * old + (1 - expected) * w, atol=1e-6, rtol=0)
    assert all(torch.equal(p, b) for p, b in zip(m.plastic.parameters(), plastic))
    assert all(torch.equal(p, b) for p, b in zip(m.net.parameters(), net))


def test_a_memory_averages_every_update_by_hand_over_several_steps(monkeypatch):
    """Four steps with forced draws (plastic: update, skip, update, update): the plastic memory follows the
    recurrence with a_t = min(1 - 1/(t+1), 0.6) at the steps that update, and the network after that step."""
    m = make(plastic_alpha=0.6)
    draws = iter([(0.1, 0.9), (0.95, 0.9), (0.2, 0.9), (0.3, 0.9)])
    monkeypatch.setattr(clser_module, "memory_draws", lambda generator: next(draws))
    expected = params(m.net)
    for t, update in zip(range(1, 5), (True, False, True, True)):
        m.observe(*batch(t))
        if update:
            a = min(1 - 1 / (t + 1), 0.6)
            expected = [a * e + (1 - a) * w for e, w in zip(expected, params(m.net))]
    for p, e in zip(m.plastic.parameters(), expected):
        assert torch.allclose(p, e, atol=1e-6, rtol=0)


def test_the_decisions_come_from_the_runs_generator_not_the_global_one():
    m = make(plastic_update_freq=0.5, stable_update_freq=0.5)
    m.observe(*batch(0))
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    expected = torch.Generator().set_state(m.ctx.generator.get_state())
    for step in range(1, 4):
        m.observe(*batch(step))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not torch.equal(m.ctx.generator.get_state(), expected.get_state())


# ---------------------------------------------------------------- the per-sample memory and the loss


def test_the_memory_is_chosen_per_sample_by_the_true_class_probability():
    """Row 0: the stable memory's true-class probability is higher -> stable. Row 1: the stable memory's true-
    class logit is higher (3 > 1) but its probability lower (its other logits are higher too) -> plastic.
    Row 2: a tie (both exactly 1.0 in float32) -> plastic (the stable one only when strictly higher)."""
    stable = torch.tensor([[2.0, 0.0, 0.0], [3.0, 5.0, 5.0], [0.0, -100.0, -100.0]])
    plastic = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, -200.0, -100.0]])
    y = torch.tensor([0, 0, 0])
    p_s = torch.softmax(stable, 1)[torch.arange(3), y]
    p_p = torch.softmax(plastic, 1)[torch.arange(3), y]
    assert p_s[0] > p_p[0] and stable[1, 0] > plastic[1, 0] and p_s[1] < p_p[1] and p_s[2] == p_p[2] == 1.0
    target = memory_targets(stable, plastic, y)
    assert torch.equal(target, torch.stack([stable[0], plastic[1], plastic[2]]))


def test_the_loss_is_the_concatenated_cross_entropy_plus_the_weighted_consistency_by_hand():
    m = make(reg_weight=0.7)
    with torch.no_grad():     # memories that differ from the network and from each other
        for p in m.stable.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        for p in m.plastic.parameters():
            p.sub_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    x, y, _ = batch(3)
    buf_x, buf_y, _ = batch(4, n=8)
    loss = m.loss(x, y, buf_x, buf_y)

    def f(net, inp):
        w1, b1, w2, b2 = (p.detach() for p in net.parameters())
        return torch.relu(inp @ w1.T + b1) @ w2.T + b2

    logits = f(m.net, torch.cat([x, buf_x]))
    labels = torch.cat([y, buf_y])
    ce = -sum(torch.log_softmax(logits[i], 0)[labels[i]] for i in range(len(labels))) / len(labels)
    zs, zp = f(m.stable, buf_x), f(m.plastic, buf_x)
    rows = []
    for i in range(len(buf_y)):
        ps, pp = torch.softmax(zs[i], 0)[buf_y[i]], torch.softmax(zp[i], 0)[buf_y[i]]
        rows.append(zs[i] if ps > pp else zp[i])
    chosen = torch.stack(rows)
    assert not torch.equal(chosen, zs) and not torch.equal(chosen, zp)   # both memories chosen for some sample
    mse = ((f(m.net, buf_x) - chosen) ** 2).sum() / chosen.numel()
    assert torch.allclose(loss, ce + 0.7 * mse, atol=1e-6)
    # the consistency term reaches the working network only: the memories' logits are targets
    loss.backward()
    assert all(p.grad is None for p in (*m.stable.parameters(), *m.plastic.parameters()))


def test_without_a_buffer_batch_the_loss_is_the_streams_cross_entropy():
    m = make(reg_weight=5.0)
    x, y, _ = batch(0)
    assert torch.equal(m.loss(x, y), F.cross_entropy(m.net(x), y))


def test_a_step_stores_the_raw_stream_and_replays_it_from_the_second_step(monkeypatch):
    m = make()
    x, y, x_raw = batch(0)
    seen = []
    original = m.loss
    monkeypatch.setattr(m, "loss", lambda *a: seen.append(len(a)) or original(*a))
    m.observe(x, y, x_raw)
    assert torch.equal(m.buffer.fields["examples"][:4], x_raw) and torch.equal(m.buffer.fields["labels"][:4], y)
    m.observe(*batch(1))
    assert seen == [2, 4]       # no buffer batch at the first step; a replayed batch at the second


# ---------------------------------------------------------------- evaluation


def test_the_stable_memory_is_evaluated_in_eval_mode_and_left_in_training_mode():
    m = make(norm=True, stable_update_freq=1.0)
    for step in range(3):
        m.observe(*batch(step))
    x = batch(9, n=5)[0]
    m.net.eval()          # what the loop does around an evaluation
    out = m.predict(x)
    assert m.stable.training and m.plastic.training
    stable = copy.deepcopy(m.stable).eval()
    assert torch.equal(out, stable(x)) and not torch.equal(out, m.net(x))
    assert torch.equal(m.features(x), stable.features(x))
    # its BatchNorm statistics are its own: its forward passes of the replayed batches, not the network's
    assert not torch.equal(m.stable.body[1].running_mean, m.net.body[1].running_mean)


@pytest.mark.parametrize("which", ["plastic", "working"])
def test_another_network_can_be_evaluated(which):
    m = make(evaluated_model=which)
    m.observe(*batch(0))
    m.observe(*batch(1))
    x = batch(9)[0]
    assert torch.equal(m.predict(x), {"plastic": m.plastic, "working": m.net}[which](x))


# ---------------------------------------------------------------- state and checkpoints


def test_state_round_trip_continues_identically():
    """A method restored from another's state (after a trip through torch.save) with the same generator
    state takes the same next steps, bit for bit: network, memories, their BatchNorm statistics, step count."""
    import io
    a = make(norm=True, plastic_update_freq=0.5, stable_update_freq=0.5)
    for step in range(4):
        a.observe(*batch(step))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert set(state) == {"net", "buffer", "plastic", "stable", "global_step"} and state["global_step"] == 4
    b = make(seed=1, norm=True, plastic_update_freq=0.5, stable_update_freq=0.5)
    b.load_state_dict(state)
    b.ctx.generator.set_state(a.ctx.generator.get_state())
    for step in range(4, 10):
        la, lb = a.observe(*batch(step)), b.observe(*batch(step))
        assert torch.equal(la, lb)
    for name in ("net", "plastic", "stable"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
    assert a.global_step == b.global_step == 10
    x = batch(99)[0]
    assert torch.equal(a.predict(x), b.predict(x))


def test_learns_on_mnist_360_above_sgd(tiny_mnist360):
    """Through the training loop, without task boundaries (its checkpoint resume: tests/test_checkpoint.py)."""
    bench, cfg = tiny_mnist360
    run = settings(50, lr=0.1, batch=4, replay_batch=4, reg_weight=0.5, plastic_update_freq=0.6,
                   stable_update_freq=0.3, plastic_alpha=0.9, stable_alpha=0.99)
    plain = run_seed(bench, cfg, run, 0, CPU)
    sgd = run_seed(bench, cfg, run_settings("sgd", lr=0.1, batch=4), 0, CPU)
    assert plain.class_il > sgd.class_il and plain.class_il > 100 / 9 * 1.5
    assert math.isfinite(plain.loss_curve[-1])
