"""The boundary-aware rehearsal baselines GEM, iCaRL, FDR and HAL: their pure pieces on hand-made numbers
(QP projection, herding, nearest mean, function distance, anchors, ring buffer), their updates against a
re-computation, the round trip of their cross-task state, and runs on a small synthetic seq-MNIST."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gcl.config import resolve_run
from gcl.core.backbones import MLP, Backbone
from gcl.data import sequential
from gcl.data.transforms import to_unit_float
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import TaskData
from gcl.methods.fdr import function_distance
from gcl.methods.gem import project
from gcl.methods.hal import RingBuffer, optimise_anchors
from gcl.methods.icarl import herding
from gcl.training.train import run_seed
from helpers import benchmark_settings, run_settings, synthetic_source

CPU = torch.device("cpu")
SETTINGS = {
    "gem": {"gamma": 0.5},
    "icarl": {"wd_reg": 1e-5},
    "fdr": {"replay_batch": 6},
    "hal": {"replay_batch": 6, "hal_lambda": 0.1, "beta": 0.5, "gamma": 0.1, "anchor_steps": 20},
}


def make_method(name: str, seed: int = 0, buffer: int = 40, net: nn.Module | None = None, **cfg):
    torch.manual_seed(seed)
    net = net if net is not None else MLP((1, 28, 28), 10)
    ctx = MethodContext(device=CPU, n_classes=10, train_transform=to_unit_float,
                        generator=torch.Generator().manual_seed(seed), plain_transform=to_unit_float)
    return METHODS[name](net, run_settings(name, buffer, **{"lr": 0.1, "batch": 5, **SETTINGS[name], **cfg}), ctx)


def task(t: int, per_class: int = 12) -> TaskData:
    """Task t of a 5 x 2 split of the synthetic digits: classes 2t and 2t+1."""
    src = synthetic_source(per_class=per_class)
    keep = (src["train_y"] // 2) == t
    return TaskData(index=t, x_raw=src["train_x"][keep], y=src["train_y"][keep], classes=(2 * t, 2 * t + 2))


def run_tasks(m, n_tasks: int, steps: int = 3):
    """begin_task, a few stream batches, end_task, for tasks 0..n_tasks-1."""
    for t in range(n_tasks):
        data = task(t)
        m.begin_task(data)
        for s in range(steps):
            idx = torch.arange(s * 5, s * 5 + 5) % len(data.y)
            m.observe(to_unit_float(data.x_raw[idx]), data.y[idx], data.x_raw[idx])
        m.end_task(data)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


# --- GEM -------------------------------------------------------------------------------------------

def test_gem_projection_satisfies_every_constraint():
    gen = torch.Generator().manual_seed(0)
    projected = 0
    for _ in range(100):
        g = torch.randn(30, generator=gen, dtype=torch.float64)
        G = torch.randn(4, 30, generator=gen, dtype=torch.float64)
        out = project(g, G, margin=0.0)
        if (G @ g >= 0).all():
            assert out is g
        else:
            projected += 1
            # KKT of the regularised dual: G g~ = lambda - eps v >= -eps v, a few 1e-3 at most here
            assert (G @ out >= -1e-3 * g.norm() * G.norm(dim=1)).all()
            assert (G @ out).min() > (G @ g).min()        # the worst conflict is removed
    assert projected > 50


def test_gem_projection_leaves_a_gradient_without_conflict_unchanged():
    g = torch.tensor([1.0, 2.0, 3.0])
    G = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 1.0]])    # dots 1 and 1: no conflict
    assert project(g, G, margin=0.5) is g
    assert project(g, G[:0], margin=0.5) is g                # no memory yet


def test_gem_projection_with_one_conflict_is_the_analytic_projection():
    g = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    r1 = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)  # g . r1 = -1: conflicts
    r2 = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)   # g . r2 = 3, orthogonal to r1: stays inactive
    out = project(g, torch.stack([r1, r2]), margin=0.0)
    analytic = g - (g @ r1) / (r1 @ r1) * r1                  # [1.5, 1.5, 3]
    assert torch.allclose(analytic, torch.tensor([1.5, 1.5, 3.0], dtype=torch.float64))
    # the regularised QP (eps = 1e-3 on the diagonal, as the reference) is exact for ||r1||^2 + eps
    assert torch.allclose(out, g - (g @ r1) / (r1 @ r1 + 1e-3) * r1, atol=1e-10)
    assert torch.allclose(out, analytic, atol=1e-3)
    assert torch.allclose(project(g, torch.stack([r1, r2]), margin=0.0, eps=1e-12), analytic, atol=1e-9)
    # margin 0.5 bounds every dual variable below (GEM's code): v1 = max(0.5, 1/2.001) = 0.5, and r2, though
    # not in conflict, also gets v2 = 0.5: g + 0.5 r1 + 0.5 r2 = [1.5, 1.5, 3.5]
    pushed = project(g, torch.stack([r1, r2]), margin=0.5)
    assert torch.allclose(pushed, torch.tensor([1.5, 1.5, 3.5], dtype=torch.float64), atol=1e-10)


def test_gem_projection_on_float32_gradients_matches_the_float64_host_formula():
    """G G^T and G g are built where the gradients are; the result equals the whole computation done in
    float64 with NumPy (the reference's way) to float32 rounding, in the gradient's dtype."""
    import numpy as np
    import quadprog
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(500, generator=gen)
    G = torch.randn(3, 500, generator=gen) - 0.2 * g          # conflicting references
    out = project(g, G, margin=0.5)
    mem, grad = G.double().numpy(), g.double().numpy()
    P = mem @ mem.T + 1e-3 * np.eye(3)
    v = quadprog.solve_qp(0.5 * (P + P.T), -(mem @ grad), np.eye(3), np.full(3, 0.5))[0]
    expected = torch.from_numpy(mem.T @ v + grad).float()
    assert out.dtype == torch.float32 and not torch.equal(out, g)
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_gem_memory_is_split_over_the_benchmarks_tasks_and_steps_along_the_projection():
    m = make_method("gem", buffer=40)                  # 5 tasks -> 8 images per task
    run_tasks(m, 2)
    assert m.mem_sizes == [8, 8]
    assert (m.mem_y[:8] // 2 == 0).all() and (m.mem_y[8:] // 2 == 1).all()
    data = task(2)
    x_raw, y = data.x_raw[:5], data.y[:5]
    params = list(m.net.parameters())
    grad = lambda loss: flat(torch.autograd.grad(loss, params))
    g = grad(F.cross_entropy(m.net(to_unit_float(x_raw)), y))
    refs = torch.stack([grad(F.cross_entropy(m.net(to_unit_float(m.mem_x[a:a + 8])), m.mem_y[a:a + 8]))
                        for a in (0, 8)])
    expected = project(g, refs, 0.5)
    before = flat(p.detach() for p in params)
    m.observe(to_unit_float(x_raw), y, x_raw)
    assert torch.allclose(flat(p.detach() for p in params), before - 0.1 * expected, atol=1e-6)
    # G g~ = lambda - eps v >= -eps v: within 1e-3 times the dual values (below 1 here) of the boundary
    assert (refs @ expected >= -1e-3).all() and (refs @ g < 0).any()


# --- iCaRL -----------------------------------------------------------------------------------------

def test_herding_picks_the_hand_computed_exemplars_in_order():
    feats = torch.tensor([[0.0, 0.0], [4.0, 0.0], [1.5, 0.0], [3.0, 0.0]])
    # mean 2.125. k=1: |2.125 - x| = 2.125, 1.875, 0.625, 0.875 -> row 2 (1.5)
    # k=2: |2.125 - (x + 1.5)/2| = 1.375, 0.625, -, 0.125 -> row 3 (3.0)
    # k=3: |2.125 - (x + 4.5)/3| = 0.625, 0.708, -, - -> row 0; then row 1
    assert herding(feats, 3).tolist() == [2, 3, 0]
    assert herding(feats, 10).tolist() == [2, 3, 0, 1]


class Plane(Backbone):
    """A backbone whose features are its 2-pixel input itself (so feature values are hand-made)."""

    def __init__(self):
        super().__init__()
        self.feat_dim = 2
        self.classifier = nn.Linear(2, 10)

    def extract(self, x):
        return x.flatten(1)


def icarl_on_a_plane(**cfg):
    """iCaRL on 2-d features (the input itself): exemplars (3,0), (1,0) of class 0 and (0,2), (1,1) of class 1."""
    m = make_method("icarl", net=Plane(), **cfg)
    m.ctx.plain_transform = lambda x: x.float()
    m.ex_x = torch.tensor([[3.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    m.ex_y = torch.tensor([0, 0, 1, 1])
    m.seen_hi = 2
    m.net.eval()
    return m


def test_nearest_mean_of_exemplars_is_the_nearest_normalised_mean():
    m = icarl_on_a_plane()
    # normalised exemplar features: class 0 (1,0),(1,0) -> mean (1,0); class 1 (0,1),(.707,.707) -> mean
    # (.354,.854), renormalised (.3827,.9239)
    x = torch.tensor([[5.0, 1.0], [1.0, 3.0]])
    scores = m.predict(x)
    mu1 = torch.tensor([math.sin(math.pi / 8), math.cos(math.pi / 8)])
    f = x / x.norm(dim=1, keepdim=True)
    expected = torch.stack([-(f - torch.tensor([1.0, 0.0])).pow(2).sum(1), -(f - mu1).pow(2).sum(1)], 1)
    assert torch.allclose(scores[:, :2], expected, atol=1e-6)
    assert scores.argmax(1).tolist() == [0, 1]
    assert torch.isinf(scores[:, 2:]).all() and (scores[:, 2:] < 0).all()   # unseen classes never win
    assert torch.allclose(m.class_means, torch.stack([torch.tensor([1.0, 0.0]), mu1]), atol=1e-6)


def test_icarl_distils_from_a_frozen_old_network():
    m = make_method("icarl", buffer=20)
    run_tasks(m, 1)
    assert len(m.ex_y) == 20 and torch.bincount(m.ex_y).tolist() == [10, 10]
    frozen = [p.detach().clone() for p in m.old_net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(frozen, m.net.parameters()))    # a copy at the task's end
    assert not any(p.requires_grad for p in m.old_net.parameters()) and not m.old_net.training
    data = task(1)
    m.begin_task(data)
    x_raw, y = data.x_raw[:5], data.y[:5]
    x = to_unit_float(x_raw)
    # the loss by hand: BCE over classes 0..3, old network's sigmoid on 0..1, one-hot on 2..3
    targets = torch.cat([torch.sigmoid(m.old_net(x)[:, :2]), F.one_hot(y, 10)[:, 2:4].float()], 1)
    expected = F.binary_cross_entropy_with_logits(m.net(x)[:, :4], targets) \
        + 1e-5 * sum(p.pow(2).sum() for p in m.net.parameters())
    assert m.loss(x, y).item() == pytest.approx(expected.item(), rel=1e-6)
    for s in range(3):
        m.observe(x, y, x_raw)
    assert not all(torch.equal(a, b) for a, b in zip(frozen, m.net.parameters()))      # the net moved
    assert all(torch.equal(a, b) for a, b in zip(frozen, m.old_net.parameters()))      # the old one did not
    assert all(p.grad is None for p in m.old_net.parameters())
    m.end_task(data)    # 4 classes seen: 5 exemplars each, old classes cut to their first 5 (herding order)
    assert torch.bincount(m.ex_y).tolist() == [5, 5, 5, 5]


def test_raw_features_give_the_nearest_raw_mean():
    """`features: raw` (the reference framework): herding, class means and distances on unnormalised features."""
    m = icarl_on_a_plane(features="raw")
    x = torch.tensor([[5.0, 1.0], [1.0, 3.0]])
    means = torch.tensor([[2.0, 0.0], [0.5, 1.5]])
    expected = -(x[:, None, :] - means[None]).pow(2).sum(2)
    assert torch.allclose(m.predict(x)[:, :2], expected, atol=1e-6)
    assert torch.allclose(m.class_means, means)
    assert torch.equal(m._features(m.ex_x), m.ex_x)


def test_icarl_takes_the_reference_step_count_at_a_large_buffer():
    """The reference trains on the task's images and the exemplars merged: ceil((images + memory) / batch)
    SGD steps of `batch` per pass; here 24 images and 20 exemplars at batch 5 -> 9 steps (the stream has 5)."""
    m = make_method("icarl", buffer=20)
    run_tasks(m, 1)
    sizes = []
    loss = m.loss
    m.loss = lambda x, y: (sizes.append(len(y)), loss(x, y))[1]
    data = task(1)
    m.begin_task(data)
    shown = []
    for s in range(5):                   # one pass over the task: 4 batches of 5 and one of 4
        idx = torch.arange(s * 5, min(s * 5 + 5, 24))
        m.observe(to_unit_float(data.x_raw[idx]), data.y[idx], data.x_raw[idx])
        shown.append(len(idx))
    m.end_task(data)
    assert sum(shown) == 24 and len(shown) == 5
    assert sizes == [5] * 8 + [4] and len(sizes) == math.ceil((24 + 20) / 5)


def _icarl_passes(m, data: TaskData, passes: int) -> tuple[list[int], list[list[int]]]:
    """`passes` passes over `data` in stream batches of 5 (the last one shorter), as the stream cuts them;
    the sizes of the SGD batches iCaRL trained, and the exemplars each pass replayed."""
    sizes, replayed = [], []
    loss, pick = m.loss, m._exemplars_of_step

    def counted_loss(x, y):
        sizes.append(len(y))
        return loss(x, y)

    def recorded_pick(i):
        if i == 0:
            replayed.append([])
        idx = pick(i)
        replayed[-1].extend(idx.tolist())
        return idx

    m.loss, m._exemplars_of_step = counted_loss, recorded_pick
    m.begin_task(data)
    n = len(data.y)
    for _ in range(passes):
        for lo in range(0, n, 5):
            idx = torch.arange(lo, min(lo + 5, n))
            m.observe(to_unit_float(data.x_raw[idx]), data.y[idx], data.x_raw[idx])
    return sizes, replayed


def test_icarl_replays_every_exemplar_once_per_pass_and_ends_each_pass_with_the_rest():
    """As the reference's merged loader: per pass, each exemplar once and ceil((images + memory) / batch) SGD
    steps, the last one smaller (here 24 images + 20 exemplars at batch 5: 8 of 5 and 1 of 4, twice)."""
    m = make_method("icarl", buffer=20)
    run_tasks(m, 1)
    sizes, replayed = _icarl_passes(m, task(1), passes=2)
    assert [sorted(r) for r in replayed] == [list(range(20))] * 2
    assert sizes == ([5] * 8 + [4]) * 2
    assert m.carry_x is None


def test_icarl_trains_a_pooled_step_shorter_than_a_batch():
    """21 images at batch 5 (a last stream batch of 1) and 2 exemplars: the second pass's last step pools fewer
    than 5 images (what crashed seq-cifar10 at buffer 200); it is trained as the pass's last batch, nothing lost."""
    m = make_method("icarl", buffer=2)
    run_tasks(m, 1)
    data = task(1)
    short = TaskData(index=1, x_raw=data.x_raw[:21], y=data.y[:21], classes=data.classes)
    sizes, replayed = _icarl_passes(m, short, passes=2)
    assert sum(sizes) == 2 * (21 + 2) and len(sizes) == 2 * math.ceil(23 / 5)
    assert sizes[-1] < 5 and [sorted(r) for r in replayed] == [[0, 1]] * 2


# --- FDR -------------------------------------------------------------------------------------------

def test_function_distance_matches_hand_computation():
    outputs = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])      # softmax (.25,.75) and (.5,.5)
    stored = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    # row 1: ||(-.75, .75)|| = .75 sqrt 2; row 2: 0; mean over the batch
    assert function_distance(outputs, stored).item() == pytest.approx(0.75 * math.sqrt(2) / 2, rel=1e-6)


def test_fdr_memory_is_rebalanced_and_stores_softmax_at_task_end():
    m = make_method("fdr", buffer=20)
    run_tasks(m, 1)
    assert len(m.mem_x) == 20 and (m.mem_t == 0).all()
    first = m.mem_x[:10].clone()
    probs = F.softmax(m.net(to_unit_float(m.mem_x)), 1)
    assert torch.allclose(m.mem_p, probs, atol=1e-6)                   # outputs of the network at the end
    data = task(1)      # a second task: 20 // 2 = 10 each, task 0 cut to its first 10
    m.begin_task(data)
    m.end_task(data)
    assert m.mem_t.tolist() == [0] * 10 + [1] * 10
    assert torch.equal(m.mem_x[:10], first)
    assert torch.allclose(m.mem_p[:10], probs[:10])
    assert all(any(torch.equal(img, other) for other in data.x_raw) for img in m.mem_x[10:])   # task 1's images


def test_fdr_takes_a_function_space_step_after_each_ordinary_step():
    m = make_method("fdr", buffer=20)
    run_tasks(m, 1)
    data = task(1)
    x_raw, y = data.x_raw[:5], data.y[:5]
    x = to_unit_float(x_raw)
    state = m.ctx.generator.get_state()
    idx = torch.randperm(20, generator=m.ctx.generator)[:6]
    m.ctx.generator.set_state(state)
    # by hand: SGD on CE, then SGD on the function distance at the new weights
    ref = MLP((1, 28, 28), 10)
    ref.load_state_dict(m.net.state_dict())
    for loss_fn in (lambda: F.cross_entropy(ref(x), y),
                    lambda: function_distance(ref(to_unit_float(m.mem_x[idx])), m.mem_p[idx])):
        grads = torch.autograd.grad(loss_fn(), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.1 * g
    fd = m.observe(x, y, x_raw)
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(m.net.parameters(), ref.parameters()))
    assert fd.item() > 0


# --- HAL -------------------------------------------------------------------------------------------

def test_ring_buffer_keeps_the_newest_per_class():
    ring = RingBuffer(n_classes=3, per_class=2, device=CPU, generator=torch.Generator().manual_seed(0))
    x = torch.arange(5)[:, None].float()
    ring.add(x, torch.tensor([0, 0, 0, 1, 0]))          # class 0 gets 0,1,2,4: keeps the last two (2, 4)
    ring.add(torch.tensor([[9.0]]), torch.tensor([1]))   # class 1: 3, 9
    assert ring.counts.tolist() == [4, 2, 0]
    kept = {(int(v), int(c)) for v, c in zip(ring.examples[:6, 0], ring.labels) if c < 2}
    assert kept == {(2, 0), (4, 0), (3, 1), (9, 1)}
    bx, by = ring.sample(10)                              # only the 4 filled slots, each once
    assert len(by) == 4 and sorted(bx[:, 0].tolist()) == [2.0, 3.0, 4.0, 9.0]
    assert all(int(c) == {2: 0, 4: 0, 3: 1, 9: 1}[int(v)] for v, c in zip(bx[:, 0], by))


def test_hal_reservoir_memory_keeps_what_the_reference_keeps():
    """The reference's 'ring' is a reservoir over the whole stream: after two tasks (40 images, 4 classes) a
    buffer of 40 holds all of them (10 per class on average), where the paper's ring keeps 40 // 10 = 4
    per class (16); neither is emptied at the task boundary."""
    ring, reservoir = make_method("hal", buffer=40), make_method("hal", buffer=40, memory="reservoir")
    for m in (ring, reservoir):
        run_tasks(m, 2, steps=4)
    assert int(ring.store.filled().sum()) == 16 and ring.store.counts[:4].tolist() == [12, 8, 12, 8]
    x, y = reservoir.store.buffer.get("examples", "labels")
    assert reservoir.store.buffer.seen == 40 and len(y) == 40 and torch.bincount(y).tolist() == [12, 8, 12, 8]
    bx, by = reservoir.store.sample(6)
    assert bx.dtype == torch.uint8 and len(by) == 6
    fresh = make_method("hal", buffer=40, memory="reservoir", seed=3)
    fresh.load_state_dict(reservoir.state_dict())
    assert torch.equal(fresh.store.buffer.get("examples")[0], x)


def test_anchor_objective_decreases_and_anchors_are_one_per_class_seen():
    torch.manual_seed(0)
    net_t, net_m = MLP((1, 4, 4), 4), MLP((1, 4, 4), 4)
    init = torch.rand(2, 1, 4, 4)
    _, curve = optimise_anchors(net_t, net_m, init, torch.tensor([0, 1]), torch.zeros(100), 0.1, 0.1, 30)
    assert len(curve) == 31 and curve[-1] < curve[0]
    assert (curve[1:] <= curve[:-1] + 1e-6).float().mean() > 0.9       # (nearly) monotone descent
    m = make_method("hal", buffer=40)
    run_tasks(m, 2)
    assert m.anchors.shape == (4, 1, 28, 28) and m.anchor_classes.tolist() == [0, 1, 2, 3]
    assert m.last_anchor_curve[-1] < m.last_anchor_curve[0]


def test_hal_update_is_er_plus_the_anchor_stability_gradient():
    m = make_method("hal", buffer=40, hal_lambda=0.5)
    m.anchors = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    data = task(0)
    x_raw, y = data.x_raw[:5], data.y[:5]
    x = to_unit_float(x_raw)                               # empty ring buffer: no replay on this step
    params = list(m.net.parameters())
    g_ce = torch.autograd.grad(F.cross_entropy(m.net(x), y), params)
    ref = MLP((1, 28, 28), 10)
    ref.load_state_dict(m.net.state_dict())
    with torch.no_grad():
        for p, g in zip(ref.parameters(), g_ce):
            p -= 0.1 * g
        tilde = ref(m.anchors)
    g_stab = torch.autograd.grad(0.5 * (tilde - m.net(m.anchors)).pow(2).mean(), params)
    expected = [p.detach() - 0.1 * (a + b) for p, a, b in zip(params, g_ce, g_stab)]
    m.observe(x, y, x_raw)
    assert all(torch.allclose(p, e, atol=1e-6) for p, e in zip(params, expected))
    assert flat(g_stab).norm() > 0
    assert torch.allclose(m.phi, 0.5 * m.net.features(x).mean(0), atol=1e-6)   # beta 0.5 from phi = 0


# --- cross-task state ------------------------------------------------------------------------------

def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _assert_same(u, v)
    else:
        assert a == b


@pytest.mark.parametrize("name, keys", [
    ("gem", {"mem_x", "mem_y", "mem_sizes"}),
    ("icarl", {"ex_x", "ex_y", "old_net", "class_means", "seen_hi", "task_lo", "steps_per_pass", "task_step",
              "replay_order", "carry_x", "carry_y"}),
    ("fdr", {"mem_x", "mem_p", "mem_t", "tasks_seen"}),
    ("hal", {"memory", "anchors", "anchor_classes", "phi"}),
])
def test_state_dict_round_trips_the_cross_task_state(name, keys):
    m = make_method(name)
    run_tasks(m, 2)
    state = m.state_dict()
    assert set(state) == keys | {"net"}
    fresh = make_method(name, seed=5)
    fresh.load_state_dict(state)
    _assert_same(state, fresh.state_dict())
    x = to_unit_float(task(1).x_raw[:6])
    m.net.eval(), fresh.net.eval()
    assert torch.equal(m.predict(x), fresh.predict(x))
    if name == "icarl":
        assert all(torch.equal(p, q) for p, q in zip(m.old_net.parameters(), fresh.old_net.parameters()))
    data = task(2)      # and the restored method carries on identically
    for mm in (m, fresh):
        mm.net.train()
        mm.begin_task(data)
        mm.ctx.generator.manual_seed(3)
        mm.observe(to_unit_float(data.x_raw[:5]), data.y[:5], data.x_raw[:5])
    assert all(torch.equal(p, q) for p, q in zip(m.net.parameters(), fresh.net.parameters()))


# --- end to end ------------------------------------------------------------------------------------

TINY_SEQ = {"kind": "sequential", "source": "synthetic", "backbone": "mlp", "epochs": 1, "n_tasks": 5,
            "classes_per_task": 2, "augment": False}


@pytest.fixture(scope="module")
def tiny_seq():
    return sequential.build_benchmark(synthetic_source(per_class=40), benchmark_settings(**TINY_SEQ).data())


def _run(tiny_seq, name, buffer, **extra):
    params = {"seeds": [0], "sources": {"synthetic": {}}, "benchmarks": {"b": TINY_SEQ}, "methods": {name: {}},
              "runs": {"r": {"benchmark": "b", "method": name, "buffer": buffer, "lr": 0.1, "batch": 10, **extra}}}
    spec = resolve_run(params, "r")
    return run_seed(tiny_seq, spec.benchmark, spec.run, 0, CPU)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_learns_a_small_sequential_benchmark(name, tiny_seq):
    cls = METHODS[name]
    assert cls.needs_boundaries and cls.uses_buffer
    sgd = _run(tiny_seq, "sgd", "none")
    r = _run(tiny_seq, name, 40, **SETTINGS[name])
    assert len(r.acc_matrix) == 5 and all(math.isfinite(v) for v in r.loss_curve)
    assert r.class_il > sgd.class_il + 20 or r.task_il > 80
    assert r.task_il > 80          # chance is 50
