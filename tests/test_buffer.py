"""Reservoir buffer: uniform inclusion, later-wins collisions, preallocation, sampling."""
import numpy as np
import pytest
import torch

from gcl.core.buffer import ReservoirBuffer, reservoir_pairs


def test_fills_in_order_until_capacity():
    pairs = reservoir_pairs(seen=0, batch=5, capacity=8, generator=torch.Generator().manual_seed(0))
    assert pairs == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]


def test_vectorised_insertion_equals_one_by_one_insertion():
    """Same random draws, inserted as a batch or sample by sample: identical buffer contents."""
    capacity, n = 7, 60
    for batch in (1, 4, 9):
        g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        buf = ReservoirBuffer(capacity, "cpu", g1)
        for lo in range(0, n, batch):
            buf.add(examples=torch.arange(lo, min(lo + batch, n)))
        # the sequential reference uses the same per-sample uniform draws
        ref = [-1] * capacity
        for lo in range(0, n, batch):
            hi = min(lo + batch, n)
            u = torch.rand(hi - lo, generator=g2, dtype=torch.float64)
            for i, sample in enumerate(range(lo, hi)):
                slot = sample if sample < capacity else int(np.floor(u[i].item() * (sample + 1)))
                if slot < capacity:
                    ref[slot] = sample
        assert buf.fields["examples"].tolist() == ref, batch


@pytest.mark.slow
def test_inclusion_probability_is_uniform():
    """Every one of 100 stream samples ends in a 10-slot buffer with probability 0.1 (chi-square test)."""
    capacity, n, trials = 10, 100, 3000
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(n)
    for _ in range(trials):
        buf = ReservoirBuffer(capacity, "cpu", gen)
        for lo in range(0, n, 8):
            buf.add(examples=torch.arange(lo, min(lo + 8, n)))
        counts[buf.fields["examples"].numpy()] += 1
    expected = trials * capacity / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 99 degrees of freedom: the 99.9% quantile is about 149
    assert chi2 < 149, chi2
    assert counts.sum() == trials * capacity


def test_fields_are_preallocated_and_sampling_is_distinct():
    buf = ReservoirBuffer(5, "cpu", torch.Generator().manual_seed(0))
    x = torch.randint(0, 255, (3, 1, 4, 4), dtype=torch.uint8)
    buf.add(examples=x, labels=torch.tensor([1, 2, 3]), logits=torch.randn(3, 10))
    assert buf.fields["examples"].shape == (5, 1, 4, 4) and buf.fields["examples"].dtype == torch.uint8
    assert buf.fields["logits"].shape == (5, 10)
    assert len(buf) == 3
    (labels,) = buf.sample(10, "labels")
    assert sorted(labels.tolist()) == [1, 2, 3]
    (ex, lab) = buf.get("examples", "labels")
    assert torch.equal(ex, x) and lab.tolist() == [1, 2, 3]
