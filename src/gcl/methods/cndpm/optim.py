"""CN-DPM's optimiser: Adam over one flat tensor per network, with an on-device "skip this update" mask.

Why not torch.optim.Adam: its step is no faster than this one, its first construction in a process imports
torch._dynamo (a cost every CN-DPM train stage would pay; docs/performance.md), and it has no on-device mask, so
skipping an unused expert's update would need a host read per expert per step."""
from __future__ import annotations

import torch
from torch import nn

from gcl.methods.base import weights_changed

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


class Adam(nn.Module):
    """Adam over every parameter of one module, written out as torch.optim.Adam's update (no weight decay, no
    amsgrad) after clipping each gradient to [-clip, clip]. Moments, step count and learning rate are buffers,
    so that a module holding this one checkpoints the optimiser with it.

    The module's parameters are re-bound as views of one flat tensor, and their gradients as views of one flat
    gradient (kept allocated: `zero_grad` zeroes it and backward accumulates into it), so that an update is a
    dozen whole-tensor operations instead of a dozen per parameter: the same arithmetic on every element. Build
    it after the module is on its device (moving the module later would undo the views)."""

    def __init__(self, module: nn.Module, lr: float):
        super().__init__()
        named = list(module.named_parameters())
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        grad = torch.zeros_like(flat)
        offset = 0
        for name, p in named:
            owner, _, attr = name.rpartition(".")
            view = nn.Parameter(flat[offset:offset + p.numel()].view_as(p), requires_grad=p.requires_grad)
            view.grad = grad[offset:offset + p.numel()].view_as(p)
            setattr(module.get_submodule(owner), attr, view)
            offset += p.numel()
        self.params, self.grad = flat, grad   # plain attributes: the module saves the parameters
        self.register_buffer("m", torch.zeros_like(flat))
        self.register_buffer("v", torch.zeros_like(flat))
        self.register_buffer("steps", torch.zeros((), device=flat.device))
        self.register_buffer("lr", torch.tensor(float(lr), device=flat.device))

    def zero_grad(self) -> None:
        self.grad.zero_()

    @torch.no_grad()
    def step(self, clip: float, mask: torch.Tensor | None = None) -> None:
        """One update; with a 0-d 0/1 `mask`, an update only where mask is 1 (parameters and state unchanged
        where it is 0), decided on the device."""
        g, m, v = self.grad, self.m, self.v
        g.clamp_min_(-clip)   # in place: the gradient is not read after the step
        g.clamp_max_(clip)
        if mask is None:
            self.steps += 1
            t = self.steps
            m.lerp_(g, 1 - BETA1)
            v.mul_(BETA2)
            v.addcmul_(g, g, value=1 - BETA2)
            step_size = self.lr / (1 - BETA1 ** t)
            denom = v.sqrt()
            denom.div_(torch.sqrt(1 - BETA2 ** t))
            denom.add_(EPS)
            update = m / denom
            update.mul_(step_size)
            self.params.sub_(update)
            weights_changed()
            return
        mask = mask.to(m.dtype)
        self.steps += mask
        t = self.steps.clamp_min(1)   # an expert never stepped keeps 0 moments: no 0/0 below
        m.lerp_(g, (1 - BETA1) * mask)
        v.add_(mask * (1 - BETA2) * (g * g - v))
        denom = (v / (1 - BETA2 ** t)).sqrt_().add_(EPS)
        self.params.sub_(mask * self.lr / (1 - BETA1 ** t) * m / denom)
        weights_changed()
