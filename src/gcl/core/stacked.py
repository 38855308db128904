"""Seeds stacked: S seeds' networks as one network whose parameters carry a leading seed dimension, so that one
forward, one backward and one update serve every seed (their buffers: gcl.core.buffer, stacked).

Each seed keeps what is its own: its weights (initialised as its own network was: a stacked network stacks
networks built one by one). Inputs and outputs carry the seed dimension
first: (S, B, ...). A loss that sums the seeds' losses gives each seed's parameters exactly the gradient it would
get alone, since no parameter is shared; so in float64 a stacked seed matches its lone run to rounding
(tests/test_stacked.py; the ResNet-18's grouped convolutions: gcl.core.stacked_resnet), and in float32 the
two paths round differently (equal in distribution, not bit for bit).

Batched matmuls (torch.baddbmm over the seed dimension) rather than torch.func.vmap over stacked state: faster
than both vmap and separate networks on a CPU (docs/performance.md, "Stacked seeds").
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gcl.core.backbones import MLP


class _BatchedLinear(torch.autograd.Function):
    """x (S, B, in) @ weight (S, out, in)^T + bias (S, out), with a backward that writes the weight's gradient in the
    weight's own layout (autograd's backward of the transposed view computes it as (S, in, out) and then copies
    it, much slower for the 784-wide first layer: docs/performance.md). Its input and gradient are taken
    contiguous: one laid out otherwise (a stacked BatchNorm1d's output, seeds interleaved) is laid out as a lone
    seed's only in a stack of one, and the CPU sums the bias gradient of such a gradient in another order in larger
    stacks, which made a CoCa seed's float32 numbers depend on the seeds beside it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        return grad_x, torch.bmm(grad.transpose(1, 2), x), grad.sum(1)


class StackedLinear(nn.Module):
    """S independent linear layers: x (S, B, in) -> (S, B, out), weight (S, out, in), bias (S, out).

    The weight keeps nn.Linear's layout and the product reads it transposed. Stored as (S, in, out) it is faster
    (docs/performance.md), but then a seed's float32 numbers change with the other seeds of its stack
    (tests/test_stacking.py), and so with `workers`; in this layout they do not (docs/performance.md: on which
    CPU)."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]).clone())
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BatchedLinear.apply(x, self.weight, self.bias)


class StackedBatchNorm(nn.Module):
    """S BatchNorms of C channels (one per seed) as one BatchNorm of S x C channels, for inputs whose channels hold
    the seeds one after the other, (B, S * C, ...): each seed's channels are normalised by the statistics of its
    own batch alone and keep their own running estimates, so each is its lone BatchNorm. Weights and running
    estimates carry the seed dimension first, (S, C), as every stacked parameter does."""

    def __init__(self, norms: list[nn.modules.batchnorm._BatchNorm]):
        super().__init__()
        first = norms[0]
        if not (first.affine and first.track_running_stats) or first.momentum is None:
            raise TypeError("only affine BatchNorms with running estimates and a momentum stack")
        self.eps, self.momentum = first.eps, first.momentum
        self.weight = nn.Parameter(torch.stack([n.weight.detach() for n in norms]).clone())
        self.bias = nn.Parameter(torch.stack([n.bias.detach() for n in norms]).clone())
        self.register_buffer("running_mean", torch.stack([n.running_mean for n in norms]).clone())
        self.register_buffer("running_var", torch.stack([n.running_var for n in norms]).clone())
        # every seed takes as many training steps as the others: one count serves them all
        self.register_buffer("num_batches_tracked", first.num_batches_tracked.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.num_batches_tracked.add_(1)
        # the flattened estimates are views of the (S, C) buffers: batch_norm updates them in place
        return F.batch_norm(x, self.running_mean.view(-1), self.running_var.view(-1), self.weight.view(-1),
                            self.bias.view(-1), self.training, self.momentum, self.eps)


class StackedBatchNorm1d(StackedBatchNorm):
    """StackedBatchNorm for features laid out seeds first, (S, B, C), as a stacked head's are. On a CPU it goes seed
    by seed: over S x C channels of one value each per sample the CPU's kernel spreads channels over its vector
    lanes, and where C is not a multiple of their count (CoCa's 100-wide heads on the MLP) a seed's gradient then
    rounds otherwise in larger stacks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            if self.training:
                self.num_batches_tracked.add_(1)
            # each seed's running estimates are rows of the (S, C) buffers: batch_norm updates them in place
            return torch.stack([F.batch_norm(seed, self.running_mean[i], self.running_var[i], self.weight[i],
                                             self.bias[i], self.training, self.momentum, self.eps)
                                for i, seed in enumerate(x.contiguous())])
        s, b, c = x.shape
        out = super().forward(x.transpose(0, 1).reshape(b, s * c))
        return out.view(b, s, c).transpose(0, 1)


def unstack_state(stacked: nn.Module, s: int, lone: nn.Module) -> nn.Module:
    """Copy seed `s`'s parameters and buffers of a stacked module into `lone`, whose state has the same names (the
    stacked tensors with the seed dimension first; a BatchNorm's step count shared by all seeds)."""
    state = stacked.state_dict()
    with torch.no_grad():
        for name, value in lone.state_dict().items():
            value.copy_(state[name] if name.endswith("num_batches_tracked") else state[name][s])
    return lone


def stack_sequential(seqs: list[nn.Sequential]) -> nn.Sequential:
    """S sequentials of Linear, BatchNorm1d and ReLU layers (one per seed, alike in shape) as one, for inputs
    (S, B, features); a TypeError for any other layer."""
    layers = []
    for parts in zip(*seqs):
        if all(isinstance(m, nn.Linear) for m in parts):
            layers.append(StackedLinear(list(parts)))
        elif all(isinstance(m, nn.BatchNorm1d) for m in parts):
            layers.append(StackedBatchNorm1d(list(parts)))
        elif all(isinstance(m, nn.ReLU) for m in parts):
            layers.append(nn.ReLU())
        else:
            raise TypeError(f"only Linear, BatchNorm1d and ReLU layers stack, not {type(parts[0]).__name__}")
    return nn.Sequential(*layers)


def unstack_sequential(stacked: nn.Sequential, s: int, seq: nn.Sequential) -> None:
    """Copy seed `s`'s weights (and running estimates) of a stack_sequential into that seed's own sequential."""
    unstack_state(stacked, s, seq)


class StackedMLP(nn.Module):
    """S MLPs (gcl.core.backbones.MLP) as one: input (S, B, C, H, W) -> logits (S, B, classes)."""

    def __init__(self, nets: list[MLP]):
        super().__init__()
        if not nets or any(type(n) is not MLP for n in nets):
            raise TypeError("StackedMLP stacks MLPs, one per seed")
        first = nets[0]
        if first.input_size is not None:
            raise ValueError("a stacked MLP takes its input as it is (input_size: none)")
        self.seeds, self.feat_dim, self.head_style = len(nets), first.feat_dim, first.head_style
        self.fc1 = StackedLinear([n.body[1] for n in nets])
        self.fc2 = StackedLinear([n.body[3] for n in nets])
        self.classifier = StackedLinear([n.classifier for n in nets])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2)
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def unstack(self, s: int, net: MLP) -> MLP:
        """Seed `s`'s weights, copied into `net` (an MLP of the same shape): its network as if trained alone."""
        for stacked, layer in ((self.fc1, net.body[1]), (self.fc2, net.body[3]), (self.classifier, net.classifier)):
            unstack_state(stacked, s, layer)
        return net


def flat_seeds(t: torch.Tensor) -> torch.Tensor:
    """(S, B, ...) -> (S * B, ...), for losses written per sample."""
    return t.reshape(math.prod(t.shape[:2]), *t.shape[2:])
