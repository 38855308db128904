"""Stacked SGD, JOINT, ER, ER-ACE, A-GEM, DER and DER++: the replay methods' steps (gcl.methods.<name>) with a seed
dimension in front."""
from __future__ import annotations

import torch

from gcl.data.transforms import to_unit_float
from gcl.methods.agem import project
from gcl.methods.stacked.base import StackedMethod


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

    def __init__(self, net, cfg, lone, transform=None):
        super().__init__(net, cfg, lone, transform)
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
    state_attrs = ("seen",)

    def __init__(self, net, cfg, lone, transform=None):
        super().__init__(net, cfg, lone, transform)
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


class StackedJoint(StackedMethod):
    """JOINT (gcl.methods.joint): each seed keeps its stream, then trains on it in its own shuffled order."""

    name = "joint"
    state_attrs = ("seen_x", "seen_y")   # each seed's stream kept so far

    def __init__(self, net, cfg, lone, transform=None):
        super().__init__(net, cfg, lone, transform)
        self.seen_x: list[torch.Tensor] = []
        self.seen_y: list[torch.Tensor] = []

    def observe(self, x, y, x_raw):
        self.seen_x.append(x_raw)
        self.seen_y.append(y)
        return torch.zeros(self.seeds, device=y.device)

    def finish(self):
        xs, ys = torch.cat(self.seen_x, 1), torch.cat(self.seen_y, 1)
        rows = torch.arange(self.seeds, device=xs.device).unsqueeze(1)
        batch, count = self.cfg.batch, xs.shape[1]
        for _ in range(self.ctx.epochs):
            perms = torch.stack([torch.randperm(count, generator=g) for g in self.generators]).to(xs.device)
            for lo in range(0, count, batch):
                idx = perms[:, lo:lo + batch]
                self.sgd_step(self.cross_entropy(self.net(self.transform(xs[rows, idx])), ys[rows, idx]))


class StackedAGEM(StackedMethod):
    """A-GEM (gcl.methods.agem): each seed's stream gradient projected against its own reference gradient."""

    name = "agem"
    uses_buffer = True

    def _flat_grads(self, per_seed: torch.Tensor) -> torch.Tensor:
        """Each seed's gradient of its own loss, flattened: (S, P) (no parameter is shared between seeds)."""
        grads = torch.autograd.grad(per_seed.sum(), self.params)
        return torch.cat([g.reshape(self.seeds, -1) for g in grads], 1)

    def observe(self, x, y, x_raw):
        loss = self.cross_entropy(self.net(x), y)
        if self.buffer.is_empty():
            self.sgd_step(loss)
        else:
            g = self._flat_grads(loss)
            if self.cfg.reference_input == "raw":
                buf_raw, buf_y = self.buffer.sample(self.cfg.replay_batch, "examples", "labels")
                buf_x = to_unit_float(buf_raw)
            else:
                buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            g_ref = self._flat_grads(self.cross_entropy(self.net(buf_x), buf_y))
            sizes = [p[0].numel() for p in self.params]
            for p, gp in zip(self.params, torch.split(project(g, g_ref), sizes, 1)):
                p.grad = gp.reshape(p.shape)
            self.apply_gradients()
        self.buffer.add(examples=x_raw, labels=y)
        return loss.detach()
