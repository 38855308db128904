"""ESMER's parts against hand computations: the error-sensitive weights (on the stream's loss only), the reservoir
rule (only the low-error samples offered), the running mean of the memory's error, the memory's update and what is
evaluated."""
import copy

import pytest
import torch
import torch.nn.functional as F

from gcl.methods.base import METHODS, MethodContext
from gcl.methods.esmer import error_weights, kept_for_running_mean
from helpers import run_settings
from test_clser import CPU, N_CLASSES, TinyNet, batch


def make(seed: int = 0, **cfg):
    torch.manual_seed(seed)
    ctx = MethodContext(device=CPU, n_classes=N_CLASSES, train_transform=lambda x: x.float() / 255,
                        generator=torch.Generator().manual_seed(seed))
    settings = run_settings("esmer", 20, **{"lr": 0.1, "batch": 4, "replay_batch": 3, **cfg})
    return METHODS["esmer"](TinyNet(), settings, ctx)


def test_a_large_error_is_scaled_down_to_the_running_mean_and_a_small_one_kept():
    losses = torch.tensor([1.0, 2.0, 4.0, 8.0])
    assert error_weights(losses, 2.0, 1.0).tolist() == [1.0, 1.0, 0.5, 0.25]
    assert error_weights(losses, 2.0, 3.0).tolist() == [1.0, 1.0, 1.0, 0.25]      # margin 3: from 6 on
    assert error_weights(losses, 0.0, 1.0).tolist() == [1.0] * 4                   # before the first update


def test_the_running_mean_leaves_out_the_batchs_outliers():
    losses = torch.tensor([1.0, 1.0, 1.0, 10.0])        # mean 3.25, unbiased std 4.5: above 7.75 left out
    assert kept_for_running_mean(losses, 1.0).tolist() == [1.0, 1.0, 1.0]
    assert kept_for_running_mean(losses, 2.0).tolist() == [1.0, 1.0, 1.0, 10.0]   # 3.25 + 9 = 12.25
    assert kept_for_running_mean(torch.tensor([5.0]), 1.0).tolist() == [5.0]      # std of one: NaN, nothing out


def test_one_step_by_hand_the_modulation_on_the_stream_only():
    esmer = make()
    esmer.observe(*batch(1))                            # fills the buffer, sets the running mean
    x, y, x_raw = batch(2)
    with torch.no_grad():
        mu = float(F.cross_entropy(esmer.memory(x), y, reduction="none").median())
    esmer.running_mean = mu                             # half the batch above it
    net, memory = copy.deepcopy(esmer.net), copy.deepcopy(esmer.memory)
    buffer_state, gen_state = copy.deepcopy(esmer.buffer), esmer.ctx.generator.get_state()
    buf_raw, buf_y = buffer_state.sample(3, "examples", "labels")
    buf_x = buf_raw.float() / 255
    with torch.no_grad():
        memory_loss = F.cross_entropy(memory(x), y, reduction="none")
        target = memory(buf_x)
    weights = torch.where(memory_loss >= mu, mu / memory_loss, torch.ones_like(memory_loss))
    assert (weights < 1).any() and (weights == 1).any()       # both kinds of sample in this batch
    out = net(buf_x)
    expected = ((weights * F.cross_entropy(net(x), y, reduction="none")).mean()
                + F.cross_entropy(out, buf_y) + 0.1 * F.mse_loss(out, target))   # the replayed batch unweighted
    expected.backward()
    esmer.ctx.generator.set_state(gen_state)
    loss = esmer.observe(x, y, x_raw)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for p, q in zip(esmer.net.parameters(), net.parameters()):
        torch.testing.assert_close(p, q - 0.1 * q.grad)
    # the running mean: b = min(1 - 1/(t + 1), 0.99) at t = 2, over the batch's losses but its outliers
    b = min(1 - 1 / 3, 0.99)
    assert esmer.running_mean == pytest.approx(b * mu + (1 - b) * kept_for_running_mean(memory_loss, 1.0).mean().item())


def test_only_the_low_error_samples_are_offered_to_the_reservoir():
    esmer = make()
    x, y, x_raw = batch(3, n=8)
    with torch.no_grad():
        memory_loss = F.cross_entropy(esmer.memory(x), y, reduction="none")
    esmer.running_mean = float(memory_loss.median())     # about half the batch at or under it
    esmer.observe(x, y, x_raw)
    low = memory_loss <= esmer.cfg.loss_margin * float(memory_loss.median())
    assert 0 < int(low.sum()) < 8 and len(esmer.buffer) == int(low.sum())
    stored = esmer.buffer.sample(len(esmer.buffer), "examples")[0]
    assert sorted(map(tuple, stored.tolist())) == sorted(map(tuple, x_raw[low].tolist()))


def test_a_batch_whose_selected_labels_are_all_0_adds_nothing_as_in_the_reference():
    esmer = make()
    x, _, x_raw = batch(4)
    esmer.observe(x, torch.zeros(4, dtype=torch.long), x_raw)
    assert len(esmer.buffer) == 0
    esmer.running_mean = 0.0                             # every sample selected again
    esmer.observe(x, torch.tensor([0, 1, 0, 0]), x_raw)
    assert len(esmer.buffer) > 0


def test_the_memory_is_a_moving_average_and_is_what_is_evaluated():
    esmer = make(ema_update_freq=1.0, ema_alpha=0.5)
    before = [p.detach().clone() for p in esmer.memory.parameters()]
    esmer.observe(*batch(5))
    # t = 1: a = min(1 - 1/2, 0.5) = 0.5
    for m, m0, p in zip(esmer.memory.parameters(), before, esmer.net.parameters()):
        torch.testing.assert_close(m, 0.5 * m0 + 0.5 * p)
    x = batch(6)[0]
    torch.testing.assert_close(esmer.predict(x), esmer.memory(x))
    working = make(evaluated_model="working")
    torch.testing.assert_close(working.predict(x), working.net(x))
    assert esmer.memory.training            # left in training mode after its evaluation
