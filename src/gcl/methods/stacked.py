"""The steps of the methods whose seeds train stacked (gcl.core.stacked): one `observe` for S seeds at once.

A stacked method is the step of its lone method (gcl.methods.<name>) with a seed dimension in front of every
batch: x (S, B, ...), y (S, B); it returns each seed's loss (S,). Its loss is the sum of the seeds' losses, each
the lone method's loss of that seed, so each seed's weights move exactly as they would alone; its buffer is a
StackedReservoir whose draws are each seed's own, in the lone method's order. So far: SGD, ER, ER-ACE, DER and DER++ on the MLP
(docs/performance.md says which methods stack and which cannot).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from gcl.core.stacked import StackedReservoir, flat_seeds
from gcl.methods.base import MethodContext, RunSettings, weights_changed


class StackedMethod:
    """S seeds of one method: `net` a stacked network, `ctxs` each seed's context (its generator above all)."""

    name: ClassVar[str]
    uses_buffer: ClassVar[bool] = False

    def __init__(self, net: torch.nn.Module, cfg: RunSettings, ctxs: list[MethodContext]):
        self.net, self.cfg, self.ctx = net, cfg, ctxs[0]     # device, classes and transforms are the seeds' alike
        self.seeds = len(ctxs)
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.buffer = (StackedReservoir(cfg.buffer, self.ctx.device, [c.generator for c in ctxs])
                       if self.uses_buffer else None)

    def observe(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """One update of every seed on its batch; each seed's detached loss (S,)."""
        raise NotImplementedError

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each seed's mean cross-entropy (S,): logits (S, B, classes), labels (S, B)."""
        return F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(y.shape).mean(1)

    def sgd_step(self, per_seed: torch.Tensor) -> torch.Tensor:
        """Backward the sum of the seeds' losses and take every seed's plain SGD step (Method.apply_gradients)."""
        for p in self.params:
            p.grad = None
        per_seed.sum().backward()
        with torch.no_grad():
            with_grad = [p for p in self.params if p.grad is not None]
            torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.cfg.lr)
        weights_changed()
        return per_seed.detach()

    def replay_batch(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        """Each seed's random buffer batch of the given fields (S, k, ...), the examples freshly augmented."""
        out = self.buffer.sample(size, "examples", *names)
        examples = self.ctx.train_transform(flat_seeds(out[0]))
        return (examples.view(*out[0].shape[:2], *examples.shape[1:]), *out[1:])


class StackedSGD(StackedMethod):
    name = "sgd"

    def observe(self, x, y, x_raw):
        return self.sgd_step(self.cross_entropy(self.net(x), y))


class StackedER(StackedMethod):
    name = "er"
    uses_buffer = True

    def observe(self, x, y, x_raw):
        inputs, labels = x, y
        if not self.buffer.is_empty():
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            inputs, labels = torch.cat([x, buf_x], 1), torch.cat([y, buf_y], 1)
        loss = self.sgd_step(self.cross_entropy(self.net(inputs), labels))
        self.buffer.add(examples=x_raw, labels=y)
        return loss


class StackedDER(StackedMethod):
    """DER and DER++ (gcl.methods.der): stream CE + alpha * MSE to stored logits + beta * CE on a second batch."""

    name = "der"
    uses_buffer = True

    def __init__(self, net, cfg, ctxs):
        super().__init__(net, cfg, ctxs)
        self.beta = getattr(cfg, "beta", 0.0)      # plain DER has no label term

    def observe(self, x, y, x_raw):
        logits = self.net(x)
        loss = self.cross_entropy(logits, y)
        if not self.buffer.is_empty():
            size = self.cfg.replay_batch
            buf_x, buf_logits = self.replay_batch(size, "logits")
            loss = loss + self.cfg.alpha * (self.net(buf_x) - buf_logits).pow(2).mean((1, 2))   # each seed's MSE
            if self.beta > 0:
                buf_x2, buf_y2 = self.replay_batch(size, "labels")      # an independent draw
                loss = loss + self.beta * self.cross_entropy(self.net(buf_x2), buf_y2)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y, logits=logits.detach())
        return loss


class StackedDERpp(StackedDER):
    name = "derpp"


class StackedERACE(StackedMethod):
    """ER-ACE (gcl.methods.erace): the stream batch's cross-entropy over each seed's own present and unclaimed
    classes, the replayed batch's over all classes."""

    name = "er-ace"
    uses_buffer = True

    def __init__(self, net, cfg, ctxs):
        super().__init__(net, cfg, ctxs)
        self.seen = torch.zeros(self.seeds, self.ctx.n_classes, dtype=torch.bool, device=self.ctx.device)

    def asymmetric_logits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """gcl.methods.erace.asymmetric_logits for every seed: (S, B, classes) with (S, B) labels."""
        n = logits.shape[2]
        classes = torch.arange(n, device=logits.device)
        keep = torch.zeros(self.seeds, n, dtype=torch.bool, device=logits.device).scatter_(1, y, True)
        top = torch.where(self.seen, classes, -1).max(1).values.unsqueeze(1)
        keep |= (classes >= top) & (top < n - 1)
        return logits.masked_fill(~keep.unsqueeze(1), torch.finfo(logits.dtype).min)

    def observe(self, x, y, x_raw):
        self.seen.scatter_(1, y, True)
        logits = self.net(x)
        if self.buffer.is_empty():
            loss = self.cross_entropy(logits, y)
        else:
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            loss = self.cross_entropy(self.asymmetric_logits(logits, y), y) + \
                self.cross_entropy(self.net(buf_x), buf_y)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        return loss


STACKED: dict[str, type[StackedMethod]] = {
    cls.name: cls for cls in (StackedSGD, StackedER, StackedERACE, StackedDER, StackedDERpp)}
