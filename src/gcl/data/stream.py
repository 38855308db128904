"""The stream a training run consumes: a pool of images and the order and batches it is shown in."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Stream:
    """`images[order[bounds[s]:bounds[s+1]]]` is the s-th stream batch.

    `eval_after` lists the steps after which the evaluator measures accuracy (segment or task ends);
    `task_ends` lists, for benchmarks with tasks, the last step of each task. Neither is ever shown
    to a general-continual method: only the training loop reads them.
    """

    images: torch.Tensor        # uint8 (N, C, H, W): the pool, non-augmented
    labels: torch.Tensor        # int64 (N,)
    order: torch.Tensor         # int64 (S,): indices into the pool in presentation order
    bounds: list[int]           # len = steps + 1, offsets into `order`
    eval_after: list[int]       # step indices (0-based)
    task_ends: list[int]        # step indices (0-based); empty for general-continual benchmarks
    origin: torch.Tensor | None = None   # for each pool image, its index in the benchmark's training set
    pool_task: torch.Tensor | None = None          # each pool image's task (benchmarks with tasks)
    task_classes: list[tuple[int, int]] | None = None   # each task's class range [lo, hi)

    def task_pool(self, task: int) -> torch.Tensor:
        """Indices of the pool images of one task (what a boundary-aware method is handed)."""
        return torch.nonzero(self.pool_task == task).flatten()

    @property
    def steps(self) -> int:
        return len(self.bounds) - 1

    @property
    def n_samples(self) -> int:
        return self.bounds[-1]
