"""Backbones: a feature extractor plus a linear classifier, so that methods can reach the features."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


def compile_extractor(fn: Callable, mode: str) -> Callable:
    """torch.compile with automatic dynamic shapes: the first batch size gets a fixed-shape graph, the second a graph
    whose batch dimension is symbolic, which every later size reuses. With fixed shapes each size would be a graph
    of its own, and after dynamo's limit of 8 per function the rest would run eagerly, while a MNIST-360 stream has
    9-12 sizes (its segments' last batches; docs/performance.md). CUDA graphs (mode reduce-overhead) still record
    one graph per size they meet, which needs no recompilation."""
    return torch.compile(fn, mode=mode, dynamic=None)


def _extract(net: Backbone, x: torch.Tensor) -> torch.Tensor:
    return net.extract(x)


@lru_cache(maxsize=None)
def compiled_extract(mode: str) -> Callable:
    """One compiled `_extract` per mode and process. The network is an argument, not a closure: its weights are
    the graph's inputs, so a deep copy of a compiled network (an EMA copy, an old network) computes with its own
    weights, and every network of one class (each seed's) shares the graphs."""
    return compile_extractor(_extract, mode)


def begin_step(net: nn.Module, eager: bool = False) -> None:
    """A training step begins. `eager`: run this step's passes eagerly even if the backbone is compiled (the loop's
    first steps, while the buffer fills and each step's replayed batch has a new size: compiling a shape that
    never recurs wastes the compilation and dynamo's limit of 8 graphs per function). With CUDA graphs, the
    previous step's graph outputs may now be reused (they are consumed within their step)."""
    mode = getattr(net, "compile_mode", None)
    if mode is None:
        return
    net.eager_for_now = eager
    if mode == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()


class Backbone(nn.Module):
    """`features(x)` gives the penultimate representation (width `feat_dim`); `forward` the logits.

    `compile_mode` (None: eager) compiles the feature extractor for training: forward passes in training mode
    with gradients on go through torch.compile (on CUDA "reduce-overhead", i.e. CUDA graphs of the forward and
    the backward); evaluation, no-grad passes and function transforms (GSS's vmap) stay eager.
    """

    feat_dim: int
    # which of a method's head recipes fits this network (CoCa's authors use one for the MNIST MLP and one for the
    # ResNet): decided by the architecture, not by its width, so a narrowed network takes the heads of its kind
    head_style: str
    compile_mode: str | None = None
    eager_for_now: bool = False      # set per step by begin_step
    input_size: int | None = None    # average-pool the input to this side first (dry runs only; see build_backbone)

    def pool_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.input_size is None else F.adaptive_avg_pool2d(x, self.input_size)

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.compile_mode is not None and not self.eager_for_now and self.training and torch.is_grad_enabled():
            return compiled_extract(self.compile_mode)(self, x)
        return self.extract(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(Backbone):
    """MNIST-360's network: input -> 100 -> ReLU -> 100 -> ReLU -> Linear(100, classes), Xavier-uniform, zero bias."""

    head_style = "mlp"
    standard_width = 100

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, width: int = standard_width,
                 input_size: int | None = None):
        super().__init__()
        hidden = width
        self.feat_dim, self.input_size = hidden, input_size
        c, h, w = input_shape
        pixels = h * w if input_size is None else input_size ** 2
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(c * pixels, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.classifier = nn.Linear(hidden, n_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.pool_input(x))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN, when the shape changes) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(Backbone):
    """ResNet-18 for small images (DER's protocol): 3x3 stride-1 stem without max-pool, BasicBlock x [2, 2, 2, 2]
    at widths 64/128/256/512 (`width` sets the first, the others follow as 2x, 4x, 8x), global average pooling,
    Linear(8 * width, classes). Any input size (32x32, 64x64).

    `channels_last` stores the weights and feeds the activations in NHWC, which cuDNN's convolutions (and bf16
    autocast) run faster on recent GPUs and oneDNN's on a CPU; the arithmetic is fp32 either way, but the
    convolutions' gradients are summed in another order, so the numbers round otherwise.
    """

    head_style = "resnet"
    standard_width = 64

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, width: int = standard_width,
                 input_size: int | None = None, channels_last: bool = False):
        super().__init__()
        self.feat_dim, self.input_size = 8 * width, input_size
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], width, 3, stride=1, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers, in_planes = [], width
        for planes, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
            layers += [BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)]
            in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Linear(self.feat_dim, n_classes)
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.layers(self.stem(self.pool_input(x)))
        return torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)


BACKBONES = {"mlp": MLP, "resnet18": ResNet18}

HEADS = ("linear", "cosine")


class CosineClassifier(nn.Module):
    """A bias-free classifier on cosine similarities: scale * <x / (|x| + eps), w_c / (|w_c| + eps)> for each class c.

    The head ER-ACE's reference code trains with (its `distLinear`, the ER-ACE paper's code and mammoth's `er_ace`
    alike): features and class weights L2-normalised with eps 1e-5 added to the norm, scores multiplied by `scale`
    (10 there). The weight is (classes, features), initialised as a bias-free nn.Linear's.
    """

    eps = 1e-5

    def __init__(self, in_features: int, n_classes: int, scale: float):
        super().__init__()
        self.in_features, self.out_features, self.scale = in_features, n_classes, scale
        self.weight = nn.Parameter(nn.Linear(in_features, n_classes, bias=False).weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = x / (x.norm(dim=1, keepdim=True) + self.eps)
        w_hat = self.weight / (self.weight.norm(dim=1, keepdim=True) + self.eps)
        return self.scale * (x_hat @ w_hat.t())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scale={self.scale}"


@contextmanager
def inputs_as_given(net: nn.Module) -> Iterator[None]:
    """Inside it a channels_last network leaves its input's layout as it is: under vmap (GSS's per-sample
    gradients) a per-sample input cannot be converted, and the convolutions accept either layout."""
    converts = getattr(net, "channels_last", False)
    net.channels_last = False
    try:
        yield
    finally:
        net.channels_last = converts


def build_backbone(name: str, input_shape: tuple[int, ...], n_classes: int, channels_last: bool = False,
                   width: int | None = None, input_size: int | None = None, head: str = "linear",
                   head_scale: float = 10.0) -> Backbone:
    """Backbone `name` for inputs of `input_shape`. `width` (None: the architecture's own) and `input_size` (None: the
    images as they are) shrink the network's cost while keeping its architecture, for dry runs (gcl.dryrun): a
    ResNet-18 step on 32x32 images costs seconds on a CPU at full width and still tens of milliseconds at width 1.
    `head`: the classifier, "linear" (nn.Linear with bias) or "cosine" (CosineClassifier with `head_scale`); the
    body's initial weights are the same either way (the cosine head is drawn after them)."""
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; known backbones: {sorted(BACKBONES)}")
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; known heads: {list(HEADS)}")
    cls = BACKBONES[name]
    if channels_last and name != "resnet18":
        raise ValueError(f"channels_last applies to convolutional backbones (resnet18), not {name!r}")
    extra = {"channels_last": True} if channels_last else {}
    net = cls(tuple(input_shape), n_classes, width=width or cls.standard_width, input_size=input_size, **extra)
    if head == "cosine":
        net.classifier = CosineClassifier(net.feat_dim, n_classes, head_scale)
        if channels_last:
            net.to(memory_format=torch.channels_last)
    return net
