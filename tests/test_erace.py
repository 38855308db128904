"""ER-ACE: the asymmetric cross-entropy by hand, and the method in the loop without task boundaries."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gcl.methods import METHODS
from gcl.methods.erace import asymmetric_logits
from gcl.training.train import run_seed
from helpers import run_settings

ROOT = Path(__file__).resolve().parents[1]

CPU = torch.device("cpu")


def seen_of(*classes, n=5):
    seen = torch.zeros(n, dtype=torch.bool)
    seen[list(classes)] = True
    return seen


def test_the_stream_loss_runs_over_the_batch_classes_and_the_unclaimed_ones_only():
    """Seen {0, 1, 3}, batch labels {1, 3}: classes 1 and 3 (present) and 3, 4 (at or above the highest seen)
    compete; 0 and 2 are masked: the loss is the cross-entropy over {1, 3, 4}, and they get no gradient."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 0.3, 1.1], [1.5, -0.2, 0.7, 2.2, 0.0]], requires_grad=True)
    y = torch.tensor([1, 3])
    loss = F.cross_entropy(asymmetric_logits(logits, y, seen_of(0, 1, 3)), y)
    kept = logits.detach()[:, [1, 3, 4]]
    by_hand = -(torch.log_softmax(kept, 1)[0, 0] + torch.log_softmax(kept, 1)[1, 1]) / 2
    assert torch.allclose(loss, by_hand)
    loss.backward()
    assert torch.all(logits.grad[:, [0, 2]] == 0) and torch.all(logits.grad[:, [1, 3, 4]] != 0)


def test_once_the_last_class_is_seen_only_the_batch_classes_compete():
    logits = torch.randn(3, 5, requires_grad=True)
    y = torch.tensor([2, 2, 0])
    masked = asymmetric_logits(logits, y, seen_of(0, 2, 4))
    assert torch.equal(masked[:, [0, 2]], logits[:, [0, 2]])
    assert torch.all(masked[:, [1, 3, 4]] == torch.finfo(logits.dtype).min)


def test_learns_without_task_boundaries(tiny_mnist360):
    bench, cfg = tiny_mnist360
    cls = METHODS["er-ace"]
    assert not cls.needs_boundaries and cls.uses_buffer
    run = run_settings("er-ace", 50, lr=0.1, batch=4, replay_batch=8)
    sgd = run_seed(bench, cfg, run_settings("sgd", lr=0.1, batch=4), 0, CPU)
    result = run_seed(bench, cfg, run, 0, CPU)
    assert result.class_il > sgd.class_il and result.class_il > 100 / 9


def test_batch_1_is_refused_before_training():
    """A one-image stream batch leaves the asymmetric cross-entropy over one logit once every class is seen:
    exactly zero, with no gradient (so a batch-1 "ER-ACE" run is replay alone). Shown, then refused by its settings."""
    logits = torch.randn(1, 5, requires_grad=True)
    y = torch.tensor([2])
    loss = F.cross_entropy(asymmetric_logits(logits, y, seen_of(0, 1, 2, 3, 4)), y)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logits.grad == 0)
    # so a profile with ER-ACE at batch 1 stops at check@runs, naming the run, before any training
    from gcl.config import ParamsError, check_runs, load_params
    params = load_params(ROOT / "profiles/mnist-360.yaml")
    params["runs"]["mnist-360-er-ace-500"]["batch"] = 1
    with pytest.raises(ParamsError, match=r"runs.mnist-360-er-ace-500.batch.*at least 2.*zero loss"):
        check_runs(params)
