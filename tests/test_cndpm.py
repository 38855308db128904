"""CN-DPM: the DP prior's counts, the sharpened classifier NLL, Adam, expert 0, the expert cap, checkpoints,
a two-class stream that must grow a second expert, and the sequential benchmark's normalize/class_order options."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from pydantic import ValidationError

from gcl.config import check_data, check_runs
from gcl.core.backbones import MLP
from gcl.data import sequential
from gcl.data.class_orders import CIFAR100_SUPERCLASS, CLASS_ORDERS
from gcl.methods import METHODS, MethodContext
from gcl.methods.cndpm import Adam, chilled_nll
from gcl.training.train import run_seed
from helpers import run_settings, sequential_settings, synthetic_source
from image_fixtures import labelled_source

CPU = torch.device("cpu")
SMALL = dict(arch="mlp", lr=1e-3, lr_vae=1e-3, batch=10, log_alpha=-60.0, stm_capacity=30,
             sleep_steps_vae=300, sleep_steps_cls=200, sleep_batch=20, z_dim=4, z_samples=4,
             vae_width=16, vae_ext=8, cls_width=16, cls_ext=8)


def make(n_classes=2, seed=0, **over):
    torch.manual_seed(seed)
    ctx = MethodContext(device=CPU, n_classes=n_classes, train_transform=lambda x: x.float() / 255,
                        generator=torch.Generator().manual_seed(seed))
    return METHODS["cndpm"](MLP((1, 8, 8), n_classes), run_settings("cndpm", **{**SMALL, **over}), ctx)


def blobs(label: int, n: int, seed: int) -> torch.Tensor:
    """8x8 images in [0, 1]: faint noise and a bright 4x4 square, top-left for class 0, bottom-right for 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g) * 0.2
    r = 0 if label == 0 else 4
    x[:, :, r:r + 4, r:r + 4] = 0.9 + 0.1 * torch.rand(n, 1, 4, 4, generator=g)
    return x


def feed(m, label: int, n: int, seed: int):
    x = blobs(label, n, seed)
    for lo in range(0, n, 10):
        xb = x[lo:lo + 10]
        m.observe(xb, torch.full((len(xb),), label), (xb * 255).to(torch.uint8))


# --- the prior ------------------------------------------------------------------------------------

def test_prior_starts_at_alpha_and_a_new_expert_at_stm_size_plus_one():
    m = make(stm_capacity=25)
    assert m.log_counts.tolist() == [-60.0]                     # N_0 = alpha, in log space
    feed(m, 0, 30, seed=1)   # no expert yet: every sample goes to the STM; 30 >= 25 after the third batch
    assert m.n_experts == 1 and int(m.stm_n) == 0
    assert m.log_counts[0].item() == -60.0
    assert m.log_counts[1].item() == pytest.approx(math.log(30 + 1))   # |STM| + 1 (the overshoot included)


def test_a_wake_step_adds_the_batch_responsibilities_and_stm_samples_count_nothing_here():
    m = make()
    feed(m, 0, 30, seed=1)   # expert 1, the STM emptied
    assert m.n_experts == 1 and int(m.stm_n) == 0
    m.experts.append(m._new_expert())                           # expert 2 (untrained: fine, collect is fixed)
    m.log_counts = torch.tensor([-60.0, math.log(5.0), math.log(5.0)])
    # fixed likelihoods: VAE NLL per expert (0, 1, 2); uniform classifiers, so every chilled NLL is log 2
    vae = torch.tensor([[30.0, 10.0, 12.0], [20.0, 300.0, 400.0]], requires_grad=True)
    logp = torch.full((2, 3, 2), math.log(0.5), requires_grad=True)
    m.collect = lambda x, experts: (vae, logp)
    before = m.log_counts.clone()
    m.observe(torch.zeros(2, 1, 8, 8), torch.tensor([0, 1]), torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    # sample 0: nl_joint = (30 + 60, 10 - log 5, 12 - log 5) + log 2 -> expert 1; responsibilities over
    # experts 1, 2 = softmax(-10, -12). Sample 1: 20 + 60 beats 300 - log 5 -> STM; exp(-(300 - 80)) = 0 in float32
    r1 = 1 / (1 + math.exp(-2.0))
    expected = torch.tensor([math.exp(before[0].item()), 5 + r1, 5 + (1 - r1)]).log()
    assert torch.allclose(m.log_counts, expected, atol=1e-6)
    assert m.log_counts[0].item() == -60.0
    assert int(m.stm_n) == 1 and m.stm_y[0].item() == 1


# --- the sharpened NLL ------------------------------------------------------------------------------

def test_chilled_nll_value_is_sharpened_and_its_gradient_is_plain_cross_entropy():
    logits = torch.tensor([[1.0, 0.0], [0.5, 2.0]], requires_grad=True)
    y = torch.tensor([1, 1])
    value = chilled_nll(F.log_softmax(logits, 1), y, 0.01)
    plain = F.cross_entropy(logits, y, reduction="none")
    # row 0: log p gap 1.0 / 0.01 = 100 nats (plain: log(1 + e) = 1.313); row 1: the right class wins, ~0
    assert value[0].item() == pytest.approx(100.0, abs=1e-3) and plain[0].item() == pytest.approx(1.3133, abs=1e-4)
    assert value[1].item() == pytest.approx(0.0, abs=1e-6) and plain[1].item() > 0.2
    g_chilled, = torch.autograd.grad(value.sum(), logits)
    g_plain, = torch.autograd.grad(plain.sum(), logits)
    assert torch.allclose(g_chilled, g_plain)
    p = torch.sigmoid(torch.tensor(1.0)).item()                    # softmax(1, 0)[0]
    assert torch.allclose(g_chilled[0], torch.tensor([p, -p]))     # softmax (p, 1 - p) - one-hot(1)


# --- Adam -----------------------------------------------------------------------------------------

def test_adam_matches_torch_optim_adam_and_a_zero_mask_changes_nothing():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    mine, ref = Adam(a, lr=0.01), torch.optim.Adam(b.parameters(), lr=0.01)
    x = torch.randn(4, 3)
    for i in range(3):
        mine.zero_grad()
        (a(x) ** 2).sum().backward()
        mask = None if i == 0 else torch.tensor(True)           # the masked form with mask 1: the same update
        mine.step(clip=1e9, mask=mask)
        ref.zero_grad()
        (b(x) ** 2).sum().backward()
        ref.step()
        assert all(torch.allclose(p, q, atol=1e-7) for p, q in zip(a.parameters(), b.parameters()))
    saved = {k: v.clone() for k, v in mine.state_dict().items()}
    params = [p.detach().clone() for p in a.parameters()]
    mine.zero_grad()
    (a(x) ** 2).sum().backward()
    mine.step(clip=1e9, mask=torch.tensor(False))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), params))
    assert all(torch.equal(v, saved[k]) for k, v in mine.state_dict().items())


def test_adam_clips_each_gradient_by_value():
    module = torch.nn.Module()
    module.p = torch.nn.Parameter(torch.zeros(2))
    opt = Adam(module, lr=0.1)
    module.p.grad.copy_(torch.tensor([5.0, -0.2]))
    opt.step(clip=0.5)
    assert torch.allclose(opt.m, torch.tensor([0.05, -0.02]))     # (1 - 0.9) * clipped gradient
    assert torch.allclose(opt.v, 0.001 * torch.tensor([0.25, 0.04]))


def test_adam_makes_the_parameters_and_gradients_views_of_flat_tensors():
    """The module's parameters (values unchanged) live in one tensor and backward accumulates into one flat
    gradient: an update of the flat tensor moves every parameter, and a loaded state lands in the flat tensor."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt = Adam(net, lr=0.01)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert opt.params.numel() == sum(p.numel() for p in net.parameters()) == 26
    x = torch.randn(5, 3)
    net(x).square().sum().backward()
    leaves = {k: v.clone().requires_grad_() for k, v in before.items()}
    expected = torch.autograd.grad(torch.func.functional_call(net, leaves, (x,)).square().sum(), list(leaves.values()))
    assert torch.equal(opt.grad, torch.cat([g.reshape(-1) for g in expected]))
    opt.step(clip=1e9)
    assert all(not torch.equal(p, before[k]) for k, p in net.named_parameters())
    assert torch.equal(opt.params, torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    opt.zero_grad()
    assert not opt.grad.any() and all(p.grad is not None and not p.grad.any() for p in net.parameters())
    net.load_state_dict(before)
    assert torch.equal(opt.params, torch.cat([v.reshape(-1) for v in before.values()]))


# --- the two-class stream -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_class_arriving_creates_a_second_expert_and_the_mixture_classifies_both():
    m = make()
    feed(m, 0, 60, seed=1)
    assert m.n_experts == 1
    feed(m, 1, 60, seed=2)
    assert m.n_experts == 2 and m.extra_metrics() == {"experts": 2}
    x = torch.cat([blobs(0, 50, seed=3), blobs(1, 50, seed=4)])
    y = torch.tensor([0] * 50 + [1] * 50)
    scores = m.predict(x)
    assert scores.shape == (100, 2) and torch.isfinite(scores).all()
    assert (scores.argmax(1) == y).float().mean().item() >= 0.95
    # the test-time gate (prior + VAE evidence) sends most of each class to its own expert
    vae, _ = m.collect(x, list(m.experts)[1:])
    gate = (torch.log_softmax(m.log_counts[1:], 0) - vae).argmax(1)
    assert (gate == y).float().mean().item() >= 0.9


@pytest.mark.slow
def test_expert_zero_never_changes():
    m = make()
    feed(m, 0, 10, seed=1)
    frozen = {k: v.clone() for k, v in m.experts[0].state_dict().items()}
    assert not any(p.requires_grad for p in m.experts[0].parameters())
    feed(m, 0, 50, seed=1)
    feed(m, 1, 60, seed=2)
    assert m.n_experts == 2
    assert all(torch.equal(v, frozen[k]) for k, v in m.experts[0].state_dict().items())


@pytest.mark.slow
def test_a_runaway_expert_count_stops_the_run_naming_alpha():
    m = make(log_alpha=1000.0, max_experts=2, stm_capacity=10)   # a new expert always wins
    feed(m, 0, 20, seed=1)
    assert m.n_experts == 2
    with pytest.raises(RuntimeError, match=r"max_experts = 2.*log_alpha = 1000\.0"):
        feed(m, 0, 10, seed=3)


@pytest.mark.slow
def test_state_dict_round_trip_continues_identically():
    a = make()
    feed(a, 0, 60, seed=1)
    feed(a, 1, 25, seed=2)   # inside the STM's fill for class 1 (STM non-empty), after wake steps
    assert a.n_experts == 1 and int(a.stm_n) > 0
    state = a.state_dict()
    b = make(seed=5)
    b.load_state_dict(state)
    assert b.n_experts == 1 and torch.equal(b.log_counts, a.log_counts) and int(b.stm_n) == int(a.stm_n)
    sa, sb = a.experts.state_dict(), b.experts.state_dict()
    assert sa.keys() == sb.keys() and any(".opt_g.m" in k for k in sa)   # Adam moments travel too
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for m in (a, b):   # the same continuation on both: through a sleep, then a wake step
        torch.manual_seed(7)
        feed(m, 1, 35, seed=4)
    assert a.n_experts == b.n_experts == 2 and torch.equal(a.log_counts, b.log_counts)
    sa, sb = a.experts.state_dict(), b.experts.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def two_task_run(stm_capacity: int) -> dict:
    """One seed of CN-DPM on 2 tasks of 2 synthetic classes, 80 training samples per task."""
    settings = seq_settings(n_tasks=2, augment=False)
    bench = sequential.build_benchmark(synthetic_source(per_class=40, classes=4), settings.data())
    run = run_settings("cndpm", **{**SMALL, "log_alpha": -200.0, "stm_capacity": stm_capacity, "z_dim": 8})
    return run_seed(bench, settings.training(), run, 0, CPU)


@pytest.mark.slow
def test_runs_in_the_training_loop_on_a_sequential_benchmark():
    result = two_task_run(stm_capacity=50)
    assert result.method_metrics["experts"] >= 1
    assert 0.0 <= result.class_il <= 100.0 and result.task_il >= result.class_il


def test_a_task_ends_before_the_first_expert_exists():
    """The first task (80 samples) ends before the STM (100) fills: the loop's checks and the evaluation
    run on a model with no trainable parameter yet."""
    result = two_task_run(stm_capacity=100)
    assert result.method_metrics["experts"] >= 1
    assert len(result.acc_matrix) == 2


# --- sequential benchmark options -----------------------------------------------------------------

def seq_settings(**kw):
    return sequential_settings(source="s", **kw)


def seq_cfg(**kw):
    """The data settings of a sequential benchmark (5 tasks of 2 classes unless `kw` says otherwise)."""
    return seq_settings(**kw).data()


def test_normalize_false_keeps_pixels_in_unit_range_even_with_source_statistics():
    src = labelled_source(stats=True)
    normal = sequential.build_benchmark(src, seq_cfg())
    raw = sequential.build_benchmark(src, seq_cfg(normalize=False))
    assert normal["mean"] == [0.5] and raw["mean"] is None and raw["std"] is None
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    _, test_normal = sequential.transforms(normal, augment=False)
    train_raw, test_raw = sequential.transforms(raw, augment=False)
    assert torch.allclose(test_normal(x).flatten(), torch.tensor([-2.0, 2.0]))   # (x - 0.5) / 0.25
    assert train_raw(x).flatten().tolist() == test_raw(x).flatten().tolist() == [0.0, 1.0]


def test_class_order_groups_tasks_by_the_named_order_and_renumbers_labels():
    src = labelled_source(per_class=3, test_per_class=2, classes=100)   # pixel (0, 0, 0) = source class
    bench = sequential.build_benchmark(src, seq_cfg(n_tasks=20, classes_per_task=5, class_order="cifar100-superclass"))
    assert CLASS_ORDERS["cifar100-superclass"][:5] == (4, 30, 55, 72, 95) and sorted(CIFAR100_SUPERCLASS) == list(range(100))
    source_class = bench["train_x"][:, 0, 0, 0].long()
    assert torch.equal(source_class, torch.tensor(CIFAR100_SUPERCLASS)[bench["train_y"]])
    assert bench["train_y"][:15].tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3
    assert set(source_class[bench["train_task"] == 0].tolist()) == {4, 30, 55, 72, 95}
    assert set(source_class[bench["train_task"] == 19].tolist()) == {41, 69, 81, 85, 89}
    assert torch.equal(bench["test_x"][:, 0, 0, 0].long(), torch.tensor(CIFAR100_SUPERCLASS)[bench["test_y"]])
    assert torch.equal(bench["test_group"], bench["test_y"] // 5)
    assert bench["group_names"][0] == "c4, c30, c55, c72, c95" and bench["group_names"][1] == "c1, c32, c67, c73, c91"
    assert bench["class_order"] == list(CIFAR100_SUPERCLASS)
    plain = sequential.build_benchmark(src, seq_cfg(n_tasks=20, classes_per_task=5))
    assert plain["class_order"] is None and plain["group_names"][0] == "c0, c1, c2, c3, c4"


def test_class_order_refuses_unknown_names_and_sources_it_does_not_order():
    with pytest.raises(ValidationError, match="class_order"):        # not a declared order: refused in the settings
        seq_cfg(class_order="nope")
    with pytest.raises(sequential.SequentialConfigError, match="not a known class order"):
        sequential.build_benchmark(labelled_source(), seq_cfg().model_copy(update={"class_order": "nope"}))
    with pytest.raises(sequential.SequentialConfigError, match="orders 100 classes, not the source's 10"):
        sequential.build_benchmark(labelled_source(), seq_cfg(class_order="cifar100-superclass"))


def test_paper_profile_declares_cndpms_protocol_benchmarks():
    """The paper profile's split-cifar10/100 benchmarks (CN-DPM's protocol) and cndpm cells validate."""
    with open(Path(__file__).resolve().parents[1] / "profiles/paper.yaml") as f:
        params = yaml.safe_load(f)
    check_data(params)
    check_runs(params)
    assert params["benchmarks"]["split-cifar100"]["class_order"] == "cifar100-superclass"
    assert params["benchmarks"]["split-cifar10"]["normalize"] is False
    cells = {(r["benchmark"], r["method"]) for r in params["runs"].values()}
    assert {("split-cifar10", "cndpm"), ("split-cifar100", "cndpm")} <= cells


def test_cifar_experts_run_wake_sleep_and_predict_with_lateral_connections():
    """arch cnn (conv VAE + ResNet-10 with InstanceNorm) at tiny widths: three experts, each later one reading the
    earlier ones' features; the expert widths grow by the ext channels, and predictions are finite."""
    torch.manual_seed(0)
    cfg = {**SMALL, "arch": "cnn", "vae_width": 4, "vae_ext": 2, "cls_width": 4, "cls_ext": 2, "z_dim": 4,
           "log_alpha": 1e4, "stm_capacity": 10, "sleep_steps_vae": 2, "sleep_steps_cls": 2, "sleep_batch": 4}
    ctx = MethodContext(device=CPU, n_classes=3, train_transform=lambda x: x, generator=torch.Generator().manual_seed(0))
    m = METHODS["cndpm"](MLP((3, 32, 32), 3), run_settings("cndpm", **cfg), ctx)
    for step in range(3):
        x = torch.rand(10, 3, 32, 32)
        m.observe(x, torch.full((10,), step), (x * 255).to(torch.uint8))
    assert m.n_experts == 3
    assert m.experts[3].g.enc2.in_channels == 4 + 2 * 2 and m.experts[3].d.out.in_features == 8 * (4 + 2 * 2)
    scores = m.predict(torch.rand(5, 3, 32, 32))
    assert scores.shape == (5, 3) and torch.isfinite(scores).all()
