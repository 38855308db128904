"""Learning without Forgetting (Li & Hoiem 2016) in the single-head class-incremental setting.

At each task's start a frozen copy of the network is kept (eval mode, no gradient ever reaches it, its
parameters never change). Every step then minimises

    CE(f(x)[:, :hi], y) + alpha * KD(f(x)[:, :lo], f_old(x)[:, :lo]; T) + wd_reg * sum(theta^2),

with [lo, hi) the current task's classes (so :lo are the classes of earlier tasks and :hi those seen so
far), and the distillation term of the LwF paper (Eq. 3-4), a soft cross-entropy between
temperature-softened distributions:

    KD = - mean over the batch of sum_{k < lo} softmax(z_old / T)_k * log softmax(z_new / T)_k.

The paper softens probabilities as y^(1/T) / sum y^(1/T), which for y = softmax(z) is exactly
softmax(z / T); computing it from the logits in log space is the same formula without its numerical
trap. The reference framework's first version transcribed the paper literally: it raised softmax
outputs to 1/T, renormalised and took torch.log of the result, which returns -inf (and a NaN loss,
0 * -inf) as soon as a softened probability underflows; and it hard-coded T = 2, ignoring its own
`softmax_temp`. (Its issue tracker, mammoth #22, discusses this loss.) No T^2 factor: the LwF paper
has none (Hinton et al.'s distillation does).

What is taken from the reference framework, and where this departs from it:

- CE over the logits of the classes seen so far ([0, hi)), as the reference does; later classes'
  logits are left out of the softmax.
- `wd_reg` * sum of squared parameters (all of them) is added to the loss, as the reference does (its
  plain SGD has no weight decay). It enters through its exact gradient 2 wd_reg theta.
- Warm-up (the LwF paper's and the reference's): at the start of every task after the first, the new
  classes' rows of the classifier are trained alone on the task's (augmented) images, the rest of the
  network frozen and in eval mode, with cross-entropy over the new classes only, for `warmup_epochs`
  passes (-1: the benchmark's epochs, the reference's n_epochs) at the run's lr and batch.
- Targets: the reference precomputes the old network's logits once per task on images neither
  augmented nor normalised (its not-augmented view is the bare tensor conversion, while the network
  trains on normalised images: on CIFAR the old network scores inputs of another scale than any it was
  trained on) and distils them into the outputs of the augmented, normalised view. Here the frozen copy
  scores the same augmented, normalised batch the network is trained on, so the target is the old
  network's answer to exactly that input (LwF's formulation; one extra forward pass without gradient
  per step). Not matched on purpose: the reference's targets come from inputs outside the old
  network's training distribution. On MNIST (no augmentation, no normalisation) the two agree.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pydantic import Field

from gcl.methods.base import Method, MethodSettings, TaskData, register, weights_changed


class LwFSettings(MethodSettings):
    alpha: float = Field(ge=0, description="weight of the distillation term on the earlier tasks' classes")
    softmax_temp: float = Field(2.0, gt=0, description="temperature T of the distillation softmax")
    wd_reg: float = Field(0.0, ge=0, description="weight of the explicit penalty wd_reg * sum(theta^2)")
    warmup_epochs: int = Field(-1, ge=-1, description="head warm-up passes at each new task; -1: the benchmark's epochs, 0: none")


def lwf_distillation(new_logits: torch.Tensor, old_logits: torch.Tensor, temp: float) -> torch.Tensor:
    """Soft cross-entropy of LwF (Eq. 3-4 of Li & Hoiem): -mean_b sum_k softmax(old/T)_k log softmax(new/T)_k."""
    target = F.softmax(old_logits / temp, dim=1)
    return -(target * F.log_softmax(new_logits / temp, dim=1)).sum(1).mean()


def lwf_loss(logits: torch.Tensor, y: torch.Tensor, old_logits: torch.Tensor | None, seen: int, old: int,
             alpha: float, temp: float) -> torch.Tensor:
    """CE over the `seen` classes plus alpha * distillation over the `old` classes (none when old_logits is None)."""
    loss = F.cross_entropy(logits[:, :seen], y)
    if old_logits is not None and old > 0:
        loss = loss + alpha * lwf_distillation(logits[:, :old], old_logits[:, :old], temp)
    return loss


@register
class LwF(Method):
    trains_alone = "it works at task boundaries, which stacked seeds do not see"
    name = "lwf"
    summary = "Learning without Forgetting: distil a frozen copy's softened outputs on the earlier classes"
    needs_boundaries = True
    heads = ("linear",)       # its warm-up steps the linear head's weight and bias alone
    Settings = LwFSettings
    state_attrs = ("old_net", "old_classes", "classes")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        # always a module (so that load_state_dict can fill it); distils nothing while old_classes == 0
        self.old_net = self._frozen_copy()
        self.old_classes = 0
        self.classes = (0, ctx.n_classes)

    def _frozen_copy(self):
        old = copy.deepcopy(self.net)
        old.eval()
        for p in old.parameters():
            p.requires_grad_(False)
        return old

    @torch.no_grad()
    def _weight_norm2(self) -> torch.Tensor:
        return torch.stack(torch._foreach_norm([p.detach() for p in self.params])).pow(2).sum()

    def observe(self, x, y, x_raw):
        lo, hi = self.classes
        old_logits = None
        if self.old_classes > 0:
            with torch.no_grad():
                old_logits = self.old_net(x)
        loss = lwf_loss(self.net(x), y, old_logits, hi, self.old_classes, self.cfg.alpha, self.cfg.softmax_temp)
        for p in self.params:
            p.grad = None
        loss.backward()
        loss = loss.detach()
        wd = self.cfg.wd_reg
        if wd > 0:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            torch._foreach_add_([p.grad for p in self.params], [p.detach() for p in self.params], alpha=2 * wd)
            loss = loss + wd * self._weight_norm2()
        self.apply_gradients()
        return loss

    def begin_task(self, task: TaskData) -> None:
        self.classes = tuple(task.classes)
        lo = task.classes[0]
        if lo > 0:
            self.old_net.load_state_dict(self.net.state_dict())
            self.old_classes = lo
            epochs = self.cfg.warmup_epochs
            self._warm_up(task, self.ctx.epochs if epochs < 0 else epochs)

    def _warm_up(self, task: TaskData, epochs: int) -> None:
        """Train the new classes' classifier rows alone (features frozen, eval mode), CE over the new classes."""
        if epochs == 0:
            return
        lo, hi = task.classes
        head = self.net.classifier
        was_training = self.net.training
        self.net.eval()
        lr, batch, n = self.cfg.lr, self.cfg.batch, len(task.y)
        for _ in range(epochs):
            order = torch.randperm(n, generator=self.ctx.generator).to(task.y.device)
            for start in range(0, n, batch):
                idx = order[start:start + batch]
                with torch.no_grad():
                    feats = self.net.features(self.ctx.train_transform(task.x_raw[idx]))
                loss = F.cross_entropy(head(feats)[:, lo:hi], task.y[idx] - lo)
                weight_grad, bias_grad = torch.autograd.grad(loss, [head.weight, head.bias])
                with torch.no_grad():   # only rows lo:hi have a gradient; the others stay as they are
                    head.weight.sub_(lr * weight_grad)
                    head.bias.sub_(lr * bias_grad)
                weights_changed()
        self.net.train(was_training)
