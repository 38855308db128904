"""Stacked CLS-ER (gcl.methods.clser)."""
from __future__ import annotations

import torch

from gcl.core.stacked import flat_seeds
from gcl.core.stacked_resnet import stack_networks
from gcl.methods.base import weights_changed
from gcl.methods.clser import memory_decay, memory_draws, memory_targets
from gcl.methods.stacked.base import StackedMethod


class StackedCLSER(StackedMethod):
    """CLS-ER (gcl.methods.clser): each seed's plastic and stable memories (stacked), its two update
    draws a step from its own generator, each memory moved only in the seeds whose draw says so."""

    name = "clser"
    uses_buffer = True
    state_attrs = ("plastic", "stable", "global_step")

    def __init__(self, net, cfg, lone, transform=None):
        super().__init__(net, cfg, lone, transform)
        self.plastic = stack_networks([m.plastic for m in lone]).requires_grad_(False)
        self.stable = stack_networks([m.stable for m in lone]).requires_grad_(False)
        self.global_step = lone[0].global_step
        self._net_params = list(net.parameters())

    def unstack(self, s, lone):
        self.plastic.unstack(s, lone.plastic)
        self.stable.unstack(s, lone.stable)
        lone.global_step = self.global_step

    def observe(self, x, y, x_raw):
        cfg = self.cfg
        if self.buffer.is_empty():
            loss = self.cross_entropy(self.net(x), y)
        else:
            buf_x, buf_y = self.replay_batch(cfg.replay_batch, "labels")
            with torch.no_grad():
                target = memory_targets(flat_seeds(self.stable(buf_x)), flat_seeds(self.plastic(buf_x)),
                                        flat_seeds(buf_y)).view(*buf_y.shape, -1)
            consistency = (self.net(buf_x) - target).pow(2).mean((1, 2))
            ce = self.cross_entropy(self.net(torch.cat([x, buf_x], 1)), torch.cat([y, buf_y], 1))
            loss = cfg.reg_weight * consistency + ce
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        self.global_step += 1
        draws = torch.tensor([memory_draws(g) for g in self.generators], dtype=torch.float64)
        self._update(self.plastic, cfg.plastic_alpha, draws[:, 0] < cfg.plastic_update_freq)
        self._update(self.stable, cfg.stable_alpha, draws[:, 1] < cfg.stable_update_freq)
        return loss

    @torch.no_grad()
    def _update(self, memory: torch.nn.Module, alpha: float, chosen: torch.Tensor) -> None:
        """memory <- a memory + (1 - a) net in the chosen seeds (CLSER.update_memory), the others left as they are."""
        if not bool(chosen.any()):
            return
        a = memory_decay(self.global_step, alpha)
        dtype = self._net_params[0].dtype
        # the lone update's two factors, a and 1 - a, each rounded once to the weights' type; 1 and 0 elsewhere
        keep, move = (torch.where(chosen, f, other).to(dtype).to(self.ctx.device)
                      for f, other in ((a, 1.0), (1.0 - a, 0.0)))
        for m, p in zip(memory.parameters(), self._net_params):
            shape = (-1, *[1] * (m.dim() - 1))
            m.mul_(keep.view(shape)).add_(p * move.view(shape))
        weights_changed()
