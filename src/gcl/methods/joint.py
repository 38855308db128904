"""JOINT: the offline upper bound. Keeps the whole stream, then trains a fresh network on it, shuffled."""
import torch

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
        return self.seeds.zero_loss(y.device)

    def finish(self):
        seeds = self.seeds
        xs, ys = seeds.cat(self.seen_x), seeds.cat(self.seen_y)
        # "a fresh network": the one we were given has never been updated, so it is still fresh
        batch, count = self.cfg.batch, seeds.size(xs)
        for _ in range(self.ctx.epochs):
            perm = seeds.draw(lambda g: torch.randperm(count, generator=g)).to(xs.device)   # each seed's order
            for lo in range(0, count, batch):
                idx = perm[..., lo:lo + batch]
                begin_step(self.net)
                images = self.ctx.train_transform(seeds.take(xs, idx))
                self.sgd_step(seeds.cross_entropy(self.net(images), seeds.take(ys, idx)))
