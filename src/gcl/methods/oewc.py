"""Online EWC (Schwarz et al. 2018, "Progress & Compress"; the online form of Kirkpatrick et al.'s EWC).

At the end of each task the diagonal empirical Fisher of that task is measured,

    F_task = mean over the task's images of (d log p(y | x; theta) / d theta)^2     (y: the true label),

and folded into one running Fisher, F <- gamma * F + F_task (the first task: F = F_task). Every later
step minimises CE + e_lambda * sum_i F_i (theta_i - theta*_i)^2, theta* the parameters at the end of the
last task. One quadratic penalty, whatever the number of tasks: that is what makes it "online".

How it is computed, and where it departs from the reference framework (mammoth's `ewc_on`):

- Per-sample gradients by torch.func (vmap over grad of the one-sample log-likelihood), in chunks of
  `fisher_batch` images; the reference loops over the task's images one by one. Same quantity (tested
  against a per-image loop through conv + BatchNorm). torch.func's first use imports torch._dynamo
  (docs/performance.md), once per process that trains an oewc seed.
- The true label (the empirical Fisher), as the reference does. The reference also multiplies each
  sample's squared gradient by p(y | x) (its `exp_cond_prob`), which neither the EWC nor the online-EWC
  paper has; here every image weighs the same: the plain mean of the squared gradients.
- The network is in eval mode while the Fisher is measured (BatchNorm uses its running statistics and
  does not update them). The reference leaves it in train mode, so with its one-image batches BatchNorm
  normalises each image by its own statistics and its running statistics are moved by every image;
  the MLP has no BatchNorm, so on MNIST the two agree.
- The images are augmented as in training (`ctx.train_transform`), as the reference's train loader does.
- The mean divides by the task's number of images; the reference divides by (batches x batch size),
  slightly more than the number of images when the last batch is short.
- The penalty enters through its exact gradient, 2 e_lambda F (theta - theta*), added to the
  cross-entropy's gradient with multi-tensor ops (the reference's later versions do the same); the
  returned loss includes the penalty's value.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call, grad, vmap

from gcl.methods.base import MethodSettings, TaskData, register
from gcl.methods.quadratic import QuadraticPenaltyMethod


class OEWCSettings(MethodSettings):
    e_lambda: float = Field(ge=0, description="weight lambda of the Fisher penalty sum F (theta - theta*)^2")
    gamma: float = Field(1.0, ge=0, le=1, description="decay of the running Fisher at each new task (1: sum over tasks)")
    fisher_batch: int = Field(64, gt=0, description="images per vmap chunk of per-sample gradients (memory, not results)")


def diagonal_fisher(net: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 64,
                    transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Mean over the samples of the squared per-sample gradient of log p(y | x), one tensor per trainable
    parameter of `net` (in `net.parameters()` order). `transform` maps each chunk of `x` to network
    inputs (a task's uint8 images are transformed chunk by chunk, not all at once). The caller chooses
    the network's mode (eval for BatchNorm); buffers are read, never written."""
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in net.named_parameters() if p.requires_grad}
    buffers = dict(net.named_buffers())

    def log_likelihood(p, xi, yi):
        out = functional_call(net, (p, buffers), (xi.unsqueeze(0),))
        return -F.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(log_likelihood), in_dims=(None, 0, 0))
    total = {n: torch.zeros_like(params[n]) for n in names}
    for start in range(0, len(x), chunk):
        xs = x[start:start + chunk]
        if transform is not None:
            with torch.no_grad():
                xs = transform(xs)
        g = per_sample(params, xs, y[start:start + chunk])
        for n in names:
            total[n] += g[n].pow(2).sum(0)
    return [total[n] / len(x) for n in names]


@register
class OEWC(QuadraticPenaltyMethod):
    name = "oewc"
    summary = "online EWC: quadratic penalty weighted by a running diagonal Fisher, updated at task ends"
    needs_boundaries = True
    Settings = OEWCSettings
    state_attrs = ("fisher", "checkpoint")

    @property
    def importance(self) -> list[torch.Tensor] | None:
        return self.fisher

    @property
    def penalty_weight(self) -> float:
        return self.cfg.e_lambda

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.fisher: list[torch.Tensor] | None = None       # running Fisher, one tensor per parameter
        self.checkpoint: list[torch.Tensor] | None = None   # theta* at the end of the last task

    def observe(self, x, y, x_raw):
        loss = self.task_loss_gradients(x, y)
        if self.fisher is not None:
            weighted, value = self._penalty_terms()
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            torch._foreach_add_([p.grad for p in self.params], weighted, alpha=2 * self.cfg.e_lambda)
            loss = loss + value
        self.apply_gradients()
        return loss

    def end_task(self, task: TaskData) -> None:
        was_training = self.net.training
        self.net.eval()
        fisher = diagonal_fisher(self.net, task.x_raw, task.y, self.cfg.fisher_batch, self.ctx.train_transform)
        self.net.train(was_training)
        if self.fisher is None:
            self.fisher = fisher
        else:
            torch._foreach_mul_(self.fisher, self.cfg.gamma)
            torch._foreach_add_(self.fisher, fisher)
        self.checkpoint = [p.detach().clone() for p in self.params]
