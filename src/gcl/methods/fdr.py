"""FDR, Function Distance Regularization (Benjamin et al. 2019): keep the network's outputs on a memory fixed.

Memory: split evenly over the tasks seen. At the end of task t (t tasks seen), every older task's
memory is cut to its first buffer // t images, and buffer // t random training images of task t are
stored (non-augmented uint8) with the softmax of the network's outputs on them at that moment.
As in the reference framework (mammoth), those outputs are taken on an augmented view of each image
with the network as it trains (train mode), in chunks of the stream batch size.

Step, as the reference schedules it: first an ordinary SGD step on the cross-entropy of the stream
batch; then, once a memory exists, after EVERY such step one function-space step: one iteration of
the same plain SGD at the same lr on

    L_fd = mean over a replayed batch of || softmax(f(x_b)) - p_b ||_2

(the Euclidean norm of the difference of the two softmax vectors, not squared, as the reference
computes it), x_b freshly augmented, p_b the stored softmax. The FDR paper's separate
function-space optimiser and iteration count are not what the reference (whose FDR numbers DER
and the CoCa paper report) runs; this follows the reference. Returns the function-space loss
(the reference returns it too) or the cross-entropy while no memory exists.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gcl.core.buffer import to_device
from gcl.methods.base import Method, ReplaySettings, TaskData, register


def function_distance(outputs: torch.Tensor, stored_probs: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the L2 distance between softmax(outputs) and the stored softmax."""
    return torch.linalg.vector_norm(F.softmax(outputs, dim=1) - stored_probs, dim=1).mean()


@register
class FDR(Method):
    trains_alone = "it works at task boundaries, which stacked seeds do not see"
    name = "fdr"
    summary = "FDR: after each step, an SGD step pulling the softmax on a memory batch to the stored one"
    needs_boundaries = True
    uses_buffer = True
    reservoir = False       # a memory of its own (below), not the shared reservoir
    Settings = ReplaySettings
    state_attrs = ("mem_x", "mem_p", "mem_t", "tasks_seen")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.mem_x: torch.Tensor | None = None   # uint8 images
        self.mem_p: torch.Tensor | None = None   # stored softmax outputs
        self.mem_t: torch.Tensor | None = None   # task of each row
        self.tasks_seen = 0

    def observe(self, x, y, x_raw):
        loss = self.sgd_step(F.cross_entropy(self.net(x), y))
        if self.mem_x is None:
            return loss
        idx = torch.randperm(len(self.mem_x), generator=self.ctx.generator)[:self.cfg.replay_batch]
        idx = to_device(idx, self.mem_x.device)
        buf_x = self.ctx.train_transform(self.mem_x.index_select(0, idx))
        return self.sgd_step(function_distance(self.net(buf_x), self.mem_p.index_select(0, idx)))

    @torch.no_grad()
    def end_task(self, task: TaskData) -> None:
        self.tasks_seen += 1
        quota = self.cfg.buffer // self.tasks_seen
        if quota == 0:
            raise ValueError(f"fdr: a buffer of {self.cfg.buffer} leaves no image to each of {self.tasks_seen} tasks")
        keep_x, keep_p, keep_t = [], [], []
        if self.mem_x is not None:    # older tasks: the first `quota` of each
            for t in range(self.tasks_seen - 1):
                rows = (self.mem_t == t).nonzero().squeeze(1)[:quota]
                keep_x.append(self.mem_x[rows])
                keep_p.append(self.mem_p[rows])
                keep_t.append(self.mem_t[rows])
        pick = torch.randperm(len(task.y), generator=self.ctx.generator)[:quota].to(task.y.device)
        new_x = task.x_raw.index_select(0, pick)
        chunk = self.cfg.batch
        probs = torch.cat([F.softmax(self.net(self.ctx.train_transform(new_x[i:i + chunk])), dim=1)
                           for i in range(0, len(new_x), chunk)])
        keep_x.append(new_x)
        keep_p.append(probs.float())
        keep_t.append(torch.full((len(new_x),), task.index, dtype=torch.long, device=new_x.device))
        self.mem_x, self.mem_p, self.mem_t = torch.cat(keep_x), torch.cat(keep_p), torch.cat(keep_t)

    def extra_metrics(self) -> dict:
        return {"memory": 0 if self.mem_x is None else len(self.mem_x)}
