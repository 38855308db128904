"""iCaRL (Rebuffi et al. 2017): herding exemplars, sigmoid distillation, nearest-mean-of-exemplars classifier.

Exemplars: at the end of each task, with m = buffer // (classes seen), every old class's exemplar
set is cut to its first m (herding order is priority order), and m exemplars of each new class are
chosen by herding (`herding`) on the features of the class's training images (network in eval mode,
images not augmented). They are stored non-augmented (uint8). Features: L2-normalised (`features:
normalised`, iCaRL's paper and code) or raw (`features: raw`, the reference framework whose numbers the
CoCa paper copies; the paper profile's value).

Loss (classes [0, hi) seen so far, the current task's classes [lo, hi)): binary cross-entropy with
logits over the outputs of classes [0, hi), mean over batch and classes, with targets
  - one-hot of the label on the current task's classes [lo, hi),
  - sigmoid of the old network's outputs on classes [0, lo) (the network frozen at the end of the
    previous task: eval mode, no gradient, never updated),
plus the explicit weight penalty wd_reg * sum_p p^2 of the reference framework (mammoth).

Replay: the reference merges the exemplars into the current task's training set, so that every
pass over the task also passes once over the exemplars, shuffled in among the task's images and
augmented, in batches of `batch` with a smaller last one: ceil((task images + memory) / batch) SGD steps
per pass. Here the stream is the loop's, so the memory is dealt out over each pass's stream steps (S =
ceil(task images / batch)): step i of a pass takes the exemplars [i M / S, (i + 1) M / S) of that pass's
random order of the M exemplars, so each is replayed exactly once per pass. Each stream batch is pooled
with its exemplars and what the previous step left over; the pool is shuffled and trained in as many full
batches of `batch` as it holds, the rest carried to the next step; at a pass's last step the rest is
trained as the pass's last, smaller batch. So the SGD steps, their batch sizes and the exemplars' share
of a batch are the reference's.

Prediction: nearest mean of exemplars. The class means are the means of the exemplars' normalised
features, renormalised (iCaRL's code), or of their raw features (`features: raw`, the reference
framework's), computed with the current network in eval mode on the
non-augmented exemplars; no flipped copies (the reference framework averages no flips; flips are
meaningless on digits). predict returns -||phi(x) - mu_c||^2 for the classes seen and -inf for the
others, so its argmax is the nearest mean and Task-IL masks it as any logits. Before the first task
ends there are no exemplars and no means: predict then returns the network's logits over the
classes seen so far (the classes it has been trained on), -inf elsewhere.
"""
from __future__ import annotations

import copy
import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from gcl.core.buffer import to_device
from gcl.methods.base import Method, MethodSettings, TaskData, register


def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of up to `m` rows of `features` chosen by herding, in order of selection.

    Step k picks, among the rows not yet chosen, the one whose addition brings the mean of the chosen
    rows closest (Euclidean) to the mean of all rows: argmin_i || mu - (phi_i + sum_{j<k} phi_j) / k ||.
    The caller normalises the features if it wants iCaRL's normalised herding.
    """
    n = features.shape[0]
    m = min(m, n)
    mu = features.mean(0)
    chosen = torch.empty(m, dtype=torch.long, device=features.device)
    taken = torch.zeros(n, dtype=torch.bool, device=features.device)
    running = torch.zeros_like(mu)
    for k in range(1, m + 1):
        cost = (mu[None, :] - (features + running[None, :]) / k).norm(dim=1)
        cost = cost.masked_fill(taken, float("inf"))
        i = cost.argmin()
        chosen[k - 1] = i
        taken[i] = True
        running = running + features[i]
    return chosen


class ICaRLSettings(MethodSettings):
    wd_reg: float = Field(1e-5, ge=0, description="weight of the explicit penalty wd_reg * sum of squared parameters")
    features: Literal["normalised", "raw"] = Field(
        "normalised", description="features of herding and the class means: L2-normalised (iCaRL) or raw (mammoth)")


@register
class ICaRL(Method):
    trains_alone = "it works at task boundaries, which stacked seeds do not see"
    name = "icarl"
    summary = "iCaRL: herding exemplars, sigmoid distillation from the old network, nearest-mean classifier"
    needs_boundaries = True
    uses_buffer = True
    reservoir = False       # a memory of its own (below), not the shared reservoir
    Settings = ICaRLSettings
    state_attrs = ("ex_x", "ex_y", "old_net", "class_means", "seen_hi", "task_lo", "steps_per_pass", "task_step",
                   "replay_order", "carry_x", "carry_y")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.ex_x: torch.Tensor | None = None      # exemplars, uint8, grouped by class in herding order
        self.ex_y: torch.Tensor | None = None
        self.old_net = copy.deepcopy(net).eval()    # replaced at each task's end; frozen
        self.old_net.requires_grad_(False)
        self.class_means: torch.Tensor | None = None   # (classes seen, feat_dim), None until a task ends
        self.seen_hi = 0        # classes [0, seen_hi) have been trained on
        self.task_lo = 0        # first class of the current task
        self.eye = torch.eye(ctx.n_classes, device=ctx.device)
        self.steps_per_pass = 0      # stream steps of one pass over the current task
        self.task_step = 0           # stream steps taken in the current task
        self.replay_order = None     # this pass's random order of the exemplars
        self.carry_x: torch.Tensor | None = None    # the pool's rest (fewer than `batch`), trained with the next step
        self.carry_y: torch.Tensor | None = None
        self._means_stale = False

    # ------------------------------------------------------------------ training

    def begin_task(self, task: TaskData) -> None:
        self.task_lo, self.seen_hi = task.classes[0], task.classes[1]
        self.steps_per_pass = math.ceil(len(task.y) / self.cfg.batch)   # as the stream cuts each pass
        self.task_step = 0
        self.carry_x = self.carry_y = None

    def _exemplars_of_step(self, i: int) -> torch.Tensor:
        """Indices of the exemplars that step `i` of a pass replays: its share of the pass's random order."""
        n, steps = len(self.ex_y), self.steps_per_pass
        if i == 0:
            self.replay_order = to_device(torch.randperm(n, generator=self.ctx.generator), self.ex_y.device)
        return self.replay_order[i * n // steps:(i + 1) * n // steps]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """BCE over classes [0, seen_hi): one-hot targets on the current task's classes, the frozen old
        network's sigmoid outputs on the older ones; plus the weight penalty."""
        lo, hi = self.task_lo, self.seen_hi
        outputs = self.net(x)[:, :hi]
        targets = self.eye[y][:, :hi]
        if lo > 0:
            with torch.no_grad():
                old = torch.sigmoid(self.old_net(x)[:, :lo])
            targets = torch.cat([old, targets[:, lo:]], 1)
        loss = F.binary_cross_entropy_with_logits(outputs, targets)
        if self.cfg.wd_reg > 0:
            loss = loss + self.cfg.wd_reg * torch.stack([p.pow(2).sum() for p in self.params]).sum()
        return loss

    def observe(self, x, y, x_raw):
        self._means_stale = True
        i = self.task_step % self.steps_per_pass
        self.task_step += 1
        if self.ex_x is None:
            return self.sgd_step(self.loss(x, y))
        idx = self._exemplars_of_step(i)
        xs, ys = [x, self.ctx.train_transform(self.ex_x.index_select(0, idx))], [y, self.ex_y.index_select(0, idx)]
        if self.carry_x is not None:
            xs.insert(0, self.carry_x)
            ys.insert(0, self.carry_y)
        pool_x, pool_y = torch.cat(xs), torch.cat(ys)
        order = to_device(torch.randperm(len(pool_y), generator=self.ctx.generator), pool_y.device)
        pool_x, pool_y = pool_x[order], pool_y[order]
        b = self.cfg.batch
        # a pass ends with its last, smaller batch; within a pass, only full batches (the rest waits for the next)
        cut = len(pool_y) if i == self.steps_per_pass - 1 else len(pool_y) // b * b
        if cut == 0:
            raise RuntimeError(f"icarl: step {i} of a pass of {self.steps_per_pass} pooled {len(pool_y)} images, fewer "
                               f"than a batch of {b}: the stream's batches are not the ones begin_task expected")
        losses = [self.sgd_step(self.loss(pool_x[j:j + b], pool_y[j:j + b])) for j in range(0, cut, b)]
        self.carry_x, self.carry_y = (pool_x[cut:], pool_y[cut:]) if cut < len(pool_y) else (None, None)
        return torch.stack(losses).mean()

    def _norm(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(feats, dim=1) if self.cfg.features == "normalised" else feats

    @torch.no_grad()
    def _features(self, x_raw: torch.Tensor) -> torch.Tensor:
        """Features (normalised or raw, see `features`) of non-augmented images, network in eval mode (restored
        afterwards)."""
        mode = self.net.training
        self.net.eval()
        transform = self.ctx.plain_transform or self.ctx.train_transform
        feats = torch.cat([self.net.features(transform(x_raw[i:i + 256])) for i in range(0, len(x_raw), 256)])
        self.net.train(mode)
        return self._norm(feats)

    @torch.no_grad()
    def end_task(self, task: TaskData) -> None:
        if self.carry_x is not None:      # the pool's rest: the last, smaller batch of the task
            with torch.enable_grad():
                self.sgd_step(self.loss(self.carry_x, self.carry_y))
            self.carry_x = self.carry_y = None
        lo, hi = task.classes
        m = self.cfg.buffer // hi
        if m == 0:
            raise ValueError(f"icarl: a buffer of {self.cfg.buffer} leaves no exemplar for each of {hi} classes")
        keep_x, keep_y = [], []
        if self.ex_x is not None:    # old classes: the first m of each set (herding order)
            for c in range(lo):
                idx = (self.ex_y == c).nonzero().squeeze(1)[:m]
                keep_x.append(self.ex_x[idx])
                keep_y.append(self.ex_y[idx])
        for c in range(lo, hi):
            idx = (task.y == c).nonzero().squeeze(1)
            pick = idx[herding(self._features(task.x_raw[idx]), m)]
            keep_x.append(task.x_raw[pick])
            keep_y.append(task.y[pick])
        self.ex_x, self.ex_y = torch.cat(keep_x), torch.cat(keep_y)
        self.old_net = copy.deepcopy(self.net).eval()
        self.old_net.requires_grad_(False)
        self.seen_hi = hi
        self._compute_means()

    # ------------------------------------------------------------------ prediction

    @torch.no_grad()
    def _compute_means(self) -> None:
        feats = self._features(self.ex_x)
        sums = torch.zeros(self.seen_hi, feats.shape[1], device=feats.device).index_add_(0, self.ex_y, feats)
        counts = torch.bincount(self.ex_y, minlength=self.seen_hi).clamp_min(1)
        self.class_means = self._norm(sums / counts[:, None])
        self._means_stale = False

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.full((x.shape[0], self.ctx.n_classes), float("-inf"), device=x.device)
        if self.ex_x is None:    # no exemplars yet: the network's own outputs over the classes trained on
            scores[:, :self.seen_hi] = self.net(x)[:, :self.seen_hi]
            return scores
        if self._means_stale or self.class_means is None:
            self._compute_means()
        feats = self._norm(self.net.features(x))
        means = self.class_means
        # -||f - mu||^2 expanded: one matrix product, no (batch x classes x features) tensor
        sq = feats.pow(2).sum(1, keepdim=True) + means.pow(2).sum(1)[None, :] - 2 * feats @ means.T
        scores[:, :len(means)] = -sq
        return scores

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._means_stale = True     # recomputed from the restored exemplars and network when next needed

    def extra_metrics(self) -> dict:
        n = 0 if self.ex_y is None else len(self.ex_y)
        return {"exemplars": n}
