"""The one contract every continual-learning method follows, and the registry that names them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import nn

from gcl.buffer import ReservoirBuffer


@dataclass
class MethodContext:
    """What the training loop hands a method besides its network and its settings."""

    device: torch.device
    n_classes: int
    train_transform: Callable[[torch.Tensor], torch.Tensor]   # non-augmented uint8 -> network input
    generator: torch.Generator                                # CPU generator of this run (sampling decisions)
    epochs: int = 1
    plain_transform: Callable[[torch.Tensor], torch.Tensor] | None = None   # non-augmenting (the test transform)


@dataclass(frozen=True)
class Hparam:
    """A setting a method reads from its run block: its type and, if optional, its default."""

    type: type
    default: object = None
    required: bool = True
    positive: bool = True


def required(kind: type, positive: bool = True) -> Hparam:
    return Hparam(kind, required=True, positive=positive)


def optional(kind: type, default, positive: bool = True) -> Hparam:
    return Hparam(kind, default=default, required=False, positive=positive)


class Method:
    """Base class: `observe` takes one stream batch and makes one update.

    General-continual methods see only `observe`; the loop calls `begin_task`/`end_task` only on
    methods whose `needs_boundaries` is True, and only on benchmarks that have tasks.
    """

    name: ClassVar[str]
    needs_boundaries: ClassVar[bool] = False
    uses_buffer: ClassVar[bool] = False
    offline: ClassVar[bool] = False      # trains once the stream is over (JOINT); evaluated only then
    hparams: ClassVar[dict[str, Hparam]] = {"lr": required(float), "batch": required(int)}

    def __init__(self, net: nn.Module, cfg: dict, ctx: MethodContext):
        self.net = net
        self.cfg = cfg
        self.ctx = ctx
        self.params = [p for p in net.parameters() if p.requires_grad]   # what an update moves; heads append
        self.buffer = ReservoirBuffer(cfg["buffer"], ctx.device, ctx.generator) if self.uses_buffer else None

    def observe(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """One update on the (augmented) batch `x`; `x_raw` is the non-augmented batch. Returns the detached loss."""
        raise NotImplementedError

    def sgd_step(self, loss: torch.Tensor) -> torch.Tensor:
        for p in self.params:
            p.grad = None
        loss.backward()
        self.apply_gradients()
        return loss.detach()

    @torch.no_grad()
    def apply_gradients(self) -> None:
        """Plain SGD, p -= lr * p.grad (no momentum or weight decay: the reference framework's optimiser),
        as one multi-tensor op. The same update as torch.optim.SGD (tested), which is not used because
        its first construction imports torch._dynamo: ~1.8 s that every train stage would pay."""
        with_grad = [p for p in self.params if p.grad is not None]
        if with_grad:
            torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.cfg["lr"])

    def replay_batch(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        """A random buffer batch of the given fields, the examples freshly augmented."""
        out = self.buffer.sample(size, "examples", *names)
        return (self.ctx.train_transform(out[0]), *out[1:])

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def finish(self) -> None:
        """Called once after the last stream batch (the stream is over; no task boundary is revealed)."""

    def begin_task(self, task: int) -> None:
        pass

    def end_task(self, task: int) -> None:
        pass


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls
