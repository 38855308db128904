"""The one contract every continual-learning method follows, and the registry that names them."""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from gcl.core.backbones import HEADS
from gcl.core.seeds import Seeds, stack_value, unstack_value
from gcl.core.settings import Settings, derived_model


@dataclass
class MethodContext:
    """What the training loop hands a method besides its network and its settings."""

    device: torch.device
    n_classes: int
    train_transform: Callable[[torch.Tensor], torch.Tensor]   # non-augmented uint8 -> network input
    generator: torch.Generator                                # CPU generator of this run (sampling decisions)
    epochs: int = 1
    plain_transform: Callable[[torch.Tensor], torch.Tensor] | None = None   # non-augmenting (the test transform)
    # the seeds the method trains: alone (the default, from `generator`), or stacked (each seed's generator)
    seeds: Seeds | None = None

    def __post_init__(self):
        if self.seeds is None:
            self.seeds = Seeds([self.generator], stacked=False)


@dataclass
class TaskData:
    """What a boundary-aware method is handed at `begin_task` / `end_task`: the task's training images
    (non-augmented uint8, on the device), their labels and the task's class range [lo, hi)."""

    index: int
    x_raw: torch.Tensor
    y: torch.Tensor
    classes: tuple[int, int]


class MethodSettings(Settings):
    """Settings every method reads."""

    lr: float = Field(gt=0, description="learning rate of plain SGD (no momentum, no weight decay)")
    batch: int = Field(gt=0, description="stream batch size")
    head: Literal[HEADS] = Field("linear", description="the classifier: linear, or cosine (ER-ACE's "
                                              "reference head: scores are head_scale x cosine similarities)")
    head_scale: float = Field(10.0, gt=0, description="the cosine head's scale (head: cosine; the reference's 10)")


class ReplaySettings(MethodSettings):
    """Settings of a method that replays a buffer batch at each step."""

    replay_batch: int = Field(gt=0, description="buffer samples replayed at each step")


class RunSettings(Settings):
    """What names a run: the first keys of a run's flat settings, which its method's settings follow (a method's
    `Run`, which @register derives from the two; what the method reads as `self.cfg`)."""

    benchmark: str = Field(description="a key of benchmarks: the benchmark the run trains on")
    method: str = Field(description="a key of methods: the named configuration the tables show")
    buffer: int | Literal["none"] = Field(description="samples kept in the method's buffer, or none")
    algorithm: str = Field(description="the registered method that implements it")


def buffer_field(uses_buffer: bool) -> tuple[Any, Any]:
    """A run's `buffer` (type, field) for a method that keeps a buffer or not."""
    if uses_buffer:
        return Annotated[int, Field(gt=0)], Field(description="samples kept in the method's buffer")
    return Literal["none"], Field(description="the method keeps no buffer")


def weights_changed() -> None:
    """To be called after every in-place update of weights that a later forward pass in the same step reads.
    Autocast (bf16) casts a weight once per context and reuses that copy until the context exits, so without
    this, a second update in one context computes with the weights as they were before the first (docs/design.md,
    "Reliability": JOINT under bf16)."""
    torch.clear_autocast_cache()


class CarriesState:
    """What a method carries across steps, saved and restored for checkpoints of a seed or of a stacked group: the
    network, the buffer (None: none) and the attributes named in `state_attrs`."""

    name: ClassVar[str]
    state_attrs: ClassVar[tuple[str, ...]] = ()
    net: nn.Module
    buffer: Any
    ctx: MethodContext

    def state_dict(self) -> dict:
        """Everything this method carries across steps, as tensors and plain values (copies)."""
        state = {"net": copy.deepcopy(self.net.state_dict())}
        if self.buffer is not None:
            state["buffer"] = self.buffer.state_dict()
        for name in self.state_attrs:
            state[name] = _pack(getattr(self, name))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (on a method built with the same settings)."""
        expected = {"net", *self.state_attrs} | ({"buffer"} if self.buffer is not None else set())
        if set(state) != expected:
            raise ValueError(f"{self.name}: a saved state with {sorted(state)} does not fit this method, "
                             f"which saves {sorted(expected)}")
        self.net.load_state_dict(state["net"])
        if self.buffer is not None:
            self.buffer.load_state_dict(state["buffer"])
        for name in self.state_attrs:
            current = getattr(self, name)
            if isinstance(current, nn.Module):
                current.load_state_dict(state[name])
            else:
                setattr(self, name, _unpack(state[name], self.ctx.device))


class Method(CarriesState):
    """Base class: `observe` takes one stream batch and makes one update.

    General-continual methods see only `observe`; the loop calls `begin_task`/`end_task` only on
    methods whose `needs_boundaries` is True, and validation refuses such a method on a benchmark
    without tasks. `Settings` declares what the method reads from its run block; `self.cfg` holds
    them validated, with the run's benchmark, method, buffer and algorithm (the method's `Run`, which
    @register derives). `state_dict` / `load_state_dict` save and restore everything
    the method carries across steps: the network, the buffer, and the attributes named in
    `state_attrs` (heads, Fisher, old network, ...), for checkpoints inside a seed.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""          # one line for the settings reference
    needs_boundaries: ClassVar[bool] = False
    uses_buffer: ClassVar[bool] = False  # takes a buffer size (runs.<name>.buffer) ...
    reservoir: ClassVar[bool] = True     # ... and keeps it as the shared reservoir (False: a memory of its own)
    offline: ClassVar[bool] = False      # trains once the stream is over (JOINT); evaluated only then
    # its training passes run the backbone outside function transforms and at a few fixed shapes (once the
    # buffer is full), so the backbone may be compiled and its steps captured as CUDA graphs
    capturable: ClassVar[bool] = False
    # why its seeds train alone, never stacked (None: its step is written over the seed axis, gcl.core.seeds, and a
    # run's seeds may train as one stacked network)
    trains_alone: ClassVar[str | None] = None
    # the classifiers (MethodSettings.head) it can train: a method that reaches into the linear head's bias, or
    # predicts without the backbone, takes only the linear one
    heads: ClassVar[tuple[str, ...]] = HEADS
    Settings: ClassVar[type[MethodSettings]] = MethodSettings
    Run: ClassVar[type[RunSettings]]     # RunSettings + Settings, the buffer typed by uses_buffer (@register)

    def __init__(self, net: nn.Module, cfg: RunSettings, ctx: MethodContext):
        self.net = net
        self.cfg = cfg       # an instance of this method's Run
        self.ctx = ctx
        self.seeds = ctx.seeds   # what a step joins, reduces and draws through (gcl.core.seeds)
        self._extra_gradients = None   # a plug-in's, for this step's sgd_step (set by `step`)
        self.params = [p for p in net.parameters() if p.requires_grad]   # what an update moves; heads append
        self.buffer = (ctx.seeds.reservoir(cfg.buffer, ctx.device)
                       if self.uses_buffer and self.reservoir else None)
        if ctx.seeds.stacked and self.trains_alone:
            raise TypeError(f"{self.name} trains its seeds alone: {self.trains_alone}")

    def step(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """What the loop calls for a stream batch: a plug-in's `extra_gradients` first (before the method draws
        anything), then `observe`, whose `sgd_step` adds them to its own gradient. Returns the detached loss."""
        self._extra_gradients = self.extra_gradients()
        try:
            loss = self.observe(x, y, x_raw)
            if self._extra_gradients is not None:
                raise TypeError(f"{self.name}: its update does not take a plug-in's gradients (they are added by "
                                "sgd_step, which its observe does not call)")
            return loss
        finally:
            self._extra_gradients = None

    def observe(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """One update on the (augmented) batch `x`; `x_raw` is the non-augmented batch. Returns the detached loss."""
        raise NotImplementedError

    def extra_gradients(self) -> list[torch.Tensor | None] | None:
        """A plug-in's hook (STAR): gradients for each of `self.params` (None where none), which this step's
        `sgd_step` adds to the method's own; taken before the method's own draws. None: no extra term this step."""
        return None

    def sgd_step(self, loss: torch.Tensor) -> torch.Tensor:
        """One SGD step on `loss` (each seed's, stacked) plus the step's extra gradients; returns it detached."""
        for p in self.params:
            p.grad = None
        self.seeds.total(loss).backward()
        extra, self._extra_gradients = self._extra_gradients, None
        if extra is not None:
            with torch.no_grad():
                for p, g in zip(self.params, extra):
                    if g is not None:
                        p.grad = g if p.grad is None else p.grad.add_(g)
        self.apply_gradients()
        return loss.detach()

    @torch.no_grad()
    def apply_gradients(self) -> None:
        """Plain SGD, p -= lr * p.grad (no momentum or weight decay: the reference framework's optimiser),
        as one multi-tensor op. The same update as torch.optim.SGD (tested), which is not used because
        its first construction imports torch._dynamo, which every train stage would pay (docs/performance.md)."""
        with_grad = [p for p in self.params if p.grad is not None]
        if with_grad:
            torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.cfg.lr)
        weights_changed()

    def replay_batch(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        """A random buffer batch of the given fields (each seed's), the examples freshly augmented."""
        out = self.buffer.sample(size, "examples", *names)
        return (self.ctx.train_transform(out[0]), *out[1:])

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores of evaluation inputs: what the accuracies and the confusion matrix count."""
        return self.net(x)

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The representation `predict` classifies, for the report's t-SNE and the loop's collapse check:
        the network's penultimate layer, unless a method predicts with other networks (CN-DPM's experts)."""
        return self.net.features(x)

    def finish(self) -> None:
        """Called once after the last stream batch (the stream is over; no task boundary is revealed)."""

    def extra_metrics(self) -> dict:
        """Method-specific figures stored with each seed's results (e.g. experts created); JSON values."""
        return {}

    # ------------------------------------------------------------------ stacked seeds

    def stack(self, lone: list[Method]) -> None:
        """Take the state of `lone` (one method per seed, each set up as that seed alone) as this method's, which
        trains them stacked (its network already their stacked network): their buffers' contents, every attribute
        of `state_attrs` stacked (modules and tensors; other values are the seeds' alike), and the trained
        parameters gathered again, in the lone order."""
        if self.buffer is not None and not all(m.buffer.is_empty() for m in lone):
            raise ValueError("only methods that have not trained yet stack (a checkpoint restores a stack)")
        for name in self.state_attrs:
            setattr(self, name, stack_value([getattr(m, name) for m in lone], self.ctx.device))
        params = [p for p in self.net.parameters() if p.requires_grad]
        for name in self.state_attrs:
            value = getattr(self, name)
            if isinstance(value, nn.Module):
                params += [p for p in value.parameters() if p.requires_grad]
        shapes = [(len(lone), *p.shape) for p in lone[0].params]
        if [tuple(p.shape) for p in params] != shapes:
            raise TypeError(f"{self.name}: its stacked parameters do not match a lone seed's (trained modules outside "
                            "`net` must be named in state_attrs)")
        self.params = params

    def unstack(self, s: int, lone: Method) -> None:
        """Copy seed `s`'s state into its lone method `lone` (network and `state_attrs`), which then predicts as the
        seed would had it trained alone."""
        unstack_value(self.net, s, lone.net)
        for name in self.state_attrs:
            setattr(lone, name, unstack_value(getattr(self, name), s, getattr(lone, name)))

    def begin_task(self, task: TaskData) -> None:
        """Called before the first batch of each task (boundary-aware methods on benchmarks with tasks)."""

    def end_task(self, task: TaskData) -> None:
        """Called after the last batch of each task (boundary-aware methods on benchmarks with tasks)."""



def _pack(value):
    """A detached copy of a method attribute: a module's state_dict, tensors cloned, containers walked."""
    if isinstance(value, nn.Module):
        return copy.deepcopy(value.state_dict())
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    return copy.deepcopy(value)


def _unpack(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _unpack(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v, device) for v in value)
    return value


METHODS: dict[str, type[Method]] = {}


def run_model(cls: type[Method]) -> type[RunSettings]:
    """The flat run settings of method `cls`: RunSettings (benchmark, method, buffer, algorithm) then its Settings,
    the buffer a positive integer or 'none' as the method keeps one or not, the algorithm its name."""
    return derived_model(f"{cls.__name__}Run", cls.__module__, (cls.Settings, RunSettings),
                         f"A run of {cls.name}: its flat, resolved settings.",
                         buffer=buffer_field(cls.uses_buffer), algorithm=(Literal[cls.name], Field(cls.name)))


def register(cls: type[Method]) -> type[Method]:
    """Register a method under its `name`, with its `Run` settings (run_model)."""
    cls.Run = run_model(cls)
    METHODS[cls.name] = cls
    return cls
