"""The general-continual baselines DER, DER++, A-GEM (reservoir) and GSS: losses, projection, buffer policy,
and end-to-end runs on a small synthetic MNIST-360 that never reveal a task boundary."""
import math

import pytest
import torch
import torch.nn.functional as F

from gcl.config import ParamsError, resolve_run
from gcl.core.backbones import MLP
from gcl.data.transforms import to_unit_float
from gcl.methods import METHODS, MethodContext
from gcl.methods.agem import project
from gcl.methods.der import der_loss
from gcl.methods.gss import GSSBuffer, gradient_cosines
from gcl.training.train import run_seed
from helpers import run_settings, synthetic_source

CPU = torch.device("cpu")


def make_method(name: str, seed: int = 0, n_classes: int = 10, train_transform=to_unit_float, plain_transform=None,
                **cfg):
    torch.manual_seed(seed)
    net = MLP((1, 28, 28), n_classes)
    ctx = MethodContext(device=CPU, n_classes=n_classes, train_transform=train_transform,
                        generator=torch.Generator().manual_seed(seed), plain_transform=plain_transform)
    return METHODS[name](net, run_settings(name, **cfg), ctx)


def digits(label: int, n: int, offset: int = 0):
    src = synthetic_source(per_class=offset + n)
    x = src["train_x"][src["train_y"] == label][offset:offset + n]
    return x, torch.full((n,), label, dtype=torch.long)


def test_sgd_step_is_torch_optim_sgd_update_exactly():
    """Method.sgd_step applies p -= lr * grad itself (torch.optim's first use costs a second of imports
    per stage): bit for bit what torch.optim.SGD does, including parameters without a gradient."""
    m = make_method("sgd", lr=0.1, batch=4)
    ref = MLP((1, 28, 28), 10)
    ref.load_state_dict(m.net.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = digits(3, 4)
    x = to_unit_float(x)
    for _ in range(3):
        m.sgd_step(F.cross_entropy(m.net(x), y))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(m.net.parameters(), ref.parameters()))
    frozen = m.params[0].detach().clone()   # a parameter the loss does not reach keeps its value
    m.sgd_step(m.net.classifier(torch.zeros(1, m.net.feat_dim)).sum() * 0 + m.params[-1].sum())
    assert torch.equal(m.params[0], frozen)


# --- DER / DER++ -----------------------------------------------------------------------------------

def test_der_and_derpp_losses_match_hand_computation():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    y = torch.tensor([0, 0])
    ce_stream = (math.log(2.0) + math.log(4.0 / 3.0)) / 2          # -log(1/2), -log(3/4)
    buf_out, buf_logits = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 4.0]])
    mse = (1.0 ** 2 + 2.0 ** 2) / 2                                   # mean over the 2 logits
    buf_out2, buf_y2 = torch.tensor([[0.0, 0.0]]), torch.tensor([1])
    der = der_loss(logits, y, buf_out, buf_logits, alpha=0.5)
    derpp = der_loss(logits, y, buf_out, buf_logits, alpha=0.5, buf_out2=buf_out2, buf_y2=buf_y2, beta=2.0)
    assert der.item() == pytest.approx(ce_stream + 0.5 * mse, abs=1e-6)
    assert derpp.item() == pytest.approx(ce_stream + 0.5 * mse + 2.0 * math.log(2.0), abs=1e-6)
    assert der_loss(logits, y).item() == pytest.approx(ce_stream, abs=1e-6)   # empty buffer: CE only


def test_der_stores_the_logits_of_the_network_before_its_update():
    m = make_method("der", buffer=10, lr=0.5, batch=4, replay_batch=4, alpha=0.5)
    x_raw, y = digits(3, 4)
    before = m.net(to_unit_float(x_raw)).detach()
    m.observe(to_unit_float(x_raw), y, x_raw)
    stored_x, stored_y, stored_z = m.buffer.get("examples", "labels", "logits")
    assert torch.equal(stored_x, x_raw) and torch.equal(stored_y, y)
    assert torch.allclose(stored_z, before)
    assert not torch.allclose(m.net(to_unit_float(x_raw)), before)   # the network did move


@pytest.mark.parametrize("name, extra", [("der", {}), ("derpp", {"beta": 1.0})])
def test_der_observe_optimises_der_loss_on_its_replay_draws(name, extra):
    m = make_method(name, buffer=12, lr=0.1, batch=4, replay_batch=3, alpha=0.3, **extra)
    for label in (0, 1, 2):
        x_raw, y = digits(label, 4)
        m.observe(to_unit_float(x_raw), y, x_raw)
    x_raw, y = digits(4, 4)
    x = to_unit_float(x_raw)
    # replay the generator to get the exact buffer draws that observe will make
    state = m.ctx.generator.get_state()
    idx1 = m.buffer.sample_indices(3)
    idx2 = m.buffer.sample_indices(3) if name == "derpp" else None
    m.ctx.generator.set_state(state)
    bx, bz, by = m.buffer.get("examples", "logits", "labels")
    terms = dict(buf_out=m.net(to_unit_float(bx[idx1])), buf_logits=bz[idx1], alpha=0.3)
    if idx2 is not None:
        terms.update(buf_out2=m.net(to_unit_float(bx[idx2])), buf_y2=by[idx2], beta=1.0)
    expected = der_loss(m.net(x), y, **terms)
    grads = torch.autograd.grad(expected, list(m.net.parameters()))
    w_expected = [p.detach() - 0.1 * g for p, g in zip(m.net.parameters(), grads)]
    loss = m.observe(x, y, x_raw)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for p, w in zip(m.net.parameters(), w_expected):
        assert torch.allclose(p, w, atol=1e-6)
    if name == "derpp":   # the label term is there: DER++ differs from DER on the same draws
        assert expected.item() != pytest.approx(der_loss(m.net(x), y, terms["buf_out"], terms["buf_logits"], 0.3).item())


# --- A-GEM -----------------------------------------------------------------------------------------

def test_agem_projection_on_hand_computed_vectors():
    g, g_ref = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])
    # dot = -1, ||g_ref||^2 = 2: g - (-1/2) g_ref = [0.5, 0.5], orthogonal to g_ref
    assert torch.allclose(project(g, g_ref), torch.tensor([0.5, 0.5]))
    g2 = torch.tensor([1.0, 2.0])
    assert torch.equal(project(g2, torch.tensor([1.0, 0.0])), g2)            # dot = 1 >= 0: unchanged
    assert torch.equal(project(g2, torch.zeros(2)), g2)                       # no reference: unchanged


def test_agem_projection_never_conflicts_with_the_reference():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        g, g_ref = torch.randn(2, 50, generator=gen, dtype=torch.float64)
        out = project(g, g_ref)
        if torch.dot(g, g_ref) >= 0:
            assert torch.equal(out, g)
        else:
            assert torch.dot(out, g_ref) >= -1e-10 * g.norm() * g_ref.norm()
            assert torch.dot(out, g_ref) == pytest.approx(0.0, abs=1e-10)    # lands on the boundary


def test_agem_observe_steps_along_the_projected_gradient():
    m = make_method("agem", buffer=20, lr=0.1, batch=4, replay_batch=8)
    for label in (0, 1, 2):
        x_raw, y = digits(label, 4)
        m.observe(to_unit_float(x_raw), y, x_raw)
    x_raw, y = digits(5, 4)
    x = to_unit_float(x_raw)
    params = list(m.net.parameters())
    flat = lambda loss: torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    state = m.ctx.generator.get_state()
    idx = m.buffer.sample_indices(8)
    m.ctx.generator.set_state(state)
    bx, by = m.buffer.get("examples", "labels")
    g = flat(F.cross_entropy(m.net(x), y))
    g_ref = flat(F.cross_entropy(m.net(to_unit_float(bx[idx])), by[idx]))
    g_proj = project(g, g_ref)
    before = torch.cat([p.detach().reshape(-1) for p in params])
    m.observe(x, y, x_raw)
    after = torch.cat([p.detach().reshape(-1) for p in params])
    assert torch.allclose(after, before - 0.1 * g_proj, atol=1e-6)
    assert torch.dot(g_proj, g_ref) >= -1e-5 * g_ref.norm() ** 2


def _inputs_seen(m) -> list[torch.Tensor]:
    """What the network is given: every forward (A-GEM), or the images whose gradients GSS scores."""
    seen = []
    if hasattr(m, "score_cosines"):
        original = m.score_cosines
        m.score_cosines = lambda x, y, n: (seen.append(x.detach().clone()), original(x, y, n))[1]
    else:
        m.net.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    return seen


def shifted(x_raw):   # an "augmentation" that moves every pixel out of [0, 1], so its output is recognisable
    return to_unit_float(x_raw) + 5.0


@pytest.mark.parametrize("name, setting", [("agem", "reference_input"), ("gss", "score_input")])
def test_reference_inputs_are_the_raw_buffer_images_under_the_reference_setting(name, setting):
    """A-GEM's reference batch and GSS's scored images: [0, 1] pixels as stored, neither augmented nor
    normalised (the reference framework); the other reading uses the (augmenting / normalising) transform."""
    extra = {"gss_minibatch": 4} if name == "gss" else {}
    for value, raw in (("raw", True), ("replay" if name == "agem" else "plain", False)):
        m = make_method(name, buffer=20, lr=0.01, batch=4, replay_batch=4, train_transform=shifted,
                        plain_transform=shifted, **{setting: value}, **extra)
        for label in (0, 1):
            x_raw, y = digits(label, 4)
            m.observe(shifted(x_raw), y, x_raw)
        seen = _inputs_seen(m)
        x_raw, y = digits(2, 4)
        m.observe(shifted(x_raw), y, x_raw)
        buffered = {tuple(v.flatten().tolist()[:50]) for v in to_unit_float(m.buffer.get("examples")[0])}
        in_unit_range = [x for x in seen if x.max() <= 1.0]
        if raw:
            assert in_unit_range and all(tuple(r.flatten().tolist()[:50]) in buffered | {
                tuple(v.flatten().tolist()[:50]) for v in to_unit_float(x_raw)} for x in in_unit_range for r in x)
        else:
            assert not in_unit_range


# --- GSS -------------------------------------------------------------------------------------------

def test_gradient_cosines_match_the_concatenated_vectors():
    gen = torch.Generator().manual_seed(0)
    blocks = [torch.randn(7, n, generator=gen, dtype=torch.float64) for n in (5, 3, 11)]
    full = torch.cat(blocks, 1)
    full[3] = 0.0                                   # a zero gradient: cosine 0 with everything
    blocks = [full[:, :5], full[:, 5:8], full[:, 8:]]
    new, ref = full[:4], full[4:]
    batch_cos, sample_cos = gradient_cosines([b[:4] for b in blocks], [b[4:] for b in blocks])
    expected = F.cosine_similarity(new[:, None, :], ref[None, :, :], dim=2)
    assert torch.allclose(sample_cos, expected) and torch.equal(sample_cos[3], torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(batch_cos, F.cosine_similarity(new.mean(0, keepdim=True), ref, dim=1))


def test_gss_buffer_stays_at_capacity_with_consistent_rows():
    gen = torch.Generator().manual_seed(0)
    buf = GSSBuffer(10, CPU, gen)
    next_id, offered_score = 0, {}
    for step in range(60):
        ids = torch.arange(next_id, next_id + 7)
        next_id += 7
        scores = torch.rand(7, generator=gen) * 0.9 + 0.05
        offered_score.update(zip(ids.tolist(), scores.tolist()))
        buf.add(examples=ids.float()[:, None], labels=ids, batch_score=torch.tensor(0.5), sample_scores=scores)
        assert len(buf) == min(7 * (step + 1), 10)
    x, ids, scores = buf.get("examples", "labels", "scores")
    assert len(ids) == 10 and len(set(ids.tolist())) == 10           # full, no sample twice
    assert torch.equal(x[:, 0].long(), ids)                           # fields moved together
    assert ids.max() >= 10                                           # replacement did happen
    for i, s in zip(ids.tolist(), scores.tolist()):
        if i >= 10:                                                  # replaced rows carry their own score
            assert s == pytest.approx(offered_score[i])


def test_gss_buffer_prefers_newcomers_with_low_scores():
    """Against stored scores of 1, a newcomer scoring 0.2 enters with p = 1/1.2, one scoring 1.8 with p = 1/2.8."""
    gen = torch.Generator().manual_seed(1)
    entered = {0.2: 0, 1.8: 0}
    trials = 400
    for score in entered:
        for _ in range(trials):
            buf = GSSBuffer(4, CPU, gen)
            buf.add(examples=torch.zeros(4, 1), labels=torch.zeros(4, dtype=torch.long),
                    batch_score=torch.tensor(1.0), sample_scores=torch.ones(4))
            buf.add(examples=torch.ones(1, 1), labels=torch.ones(1, dtype=torch.long),
                    batch_score=torch.tensor(0.5), sample_scores=torch.tensor([score]))
            entered[score] += int(buf.get("labels")[0].sum())
    assert entered[0.2] / trials == pytest.approx(1 / 1.2, abs=0.06)
    assert entered[1.8] / trials == pytest.approx(1 / 2.8, abs=0.06)
    # a batch whose own score is not below 1 changes nothing, whatever its samples score
    buf = GSSBuffer(4, CPU, gen)
    buf.add(examples=torch.zeros(4, 1), labels=torch.zeros(4, dtype=torch.long),
            batch_score=torch.tensor(1.0), sample_scores=torch.ones(4))
    for _ in range(50):
        buf.add(examples=torch.ones(3, 1), labels=torch.ones(3, dtype=torch.long),
                batch_score=torch.tensor(1.0), sample_scores=torch.full((3,), 0.01))
    assert buf.get("labels")[0].sum() == 0 and len(buf) == 4


def test_gss_scores_redundant_samples_high_and_keeps_novel_ones():
    m = make_method("gss", buffer=8, lr=0.2, batch=4, replay_batch=4, gss_minibatch=8, batch_num=1)
    x0, y0 = digits(0, 8)
    for _ in range(10):                                   # learn digit 0; the buffer fills with it
        m.observe(to_unit_float(x0[:4]), y0[:4], x0[:4])
        m.observe(to_unit_float(x0[4:]), y0[4:], x0[4:])
    assert len(m.buffer) == 8
    batch_score, sample_scores = m.scores(to_unit_float(x0[:4]), y0[:4])
    assert torch.allclose(sample_scores, torch.full((4,), 2.0), atol=1e-5)   # its own gradient is in the buffer
    x5, y5 = digits(5, 4)
    novel_batch, novel = m.scores(to_unit_float(x5), y5)
    assert (novel < 1).all() and novel_batch < 1                          # points away from every stored gradient
    # offered again, the redundant digit-0 batch is refused; the novel digit-5 batch gets in
    before = m.buffer.get("labels")[0].clone()
    m.buffer.add(examples=x0[:4], labels=y0[:4], batch_score=batch_score, sample_scores=sample_scores)
    assert torch.equal(m.buffer.get("labels")[0], before)
    for _ in range(5):
        m.buffer.add(examples=x5, labels=y5, batch_score=novel_batch, sample_scores=novel)
    assert (m.buffer.get("labels")[0] == 5).sum() >= 2 and len(m.buffer) == 8


def test_gss_factored_cosines_match_the_explicit_per_sample_gradients():
    """On the MLP, GSS's cosines come from the Linear layers' gradient factors (Gram matrices of output gradients
    and inputs); they equal the cosines of vmap's explicit per-sample gradients up to float rounding."""
    from gcl.methods.gss import factored_gradient_cosines, mlp_gradient_factors
    m = make_method("gss", buffer=8, lr=0.1, batch=4, replay_batch=4, gss_minibatch=7)
    torch.manual_seed(0)
    x, y = torch.rand(11, 1, 28, 28), torch.randint(0, 10, (11,))
    x[2] = 0.0                                       # a sample with an input of zeros still has bias gradients
    grads = m.per_sample_grads(x, y)                 # vmap over the network's own parameters
    for n_new in (1, 4):
        batch_cos, sample_cos = gradient_cosines([g[:n_new] for g in grads], [g[n_new:] for g in grads])
        fast_batch, fast_sample = factored_gradient_cosines(mlp_gradient_factors(m.net, x, y), n_new)
        assert fast_sample.shape == (n_new, 11 - n_new) and fast_batch.shape == (11 - n_new,)
        assert torch.allclose(fast_sample, sample_cos, atol=1e-5) and torch.allclose(fast_batch, batch_cos, atol=1e-5)
    assert torch.equal(m.score_cosines(x, y, 4)[1], factored_gradient_cosines(mlp_gradient_factors(m.net, x, y), 4)[1])
    assert all(p.grad is None for p in m.net.parameters())      # nothing accumulated into the network


def gss_on_resnet(channels_last: bool):
    from gcl.core.backbones import build_backbone
    torch.manual_seed(0)
    net = build_backbone("resnet18", (3, 8, 8), 10, channels_last=channels_last)
    ctx = MethodContext(device=CPU, n_classes=10, train_transform=to_unit_float,
                        generator=torch.Generator().manual_seed(0))
    return METHODS["gss"](net, run_settings("gss", buffer=6, lr=0.05, batch=4, replay_batch=4, gss_minibatch=4), ctx)


@pytest.mark.slow
@pytest.mark.parametrize("channels_last, bf16", [(True, False), (False, True), (True, True)])
def test_gss_under_channels_last_and_bf16(channels_last, bf16):
    """Per-sample gradients run under vmap, which can neither make a per-sample input channels_last nor take
    autocast's bf16 casts through batch norm: they are taken in fp32, the input's layout left as it is."""
    plain, other = gss_on_resnet(False), gss_on_resnet(channels_last)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):    # the third batch is scored against a filled buffer and replaces rows
        x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (4,), generator=g)
        plain.observe(to_unit_float(x), y, x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            other.observe(to_unit_float(x), y, x)
    assert other.buffer.fields["scores"].dtype == torch.float32 and len(other.buffer) == 6
    assert torch.isfinite(other.buffer.fields["scores"]).all()
    if not bf16:   # channels_last alone: the same numbers up to the convolutions' float rounding
        assert torch.allclose(other.buffer.fields["scores"], plain.buffer.fields["scores"], atol=5e-3)
        assert torch.equal(other.buffer.fields["labels"], plain.buffer.fields["labels"])


# --- end to end ------------------------------------------------------------------------------------

TINY_MNIST360 = {"kind": "mnist-360", "source": "synthetic", "backbone": "mlp", "epochs": 1}   # as conftest's
RUNS = {
    "der": {"replay_batch": 8, "alpha": 0.5},
    "derpp": {"replay_batch": 8, "alpha": 0.5, "beta": 1.0},
    "agem": {"replay_batch": 16},
    "gss": {"replay_batch": 8, "gss_minibatch": 10, "batch_num": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_trains_end_to_end_without_task_boundaries(name, tiny_mnist360, monkeypatch):
    bench, bench_cfg = tiny_mnist360
    cls = METHODS[name]
    assert not cls.needs_boundaries and cls.uses_buffer

    def refuse(self, task):
        raise AssertionError(f"{name} was told of task {task}")

    seen = {}
    finish = cls.finish
    monkeypatch.setattr(cls, "begin_task", refuse)
    monkeypatch.setattr(cls, "end_task", refuse)
    monkeypatch.setattr(cls, "finish", lambda self: (seen.setdefault("method", self), finish(self)))
    params = {"seeds": [0], "sources": {"synthetic": {}}, "benchmarks": {"b": TINY_MNIST360}, "methods": {name: {}},
              "runs": {"r": {"benchmark": "b", "method": name, "buffer": 40, "lr": 0.1, "batch": 4, **RUNS[name]}}}
    spec = resolve_run(params, "r")
    assert spec.benchmark == bench_cfg
    result = run_seed(bench, spec.benchmark, spec.run, 0, CPU)
    method = seen["method"]
    assert result.steps > 20 and 0.0 <= result.class_il <= 100.0
    assert all(math.isfinite(v) for v in result.loss_curve)
    assert len(method.buffer) == 40
    assert set(method.buffer.get("labels")[0].tolist()) <= set(range(9))
    assert result.class_il > 100.0 / 9   # above chance on the separable synthetic digits


def test_params_validation_reads_each_methods_hyperparameters():
    params = {"seeds": [0], "sources": {"mnist-bundled": {}},
              "benchmarks": {"b": {"kind": "mnist-360", "source": "mnist-bundled", "backbone": "mlp", "epochs": 1}},
              "methods": {"derpp": {}, "gss": {}},
              "runs": {"r": {"benchmark": "b", "method": "derpp", "buffer": 200, "lr": 0.2, "batch": 16,
                             "replay_batch": 16, "alpha": 0.5},
                       "g": {"benchmark": "b", "method": "gss", "buffer": 200, "lr": 0.1, "batch": 4,
                             "replay_batch": 16, "gss_minibatch": 16}}}
    with pytest.raises(ParamsError, match="beta"):
        resolve_run(params, "r")
    assert resolve_run(params, "g").run.batch_num == 1
