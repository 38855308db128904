"""The validation split, made in one place for every benchmark kind: the last part of each class's training
images (in source order) is held out and evaluated instead of the test set; the stream uses the rest."""
from __future__ import annotations

import torch


def split_per_class(labels: torch.Tensor, n_classes: int, fraction: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each class j < n_classes: (training indices, held-out indices) into `labels`, both in source order;
    the last round(n_j * fraction) images of the class are held out (none when fraction is 0). Labels at or
    above n_classes are left out."""
    # every class's indices in source order, from one stable sort (not one scan of the labels per class)
    by_class = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=n_classes)[:n_classes].tolist()
    out = []
    for idx in torch.split(by_class[:sum(counts)], counts):
        n_kept = kept_count(len(idx), fraction)
        out.append((idx[:n_kept], idx[n_kept:]))
    return out


def kept_count(n: int, fraction: float) -> int:
    """Training images a class of `n` keeps for the stream: all but the last round(n * fraction)."""
    return n - int(round(n * fraction))
