"""STAR (er-star, derpp-star) against hand computations on a linear softmax classifier in float64, where every
gradient has a closed form: the perturbation's direction and norm, the STAR gradient taken at the perturbed weights
and applied to the unperturbed ones, the correctly classified buffer samples alone, the 'fewer than 2 correct: no
STAR term' rule; then whole seeds: with the KL weight at 0 a seed equals ER / DER++ loss for loss, with it above 0
it differs and repeats itself exactly."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gcl.config import ParamsError, resolve_run
from gcl.core.backbones import build_backbone
from gcl.core.results import TIMINGS
from gcl.methods import METHODS, MethodContext
from gcl.methods.star import masked_kl
from gcl.training.train import run_seed
from helpers import CountingNet, run_settings

CPU = torch.device("cpu")
# the classifier logits = W x + b: which samples it gets right is read off by hand
W0 = torch.tensor([[2.0, 0.3, -0.2], [0.1, 1.5, 0.4], [-0.3, 0.2, 1.8]], dtype=torch.float64)
B0 = torch.tensor([0.1, -0.1, 0.05], dtype=torch.float64)
# buffer samples 0-1 classified correctly, 2-3 not (logits' argmax 2 and 0 against labels 0 and 2), 4-5 for ER's draw
BUF_X = torch.tensor([[1.0, 0.1, 0.0], [0.2, 1.0, -0.1], [0.0, 0.1, 1.0], [1.0, 0.2, 0.1],
                      [0.5, -0.4, 0.3], [-0.2, 0.6, 0.1]], dtype=torch.float64)
BUF_Y = torch.tensor([0, 1, 0, 2, 1, 2])
X = torch.tensor([[0.3, -0.1, 0.8], [0.9, 0.4, -0.5]], dtype=torch.float64)
Y = torch.tensor([2, 1])
LR = 0.1
NOISE, NOISE_SEED = 0.01, 5      # the proxy's start: at delta = 0 exactly the KL's gradient is zero, its direction void


def noisy_start(noise=NOISE):
    """W0 plus the proxy's initial noise as the method draws it (torch's global generator, seeded by observe_at)."""
    torch.manual_seed(NOISE_SEED)
    return W0 + noise * W0.norm() * torch.randn(3, 3, dtype=torch.float64)


def observe_at(m):
    """One observe of the stream batch, torch's global generator seeded as noisy_start has it."""
    torch.manual_seed(NOISE_SEED)
    return m.step(X, Y, X)


class Linear(nn.Module):
    """The smallest backbone: features are the input, logits W x + b (float64)."""

    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(3, 3).double()
        with torch.no_grad():
            self.classifier.weight.copy_(W0)
            self.classifier.bias.copy_(B0)

    def features(self, x):
        return x

    def forward(self, x):
        return self.classifier(x)


def make(name: str = "er-star", **cfg):
    ctx = MethodContext(device=CPU, n_classes=3, train_transform=lambda v: v,
                        generator=torch.Generator().manual_seed(0))
    base = {"lr": LR, "batch": 2, "replay_batch": 4, "gamma": 0.5, "lam": 0.7, "init_noise": NOISE}
    if name.startswith("derpp"):
        base.update(alpha=0.3, beta=0.6)
    m = METHODS[name](Linear(), run_settings(name, 10, **{**base, **cfg}), ctx)
    fields = {"examples": BUF_X, "labels": BUF_Y}
    if name.startswith("derpp"):
        fields["logits"] = torch.arange(18, dtype=torch.float64).view(6, 3) / 9
    m.buffer.add(**fields)
    return m


def fix_draws(m, *draws):
    """The buffer's draws, in order, fixed to these slots (the STAR batch's first)."""
    queue = [torch.tensor(d) for d in draws]
    m.buffer.sample_indices = lambda size: queue.pop(0)
    return queue


def probs(w, x, b=B0):
    return F.softmax(x @ w.T + b, 1)


def kl_grads(w, x, target, mask, b=B0):
    """d/dW and d/db of the masked mean of KL(target_i || softmax(W x_i + b)): (q_i - target_i) x_i^T averaged."""
    r = (probs(w, x, b) - target) * mask[:, None] / mask.sum()
    return r.T @ x, r.sum(0)


def perturbed_by_hand(x, mask, gamma=0.5, steps=1, start=None):
    """theta + delta: from `start`, `steps` normalised ascent steps on the masked KL towards softmax(W0 x + b)."""
    target, w, norm = probs(W0, x), (noisy_start() if start is None else start).clone(), W0.norm()
    for _ in range(steps):
        g, _ = kl_grads(w, x, target, mask)
        w = w + gamma / steps * norm * g / g.norm()
    return w


def er_grads(w, b, x, y):
    """ER's joint cross-entropy gradient: (softmax - onehot)^T x averaged over the stream and replayed batch."""
    r = (probs(w, x, b) - F.one_hot(y, 3).double()) / len(y)
    return r.T @ x, r.sum(0)


def er_star_step_by_hand(star_slots, er_slots, mask, lam=0.7, at_perturbed=True):
    x, y = torch.cat([X, BUF_X[er_slots]]), torch.cat([Y, BUF_Y[er_slots]])
    gw, gb = er_grads(W0, B0, x, y)
    sx = BUF_X[star_slots]
    where = perturbed_by_hand(sx, mask) if at_perturbed else W0
    kw, kb = kl_grads(where, sx, probs(W0, sx), mask)
    return W0 - LR * (gw + lam * kw), B0 - LR * (gb + lam * kb)


def test_the_fixture_has_two_correct_samples_of_four():
    assert (probs(W0, BUF_X[:4]).argmax(1) == BUF_Y[:4]).tolist() == [True, True, False, False]


def test_the_perturbation_ascends_the_kl_gradient_by_gamma_times_the_weights_norm():
    """One ascent step from the noisy start moves W by gamma ||W|| along dKL/dW there; the bias stays."""
    m = make()
    sx, mask = BUF_X[:4], torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    torch.manual_seed(NOISE_SEED)
    got = m.perturbation(sx, probs(W0, sx), mask)[0]
    start = noisy_start()
    assert 0 < (start - W0).norm() < 0.1 * W0.norm()           # noise of std 0.01 ||W|| per entry
    g, _ = kl_grads(start, sx, probs(W0, sx), mask)
    step = got - start
    assert step.norm().item() == pytest.approx(0.5 * W0.norm().item(), rel=1e-12)           # gamma ||W||
    assert torch.dot(step.flatten(), g.flatten()).item() == pytest.approx((step.norm() * g.norm()).item(), rel=1e-12)
    assert torch.allclose(got, perturbed_by_hand(sx, mask), atol=1e-12)
    assert torch.equal(m.proxy.classifier.bias.detach(), B0)       # one-dimensional parameters are not perturbed
    assert torch.equal(m.net.classifier.weight.detach(), W0)       # the network itself is left alone
    # two steps of gamma / 2, each along the gradient where the first arrived
    m = make(ascent_steps=2)
    torch.manual_seed(NOISE_SEED)
    got = m.perturbation(sx, probs(W0, sx), mask)[0]
    two = perturbed_by_hand(sx, mask, steps=2)
    assert torch.allclose(got, two, atol=1e-12) and (two - perturbed_by_hand(sx, mask)).abs().max() > 1e-4
    assert (got - start).norm() <= 0.5 * W0.norm() + 1e-12


def test_mammoths_start_is_below_float32_resolution_so_the_first_gradient_is_rounding():
    """init_noise 1e-20 (the reference's) leaves float32 weights as they are: at delta = 0 the KL's gradient is
    zero but for rounding, which then sets the direction (documented in docs/methods.md)."""
    torch.manual_seed(0)
    net = build_backbone("mlp", (1, 28, 28), 10).train()
    x = torch.rand(16, 1, 28, 28)
    with torch.no_grad():
        target = F.softmax(net(x), 1)
    norms = []
    for noise in (1e-20, 1e-3):
        proxy = copy.deepcopy(net)
        weights = [p for p in proxy.parameters() if p.dim() > 1]
        with torch.no_grad():
            for q in weights:
                moved = q + torch.randn_like(q) * q.norm() * noise
                assert torch.equal(moved, q) == (noise == 1e-20)
                q.copy_(moved)
        grads = torch.autograd.grad(masked_kl(proxy(x), target, torch.ones(16)), weights)
        norms.append(max(g.norm().item() for g in grads))
    assert norms[0] < 1e-6 < 1e-3 < norms[1]
    assert METHODS["er-star"].Settings.model_fields["init_noise"].default == 1e-20


def test_the_star_gradient_is_taken_at_the_perturbed_weights_and_applied_to_the_unperturbed_ones():
    m = make()
    fix_draws(m, [0, 1, 2, 3], [4, 5])
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    loss = observe_at(m)
    want_w, want_b = er_star_step_by_hand([0, 1, 2, 3], [4, 5], mask)
    assert torch.allclose(m.net.classifier.weight, want_w, atol=1e-12)
    assert torch.allclose(m.net.classifier.bias, want_b, atol=1e-12)
    # the same gradient taken at the unperturbed weights is another step (the test tells them apart)
    at_theta_w, _ = er_star_step_by_hand([0, 1, 2, 3], [4, 5], mask, at_perturbed=False)
    assert (at_theta_w - want_w).abs().max() > 1e-4
    # the loss returned is ER's, at the unperturbed weights
    x, y = torch.cat([X, BUF_X[[4, 5]]]), torch.cat([Y, BUF_Y[[4, 5]]])
    assert loss.item() == pytest.approx(F.cross_entropy(x @ W0.T + B0, y).item(), rel=1e-12)
    assert m.star_steps == 1 and m.extra_metrics() == {"star_steps": 1}
    assert len(m.buffer) == 8                     # the stream batch went into the buffer


def test_derpp_star_adds_the_star_gradient_to_derpps_own():
    m = make("derpp-star")
    fix_draws(m, [0, 1, 2, 3], [4, 5], [5, 3])    # STAR's draw, then DER++'s logit and label draws
    logits = m.buffer.fields["logits"]
    net = copy.deepcopy(m.net)
    base = (F.cross_entropy(net(X), Y) + 0.3 * F.mse_loss(net(BUF_X[[4, 5]]), logits[[4, 5]])
            + 0.6 * F.cross_entropy(net(BUF_X[[5, 3]]), BUF_Y[[5, 3]]))
    gw, gb = torch.autograd.grad(base, [net.classifier.weight, net.classifier.bias])
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    sx = BUF_X[:4]
    kw, kb = kl_grads(perturbed_by_hand(sx, mask), sx, probs(W0, sx), mask)
    loss = observe_at(m)
    assert loss.item() == pytest.approx(base.item(), rel=1e-12)
    assert torch.allclose(m.net.classifier.weight, W0 - LR * (gw + 0.7 * kw), atol=1e-12)
    assert torch.allclose(m.net.classifier.bias, B0 - LR * (gb + 0.7 * kb), atol=1e-12)


def test_only_the_correctly_classified_buffer_samples_enter():
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    every = torch.ones(4, dtype=torch.float64)
    correct_w, _ = er_star_step_by_hand([0, 1, 2, 3], [4, 5], mask)
    all_w, _ = er_star_step_by_hand([0, 1, 2, 3], [4, 5], every)
    assert (correct_w - all_w).abs().max() > 1e-4
    for samples, want in (("correct", correct_w), ("all", all_w)):
        m = make(star_samples=samples)
        fix_draws(m, [0, 1, 2, 3], [4, 5])
        observe_at(m)
        assert torch.allclose(m.net.classifier.weight, want, atol=1e-12), samples
    # the misclassified samples' inputs do not matter with `correct`
    m = make()
    fix_draws(m, [0, 1, 2, 3], [4, 5])
    m.buffer.fields["examples"][3] = torch.tensor([3.0, 0.0, -1.0], dtype=torch.float64)   # still predicted 0, label 2
    observe_at(m)
    assert torch.allclose(m.net.classifier.weight, correct_w, atol=1e-12)


def test_fewer_correct_samples_than_min_correct_leave_the_step_to_er():
    gw, gb = er_grads(W0, B0, torch.cat([X, BUF_X[[4, 5]]]), torch.cat([Y, BUF_Y[[4, 5]]]))
    er_only_w, er_only_b = W0 - LR * gw, B0 - LR * gb
    m = make()                                    # min_correct 2; the batch [0, 2, 3] has one correct sample
    fix_draws(m, [0, 2, 3], [4, 5])
    observe_at(m)
    assert torch.allclose(m.net.classifier.weight, er_only_w, atol=1e-15)
    assert torch.allclose(m.net.classifier.bias, er_only_b, atol=1e-15) and m.star_steps == 0
    m = make(min_correct=1)                       # one correct sample is enough
    fix_draws(m, [0, 2, 3], [4, 5])
    observe_at(m)
    want_w, _ = er_star_step_by_hand([0, 2, 3], [4, 5], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(m.net.classifier.weight, want_w, atol=1e-12) and m.star_steps == 1
    assert (want_w - er_only_w).abs().max() > 1e-4


def test_a_plugins_gradients_reach_only_a_base_that_updates_through_sgd_step():
    """The hook's contract: Method.step hands extra_gradients to the base's sgd_step; a base whose observe makes its
    update otherwise would drop them silently, so the step is refused, naming the method."""
    from gcl.methods.base import Method

    class OwnUpdate(Method):
        name = "own-update"

        def extra_gradients(self):
            return [torch.ones_like(p) for p in self.params]

        def observe(self, x, y, x_raw):
            loss = F.cross_entropy(self.net(x), y)
            loss.backward()
            self.apply_gradients()                    # not sgd_step: the extra gradients never join
            return loss.detach()

    ctx = MethodContext(device=CPU, n_classes=3, train_transform=lambda v: v, generator=torch.Generator())
    m = OwnUpdate(Linear(), run_settings("er", 10, lr=LR, batch=2, replay_batch=2), ctx)
    with pytest.raises(TypeError, match="own-update: its update does not take a plug-in's gradients"):
        m.step(X, Y, X)
    m = make(lam=0.7)                                 # STAR's through ER's sgd_step: consumed, nothing left over
    fix_draws(m, [0, 1, 2, 3], [4, 5])
    observe_at(m)
    assert m.star_steps == 1 and m._extra_gradients is None


def test_the_settings_refuse_what_cannot_run_in_one_line():
    params = {"seeds": [0], "sources": {"synthetic": {}},
              "benchmarks": {"b": {"kind": "mnist-360", "source": "synthetic", "backbone": "mlp"}},
              "methods": {"er-star": {}}, "runs": {}}
    for bad, says in (({"gamma": 0.0}, "gamma"), ({"lam": -0.1}, "lam"), ({"ascent_steps": 0}, "ascent_steps"),
                      ({"min_correct": 5}, r"min_correct \(5\) exceeds replay_batch \(4\)"),
                      ({"star_samples": "wrong"}, "star_samples")):
        params["runs"] = {"r": {"benchmark": "b", "method": "er-star", "buffer": 50, "lr": 0.1, "batch": 4,
                                "replay_batch": 4, **bad}}
        with pytest.raises(ParamsError, match=says):
            resolve_run(params, "r")


def seed_numbers(bench, cfg, name, **settings):
    base = {"lr": 0.1, "batch": 4, "replay_batch": 8}
    if name.startswith("derpp"):
        base.update(alpha=0.3, beta=0.5)
    result = run_seed(bench, cfg, run_settings(name, 50, **base, **settings), 0, CPU).to_json()
    return {k: v for k, v in result.items() if k not in TIMINGS}


@pytest.mark.slow
@pytest.mark.parametrize("base", ["er", "derpp"])
def test_with_the_kl_weight_at_0_a_seed_is_its_base_methods_loss_for_loss(base, tiny_mnist360):
    bench, cfg = tiny_mnist360
    plain = seed_numbers(bench, cfg, base)
    off = seed_numbers(bench, cfg, f"{base}-star", lam=0.0)
    assert off.pop("method_metrics") == {"star_steps": 0}
    plain.pop("method_metrics")
    assert off == plain
    on = seed_numbers(bench, cfg, f"{base}-star", lam=0.5, gamma=0.1)
    assert on["method_metrics"]["star_steps"] > 0
    assert on["loss_curve"] != plain["loss_curve"]
    if base == "er":                              # the same seed gives the same numbers on the CPU
        assert seed_numbers(bench, cfg, "er-star", lam=0.5, gamma=0.1) == on


def test_mammoths_start_gives_the_numbers_of_no_noise_over_a_seed(tiny_mnist360):
    """On MNIST-360's MLP (float32, no augmentation drawing from the global generator) the 1e-20 noise changes no
    weight at any step: a seed is the same with init_noise 0, which skips the draws (docs/methods.md)."""
    bench, cfg = tiny_mnist360
    mammoth = seed_numbers(bench, cfg, "er-star", lam=0.5, gamma=0.1)
    assert mammoth["method_metrics"]["star_steps"] > 0
    assert seed_numbers(bench, cfg, "er-star", lam=0.5, gamma=0.1, init_noise=0.0) == mammoth


@pytest.mark.parametrize("case", ["applied", "skipped"])
def test_the_passes_a_step_makes_and_batchnorms_statistics_as_mammoths(case):
    """A STAR step passes its batch through the network at theta (no grad), the proxy, then the network at theta +
    delta; with fewer than min_correct correct samples only the first pass and, with BatchNorm, one more at theta
    (mammoth's network pass before its check): the running statistics move as there. ER's joint pass (2 + 2) follows."""
    torch.manual_seed(0)
    ctx = MethodContext(device=CPU, n_classes=3, train_transform=lambda v: v.float(), generator=torch.Generator().manual_seed(0))
    cfg = {"star_samples": "all"} if case == "applied" else {"min_correct": 4}
    m = METHODS["er-star"](CountingNet(3, 4, 3), run_settings("er-star", 10, lr=LR, batch=2, replay_batch=4, **cfg), ctx)
    m.buffer.add(examples=BUF_X.float(), labels=BUF_Y)
    fix_draws(m, [0, 2, 3, 1], [4, 5])
    sx = BUF_X[[0, 2, 3, 1]].float()
    lin, bn = copy.deepcopy(m.net.body[0]), copy.deepcopy(m.net.body[1])   # theta's first layers, by hand
    m.step(X.float(), Y, X.float())
    if case == "applied":
        assert m.star_steps == 1 and m.net.passes == [4, 4, 4] and m.proxy.passes == [4]
    else:
        assert m.star_steps == 0 and m.net.passes == [4, 4, 4] and m.proxy.passes == []
        with torch.no_grad():
            for batch in (sx, sx, torch.cat([X.float(), BUF_X[[4, 5]].float()])):   # STAR's two, ER's joint pass
                bn(lin(batch))
        assert torch.allclose(m.net.body[1].running_mean, bn.running_mean, atol=1e-7)
        assert torch.allclose(m.net.body[1].running_var, bn.running_var, atol=1e-7)
        assert m.net.body[1].num_batches_tracked == 3
