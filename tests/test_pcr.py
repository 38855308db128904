"""PCR's parts against hand computations: the proxy-contrastive loss (the proxies of the batch's classes, as often as
each appears, never all classes), the gradient only to the proxies present, its views, and one step of the method."""
import math

import pytest
import torch

from gcl.core.backbones import build_backbone
from gcl.data.augment import Normalize
from gcl.methods import METHODS
from gcl.methods.base import MethodContext
from gcl.methods.pcr import EPS, proxy_contrastive_loss, simclr_view
from helpers import run_settings

FEATURES = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0], [-1.0, 1.0]], dtype=torch.float64)
PROXIES = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0], [0.0, -3.0]], dtype=torch.float64)


def by_hand(features, labels, proxies, temperature) -> float:
    """-mean_i log( exp(s_i,y_i) / sum_j exp(s_i,y_j) ), j over the batch's samples, written out in floats."""
    def unit(v):
        n = math.sqrt(sum(a * a for a in v)) + EPS
        return [a / n for a in v]

    total = 0.0
    for f, y in zip(features.tolist(), labels.tolist()):
        z = unit(f)
        score = {c: sum(a * b for a, b in zip(z, unit(proxies[c].tolist()))) / temperature for c in set(labels.tolist())}
        total -= score[y] - math.log(sum(math.exp(score[c]) for c in labels.tolist()))
    return total / len(labels)


@pytest.mark.parametrize("labels", [[0, 0, 1, 3], [0, 0, 0, 1], [4, 1, 1, 4]])
def test_the_loss_is_a_softmax_over_the_proxies_of_the_batch_each_as_often_as_its_class_appears(labels):
    labels = torch.tensor(labels)
    got = proxy_contrastive_loss(FEATURES, labels, PROXIES, 0.09)
    assert got.item() == pytest.approx(by_hand(FEATURES, labels, PROXIES, 0.09), rel=1e-12)
    # not a cross-entropy over every class's proxy (what the classifier would give), nor over each present class once
    all_classes = torch.nn.functional.cross_entropy(
        torch.nn.functional.normalize(FEATURES, dim=1) @ torch.nn.functional.normalize(PROXIES, dim=1).t() / 0.09, labels)
    assert got.item() != pytest.approx(all_classes.item(), rel=1e-6)
    present = sorted(set(labels.tolist()))
    once = torch.nn.functional.cross_entropy(
        (torch.nn.functional.normalize(FEATURES, dim=1) @ torch.nn.functional.normalize(PROXIES[present], dim=1).t()) / 0.09,
        torch.tensor([present.index(y) for y in labels.tolist()]))
    if len(set(labels.tolist())) < len(labels):
        assert got.item() != pytest.approx(once.item(), rel=1e-6)


def test_only_the_proxies_of_the_batchs_classes_get_a_gradient():
    proxies = PROXIES.clone().requires_grad_(True)
    features = FEATURES.clone().requires_grad_(True)
    proxy_contrastive_loss(features, torch.tensor([0, 0, 1, 3]), proxies, 0.09).backward()
    moved = [c for c in range(5) if proxies.grad[c].abs().sum() > 0]
    assert moved == [0, 1, 3] and features.grad.abs().sum() > 0


def test_a_lower_temperature_sharpens_the_loss_by_hand():
    labels = torch.tensor([0, 1, 1, 3])
    for t in (0.05, 0.5, 2.0):
        assert proxy_contrastive_loss(FEATURES, labels, PROXIES, t).item() == pytest.approx(
            by_hand(FEATURES, labels, PROXIES, t), rel=1e-12)


def test_the_view_draws_afresh_per_image_and_repeats_under_a_seed():
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images[1] = images[0]
    view = simclr_view((32, 32))
    torch.manual_seed(3)
    a = torch.stack([view(x) for x in images])
    torch.manual_seed(3)
    b = torch.stack([view(x) for x in images])
    assert torch.equal(a, b) and a.shape == images.shape and a.dtype == torch.uint8
    assert not torch.equal(a[0], a[1])          # two equal images get two views
    assert not torch.equal(a, images)


def method(buffer=20, replay_batch=4):
    torch.manual_seed(0)
    net = build_backbone("resnet18", (3, 16, 16), 6, width=4, head="cosine", head_scale=1 / 0.09)
    normalize = Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
    ctx = MethodContext(device=torch.device("cpu"), n_classes=6, train_transform=normalize,
                        generator=torch.Generator().manual_seed(1), plain_transform=normalize)
    cfg = run_settings("pcr", buffer=buffer, lr=0.1, batch=4, replay_batch=replay_batch)
    return METHODS["pcr"](net, cfg, ctx), normalize


def test_one_step_is_the_proxy_loss_of_both_batches_and_their_views_then_sgd():
    """The first step (empty buffer) moves nothing; the second is one SGD step on the loss of [replayed, its views,
    stream, its views] against the head's proxies, recomputed here from the same draws."""
    pcr, normalize = method()
    g = torch.Generator().manual_seed(2)
    x1, x2 = (torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8, generator=g) for _ in range(2))
    y1, y2 = torch.tensor([0, 1, 0, 1]), torch.tensor([2, 3, 2, 3])
    before = [p.detach().clone() for p in pcr.net.parameters()]
    assert pcr.observe(normalize(x1), y1, x1).item() == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, pcr.net.parameters())) and len(pcr.buffer) == 4
    # the same draws, replayed by hand on a copy of the network: the views first (stream), the buffer, its views
    import copy
    net = copy.deepcopy(pcr.net)
    state, gen_state = torch.get_rng_state(), pcr.ctx.generator.get_state()
    view = simclr_view((16, 16))
    stream_view = normalize(torch.stack([view(x) for x in x2]))
    buf_x, buf_y = copy.deepcopy(pcr.buffer).sample(4, "examples", "labels")
    buf_view = normalize(torch.stack([view(x) for x in buf_x]))
    features = torch.cat([net.features(torch.cat([normalize(buf_x), buf_view])),
                          net.features(torch.cat([normalize(x2), stream_view]))])
    expected = proxy_contrastive_loss(features, torch.cat([buf_y, buf_y, y2, y2]), net.classifier.weight, 0.09)
    expected.backward()
    torch.set_rng_state(state)
    pcr.ctx.generator.set_state(gen_state)
    loss = pcr.observe(normalize(x2), y2, x2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for p, q in zip(pcr.net.parameters(), net.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p, q - 0.1 * q.grad, rtol=1e-5, atol=1e-6)
    assert len(pcr.buffer) == 8


def test_it_predicts_with_the_cosine_head_and_refuses_another():
    from gcl.core.settings import ParamsError
    pcr, normalize = method()
    x = normalize(torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8))
    scores = pcr.predict(x)
    feats = torch.nn.functional.normalize(pcr.net.features(x), dim=1)
    proxies = torch.nn.functional.normalize(pcr.net.classifier.weight, dim=1)
    torch.testing.assert_close(scores, feats @ proxies.t() / 0.09, rtol=1e-4, atol=1e-4)
    with pytest.raises((ParamsError, ValueError)):
        run_settings("pcr", buffer=20, lr=0.1, batch=4, replay_batch=4, head="linear")
