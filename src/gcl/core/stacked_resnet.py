"""S ResNet-18s (gcl.core.backbones.ResNet18), one per seed, as one network of grouped convolutions.

The seeds' images travel through the network side by side in the channels: seed s's activations are channels
[s * C, (s + 1) * C) of a (B, S * C, H, W) tensor. Each convolution is grouped by seed (groups = S), so seed s's
output channels read only its own input channels; each BatchNorm has S * C channels (StackedBatchNorm), so seed
s's channels are normalised by its own batch's statistics. One kernel then serves every seed where each seed
alone would launch its own, the point on a GPU, whose time for a ResNet-18 step at batch 32 goes to launches and
small kernels rather than arithmetic. Parameters carry the seed dimension first, (S, out, in, k, k), as every
stacked parameter does, and are read as the grouped kernel's (S * out, in, k, k) view.

Inputs and outputs are seeds first, (S, B, C, H, W) -> (S, B, classes), as for the stacked MLP; the names of the
parameters and buffers are the lone network's, so `unstack` copies a seed's state name by name.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gcl.core.backbones import MLP, BasicBlock, ResNet18
from gcl.core.stacked import StackedBatchNorm, StackedLinear, StackedMLP, unstack_state


class _GroupedConv(torch.autograd.Function):
    """A convolution grouped by seed, x (B, S * in, H, W) with weight (S, out, in, k, k). On a GPU one grouped call
    serves all seeds, forward and backward. On a CPU both passes go seed by seed, each with a lone seed's own
    kernel: grouped, the CPU takes other kernels for some shapes (the 3-channel stem's forward in stacks of 5, a
    1x1 shortcut's forward on AVX-512 machines, the stem's and the shortcuts' weight gradients), which made a seed's
    float32 numbers depend on the seeds stacked beside it; seed by seed they cannot. It costs a CPU a little
    (docs/performance.md), where `stack: auto` leaves the ResNet-18 alone anyway (a stacked step is slower there)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, stride: tuple, padding: tuple) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding = stride, padding
        if x.device.type == "cpu":
            return torch.cat([F.conv2d(xs, w, None, stride, padding) for xs, w in zip(_by_seed(x, weight), weight)], 1)
        return F.conv2d(x, weight.flatten(0, 1), None, stride, padding, groups=weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], True, False]

        def backward_of(g, inputs, w, groups):
            return torch.ops.aten.convolution_backward(g, inputs, w, None, ctx.stride, ctx.padding, (1, 1), False,
                                                       (0, 0), groups, mask)[:2]
        if x.device.type != "cpu":
            grad_x, grad_w = backward_of(grad, x, weight.flatten(0, 1), weight.shape[0])
            return grad_x, grad_w.view_as(weight), None, None
        grads = [backward_of(g, xs, w, 1) for g, xs, w in zip(_by_seed(grad, weight), _by_seed(x, weight), weight)]
        grad_x = torch.cat([g for g, _ in grads], 1) if mask[0] else None
        return grad_x, torch.stack([g for _, g in grads]), None, None


def _by_seed(t: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
    """Each seed's channels of `t` (B, S * C, H, W), laid out as a lone seed's tensor (contiguous), so that a lone
    seed's kernel takes them."""
    return [part.contiguous() for part in t.chunk(weight.shape[0], 1)]


class StackedConv2d(nn.Module):
    """S bias-free convolutions as one grouped convolution over (B, S * in, H, W) inputs."""

    def __init__(self, convs: list[nn.Conv2d]):
        super().__init__()
        first = convs[0]
        if first.bias is not None or first.groups != 1 or first.dilation != (1, 1):
            raise TypeError("only ungrouped, undilated convolutions without bias stack")
        self.weight = nn.Parameter(torch.stack([c.weight.detach() for c in convs]).clone())
        self.stride, self.padding = first.stride, first.padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GroupedConv.apply(x, self.weight, self.stride, self.padding)


class StackedBasicBlock(nn.Module):
    """S BasicBlocks (gcl.core.backbones.BasicBlock) as one."""

    def __init__(self, blocks: list[BasicBlock]):
        super().__init__()
        self.conv1 = StackedConv2d([b.conv1 for b in blocks])
        self.bn1 = StackedBatchNorm([b.bn1 for b in blocks])
        self.conv2 = StackedConv2d([b.conv2 for b in blocks])
        self.bn2 = StackedBatchNorm([b.bn2 for b in blocks])
        self.shortcut = nn.Sequential()
        if len(blocks[0].shortcut):
            self.shortcut = nn.Sequential(StackedConv2d([b.shortcut[0] for b in blocks]),
                                          StackedBatchNorm([b.shortcut[1] for b in blocks]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # BasicBlock.forward
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class StackedResNet18(nn.Module):
    """S ResNet-18s as one: input (S, B, C, H, W) -> logits (S, B, classes); features (S, B, feat_dim)."""

    def __init__(self, nets: list[ResNet18]):
        super().__init__()
        if not nets or any(type(n) is not ResNet18 for n in nets):
            raise TypeError("StackedResNet18 stacks ResNet18s, one per seed")
        first = nets[0]
        if first.channels_last:
            raise ValueError("a stacked ResNet-18 keeps the default memory layout (channels_last: false)")
        self.seeds, self.feat_dim, self.head_style = len(nets), first.feat_dim, first.head_style
        self.input_size = first.input_size
        self.stem = nn.Sequential(StackedConv2d([n.stem[0] for n in nets]), StackedBatchNorm([n.stem[1] for n in nets]),
                                  nn.ReLU())
        self.layers = nn.Sequential(*(StackedBasicBlock(list(blocks)) for blocks in zip(*(n.layers for n in nets))))
        self.classifier = StackedLinear([n.classifier for n in nets])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        s, b = x.shape[:2]
        if self.input_size is not None:      # ResNet18.pool_input, for a dry run's small inputs
            x = F.adaptive_avg_pool2d(x.flatten(0, 1), self.input_size).view(s, b, x.shape[2], *[self.input_size] * 2)
        folded = x.transpose(0, 1).reshape(b, s * x.shape[2], *x.shape[3:])      # the seeds side by side
        out = F.adaptive_avg_pool2d(self.layers(self.stem(folded)), 1).view(b, s, self.feat_dim)
        return out.transpose(0, 1).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def unstack(self, s: int, net: ResNet18) -> ResNet18:
        """Seed `s`'s weights and BatchNorm estimates, copied into `net` (a ResNet18 of the same shape)."""
        return unstack_state(self, s, net)


def stack_networks(nets: list[nn.Module]) -> StackedMLP | StackedResNet18:
    """The seeds' backbones (one per seed, of one architecture) as one stacked network."""
    if all(type(n) is MLP for n in nets):
        return StackedMLP(nets)
    if all(type(n) is ResNet18 for n in nets):
        return StackedResNet18(nets)
    raise TypeError(f"only MLPs and ResNet-18s stack, not {sorted({type(n).__name__ for n in nets})}")
