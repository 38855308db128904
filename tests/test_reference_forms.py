"""The forms of ER, DER++ and the classifier that the ER-ACE paper's code computes (its `distLinear` head, ER's two
passes with added losses, DER++'s one split draw), each against a hand computation, and the settings that choose them."""
import math

import pytest
import torch
import torch.nn.functional as F

from gcl.config import ParamsError, resolve_run
from gcl.core.backbones import CosineClassifier, build_backbone
from gcl.data.transforms import to_unit_float
from gcl.methods import METHODS, MethodContext
from gcl.training.stacking import unstackable
from helpers import CountingNet, run_settings, small_er_run

CPU = torch.device("cpu")


def test_cosine_head_scores_are_scale_times_the_cosines_with_eps_added_to_each_norm():
    head = CosineClassifier(2, 3, scale=10.0)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
    scores = head(torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64).float())
    eps = 1e-5
    x = (3 / (5 + eps), 4 / (5 + eps))                          # |(3, 4)| = 5
    w = [(1 / (1 + eps), 0.0), (0.0, 2 / (2 + eps)), (1 / (math.sqrt(2) + eps), 1 / (math.sqrt(2) + eps))]
    by_hand = [10 * (x[0] * wc[0] + x[1] * wc[1]) for wc in w]  # 6.0, 8.0, 9.899...
    assert scores[0].tolist() == pytest.approx(by_hand, rel=1e-6)
    assert by_hand[0] == pytest.approx(6.0, abs=1e-3) and by_hand[2] == pytest.approx(7 / math.sqrt(2) * 2, abs=1e-3)
    assert scores[1].tolist() == [0.0, 0.0, 0.0]                # a zero feature vector: no NaN, no score
    assert not hasattr(head, "bias") and head.weight.shape == (3, 2)


def test_the_cosine_head_leaves_the_body_as_the_linear_one_draws_it():
    torch.manual_seed(3)
    linear = build_backbone("resnet18", (3, 32, 32), 10, width=4)
    torch.manual_seed(3)
    cosine = build_backbone("resnet18", (3, 32, 32), 10, width=4, channels_last=True, head="cosine", head_scale=16.0)
    assert isinstance(cosine.classifier, CosineClassifier) and cosine.classifier.scale == 16.0
    body = {k: v for k, v in linear.state_dict().items() if not k.startswith("classifier")}
    assert all(torch.equal(v, cosine.state_dict()[k]) for k, v in body.items())
    x = torch.rand(2, 3, 32, 32)
    cosine.eval()
    assert cosine(x).abs().max() <= 16.0 + 1e-4            # |scores| <= scale
    with pytest.raises(ValueError, match="unknown head 'arc'"):
        build_backbone("mlp", (1, 28, 28), 10, head="arc")


def make(name: str, buffer: int = 8, **cfg):
    torch.manual_seed(0)
    ctx = MethodContext(device=CPU, n_classes=4, train_transform=lambda v: v.float(),
                        generator=torch.Generator().manual_seed(0), plain_transform=to_unit_float)
    settings = run_settings(name, buffer, **{"lr": 0.1, "batch": 4, "replay_batch": 2, **cfg})
    return METHODS[name](CountingNet(4, 3, 4), settings, ctx)


def fill(m, n: int = 8):
    """The buffer filled with n known samples (examples 0..n-1 as 4-vectors, labels i % 4, logits i)."""
    x = torch.arange(4 * n, dtype=torch.float32).view(n, 4) / 10
    fields = {"examples": x, "labels": torch.arange(n) % 4}
    if m.name.startswith("der"):
        fields["logits"] = torch.arange(4 * n, dtype=torch.float32).view(n, 4) / 7
    m.buffer.add(**fields)
    return fields


def step_by_hand(m, loss_of):
    """The weights after one SGD step on loss_of(net) of a copy of m's net (the same BatchNorm state)."""
    import copy
    net = copy.deepcopy(m.net)
    loss = loss_of(net)
    grads = torch.autograd.grad(loss, list(net.parameters()))
    return loss.detach(), [p.detach() - 0.1 * g for p, g in zip(net.parameters(), grads)]


def test_er_separate_passes_add_the_two_mean_losses_and_joint_takes_one_mean_over_both():
    x, y = torch.rand(4, 4), torch.tensor([0, 1, 2, 3])
    for form in ("joint", "separate"):
        m = make("er", replay_pass=form)
        stored = fill(m)
        idx = torch.tensor([5, 2])
        m.buffer.sample_indices = lambda size: idx            # the draw is fixed: the loss is then known
        bx, by = stored["examples"][idx], stored["labels"][idx]
        if form == "joint":
            want, weights = step_by_hand(m, lambda n: F.cross_entropy(n(torch.cat([x, bx])), torch.cat([y, by])))
        else:
            want, weights = step_by_hand(m, lambda n: F.cross_entropy(n(x), y) + F.cross_entropy(n(bx), by))
        m.net.passes.clear()
        got = m.observe(x, y, x)
        assert m.net.passes == ([6] if form == "joint" else [4, 2])
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
        assert all(torch.allclose(p, w, atol=1e-7) for p, w in zip(m.net.parameters(), weights))
    assert make("er").cfg.replay_pass == "joint"               # the DER framework's ER stays the default


def test_derpp_split_draw_replays_the_halves_of_one_batch_in_one_pass():
    x, y = torch.rand(4, 4), torch.tensor([0, 1, 2, 3])
    m = make("derpp", alpha=0.3, beta=0.7, replay_draw="split")
    stored = fill(m)
    draws = []
    idx = torch.tensor([6, 1, 3, 0])
    m.buffer.sample_indices = lambda size: draws.append(size) or idx[:size]
    bx, bz, by = stored["examples"][idx], stored["logits"][idx], stored["labels"][idx]

    def loss(n):
        out = n(bx)
        return (F.cross_entropy(n(x), y) + 0.3 * F.mse_loss(out[:2], bz[:2]) + 0.7 * F.cross_entropy(out[2:], by[2:]))

    want, weights = step_by_hand(m, loss)
    m.net.passes.clear()
    got = m.observe(x, y, x)
    assert draws == [4] and sorted(m.net.passes) == [4, 4]    # one draw of 2 x 2, the stream's pass and one more
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert all(torch.allclose(p, w, atol=1e-7) for p, w in zip(m.net.parameters(), weights))
    independent = make("derpp", alpha=0.3, beta=0.7)
    fill(independent)
    sizes = []
    independent.buffer.sample_indices = lambda size: sizes.append(size) or idx[:size]
    independent.observe(x, y, x)
    assert sizes == [2, 2] and independent.net.passes == [4, 2, 2]


def test_the_forms_are_validated_before_training(tmp_path, monkeypatch):
    with pytest.raises(Exception, match="replay_draw: split needs batch >= 2"):
        run_settings("derpp", 10, lr=0.1, batch=1, replay_batch=2, alpha=0.1, beta=0.5, replay_draw="split")
    with pytest.raises(Exception, match="replay_pass"):
        run_settings("er", 10, lr=0.1, batch=2, replay_batch=2, replay_pass="twice")
    monkeypatch.chdir(tmp_path)
    training = small_er_run([0, 1]).benchmark          # an MLP benchmark, where seeds stack
    assert unstackable(training, run_settings("er", 10, lr=0.1, batch=2, replay_batch=2)) is None
    # both reference forms stack (one step over the seed axis; tests/test_stacking.py compares them with lone seeds)
    split = run_settings("derpp", 10, lr=0.1, batch=2, replay_batch=2, alpha=0.1, beta=0.5, replay_draw="split")
    assert unstackable(training, split) is None
    separate = run_settings("er", 10, lr=0.1, batch=2, replay_batch=2, replay_pass="separate")
    assert unstackable(training, separate) is None
    cosine = run_settings("er", 10, lr=0.1, batch=2, replay_batch=2, head="cosine")
    assert "head is linear, not cosine" in unstackable(training, cosine)


def test_a_method_that_trains_only_the_linear_head_refuses_the_cosine_one():
    bench = {"kind": "sequential", "source": "synthetic", "backbone": "mlp", "n_tasks": 5, "classes_per_task": 2,
             "epochs": 1}
    params = {"seeds": [0], "device": "cpu", "sources": {"synthetic": {}}, "benchmarks": {"seq": bench},
              "methods": {"er": {"head": "cosine"}, "lwf": {}},
              "runs": {"er-50": {"benchmark": "seq", "method": "er", "buffer": 50, "lr": 0.1, "batch": 4,
                                 "replay_batch": 8},
                       "lwf-none": {"benchmark": "seq", "method": "lwf", "buffer": "none", "lr": 0.1, "batch": 4, "alpha": 1.0,
                                    "head": "cosine"}}}
    assert resolve_run(params, "er-50").run.head == "cosine"    # the method's block sets it for its runs
    with pytest.raises(ParamsError, match=r"runs.lwf-none.head: lwf trains only the linear head, not 'cosine'"):
        resolve_run(params, "lwf-none")
