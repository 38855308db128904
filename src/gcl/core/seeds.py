"""The seed axis a method's step is written over, so that one definition trains a lone seed or S seeds stacked.

A method instance trains either one seed, whose tensors are shaped as its network takes them ((B, ...) batches,
scalar losses), or S seeds stacked (gcl.core.stacked: every tensor with a leading seed dimension, (S, B, ...), each
seed's loss a row of (S,)). A step that joins, splits, reduces and draws through `Seeds` runs unchanged either way.
The lone operations are exactly those a method written for one seed calls (the same kernels, so the same numbers);
the stacked ones give each seed the loss it would have alone, and since no parameter is shared between seeds, the
gradient of their sum is each seed's own gradient. Every random decision is made per seed, from that seed's own
generator, in the order the lone seed makes it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gcl.core.buffer import ReservoirBuffer, seed_rows
from gcl.core.stacked import StackedBatchNorm, flat_seeds, stack_sequential, unstack_state
from gcl.core.stacked_resnet import stack_networks


class Seeds:
    """The seeds one method instance trains: `generators` (one per seed, the run's own CPU generators that every
    sampling decision draws from) and whether they are `stacked` (a leading seed dimension on every tensor). A lone
    seed is Seeds([generator], stacked=False)."""

    def __init__(self, generators: Sequence[torch.Generator], stacked: bool):
        if not stacked and len(generators) != 1:
            raise ValueError(f"a lone seed has one generator, not {len(generators)}")
        self.generators, self.stacked = list(generators), stacked

    @property
    def count(self) -> int:
        return len(self.generators)

    @property
    def batch_dim(self) -> int:
        """The dimension that counts samples: 0 for a lone seed, 1 after the seed dimension."""
        return 1 if self.stacked else 0

    # ------------------------------------------------------------------ batches

    def cat(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Batches joined along the sample dimension (each seed's with its own)."""
        return torch.cat(list(tensors), self.batch_dim)

    def split(self, t: torch.Tensor, sizes: int | Sequence[int]) -> tuple[torch.Tensor, ...]:
        return t.split(sizes, self.batch_dim)

    def chunk(self, t: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        return t.chunk(n, self.batch_dim)

    def size(self, t: torch.Tensor) -> int:
        """Samples in a batch (each seed's)."""
        return t.shape[self.batch_dim]

    def take(self, t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each seed's rows `idx` of its own `t`: t[idx] alone; stacked, t (S, N, ...) and idx (S, k)."""
        if not self.stacked:
            return t[idx]
        return t[seed_rows(self.count, t.device), idx]

    def per_sample(self, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
        """fn of batches, for a function written sample by sample over one batch, applied to every seed's samples at
        once (stacked: the seeds' batches as one, the result given its seed dimension back)."""
        if not self.stacked:
            return fn(*tensors)
        out = fn(*(flat_seeds(t) for t in tensors))
        return out.view(*tensors[0].shape[:2], *out.shape[1:])

    # ------------------------------------------------------------------ losses

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of a batch (each seed's: (S,))."""
        if not self.stacked:
            return F.cross_entropy(logits, y)
        return F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(y.shape).mean(1)

    def mse(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean squared error over a batch and its classes (each seed's: (S,))."""
        if not self.stacked:
            return F.mse_loss(out, target)
        return (out - target).pow(2).mean(tuple(range(1, out.dim())))

    def zero_loss(self, device: torch.device) -> torch.Tensor:
        """A step's loss where nothing is trained (each seed's)."""
        return torch.zeros((self.count,) if self.stacked else (), device=device)

    def total(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward takes: the loss, or the sum of the seeds' losses (each seed's gradient its own)."""
        return loss.sum() if self.stacked else loss

    def flat_gradient(self, loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """The gradient of `loss` as one flat vector (each seed's: a row of (S, P))."""
        lead = (self.count,) if self.stacked else ()
        grads = torch.autograd.grad(self.total(loss), params)
        return torch.cat([g.reshape(*lead, -1) for g in grads], -1)

    def set_gradient(self, params: list[torch.Tensor], flat: torch.Tensor) -> None:
        """Write a flat_gradient-shaped gradient back into the parameters' .grad."""
        sizes = [p[0].numel() if self.stacked else p.numel() for p in params]
        for p, g in zip(params, flat.split(sizes, -1)):
            p.grad = g.reshape(p.shape)

    # ------------------------------------------------------------------ random decisions

    def draw(self, fn: Callable[[torch.Generator], torch.Tensor]) -> torch.Tensor:
        """A draw made by `fn` from each seed's generator: fn's tensor alone, stacked the seeds' tensors (S, ...)."""
        if not self.stacked:
            return fn(self.generators[0])
        return torch.stack([fn(g) for g in self.generators])

    def each(self, fn: Callable[[torch.Generator], Any]) -> list:
        """fn of each seed's generator, in seed order (plain Python values)."""
        return [fn(g) for g in self.generators]

    # ------------------------------------------------------------------ state

    def reservoir(self, capacity: int, device: torch.device) -> ReservoirBuffer:
        """The seeds' reservoir buffer: each seed's decisions from its own generator."""
        return ReservoirBuffer(capacity, device, self.generators if self.stacked else self.generators[0])


# ---------------------------------------------------------------------------- a method's state, stacked and back

def stack_module(modules: list[nn.Module]) -> nn.Module:
    """The seeds' modules (one per seed, alike in shape) as one stacked module: a backbone (gcl.core.stacked_resnet),
    a sequential head of Linear, BatchNorm1d and ReLU layers, or a ModuleDict of either; its mode and whether its
    parameters train are the seeds'."""
    first = modules[0]
    if isinstance(first, nn.ModuleDict):
        stacked = nn.ModuleDict({key: stack_module([m[key] for m in modules]) for key in first})
    elif isinstance(first, nn.Sequential):
        stacked = stack_sequential(modules)
    else:
        stacked = stack_networks(modules)
    if not any(p.requires_grad for p in first.parameters()):
        stacked.requires_grad_(False)
    return stacked.train(first.training)


def stack_value(values: list, device: torch.device):
    """The seeds' values of one method attribute as the stacked method's: modules stacked, tensors given a leading
    seed dimension, anything else the seeds' common value (refused where the seeds differ)."""
    first = values[0]
    if isinstance(first, nn.Module):
        return stack_module(values).to(device)
    if isinstance(first, torch.Tensor):
        return torch.stack(values).to(device)
    if any(v != first for v in values[1:]):
        raise ValueError(f"seeds that differ in {type(first).__name__} values do not stack")
    return first


def unstack_value(stacked, s: int, lone):
    """Seed `s`'s part of a stacked value, as its lone value: a module's weights copied into `lone` (returned), a
    tensor's row s, anything else as it is."""
    if isinstance(stacked, nn.ModuleDict):
        for key, module in stacked.items():
            unstack_value(module, s, lone[key])
        return lone
    if isinstance(stacked, nn.Module):
        if hasattr(stacked, "unstack"):
            return stacked.unstack(s, lone)
        return unstack_state(stacked, s, lone)
    if isinstance(stacked, torch.Tensor):
        return stacked[s].clone()
    return stacked


def normalises_batches(net: nn.Module) -> bool:
    """Whether `net` (lone or stacked) has BatchNorm layers, whose batch statistics make joined batches differ from
    separate ones."""
    return any(isinstance(m, (nn.modules.batchnorm._BatchNorm, StackedBatchNorm)) for m in net.modules())


# a lone seed's joins and reductions, for a loss function called outside a method (it draws nothing)
LONE = Seeds([torch.default_generator], stacked=False)
