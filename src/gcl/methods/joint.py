"""JOINT: the offline upper bound. Keeps the whole stream, then trains a fresh network on it, shuffled."""
import torch
import torch.nn.functional as F

from gcl.core.backbones import begin_step
from gcl.methods.base import Method, register


@register
class Joint(Method):
    name = "joint"
    capturable = True
    summary = "offline upper bound: keeps the stream, then trains on it shuffled for `epochs` passes"
    offline = True
    state_attrs = ("seen_x", "seen_y")   # the stream kept so far

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.seen_x: list[torch.Tensor] = []
        self.seen_y: list[torch.Tensor] = []

    def observe(self, x, y, x_raw):
        self.seen_x.append(x_raw)
        self.seen_y.append(y)
        return torch.zeros((), device=y.device)

    def finish(self):
        xs, ys = torch.cat(self.seen_x), torch.cat(self.seen_y)
        # "a fresh network": the one we were given has never been updated, so it is still fresh
        batch = self.cfg.batch
        for _ in range(self.ctx.epochs):
            perm = torch.randperm(len(xs), generator=self.ctx.generator).to(xs.device)
            for lo in range(0, len(xs), batch):
                idx = perm[lo:lo + batch]
                begin_step(self.net)
                self.sgd_step(F.cross_entropy(self.net(self.ctx.train_transform(xs[idx])), ys[idx]))
