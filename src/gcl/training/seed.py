"""One seed's setup: its random states, stream, network, method and evaluator, built in the order that fixes its
random numbers, exactly as for a seed trained alone or in a stacked group; and the loop that trains it alone."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
from collections.abc import Callable

import numpy as np
import torch

from gcl.core.backbones import build_backbone
from gcl.data.benchmarks import KINDS, BenchmarkData, TrainingSettings
from gcl.data.stream import Stream
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import Method, RunSettings
from gcl.training.evaluate import Evaluator, evaluation_batch
from gcl.training.loop import StreamLoop


def seed_everything(seed: int) -> torch.Generator:
    """Seed every global RNG and return the run's own CPU generator (stream order, buffer decisions)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the loop presents the stream to a method: the one place that knows what an offline method needs.

    An offline method (JOINT) is shown every training image once, with no evaluation along the way; it makes
    its own `epochs` passes once the stream is over and is evaluated only then, and its checkpoints are not
    taken at every task end (it holds the whole stream it has kept)."""

    stream_epochs: int              # passes the stream makes
    evaluate_along: bool            # evaluate at the stream's segment or task ends (else once, at the end)
    checkpoint_at_task_ends: bool

    @classmethod
    def of(cls, method_cls: type[Method], epochs: int) -> Schedule:
        if method_cls.offline:
            return cls(stream_epochs=1, evaluate_along=False, checkpoint_at_task_ends=False)
        return cls(stream_epochs=epochs, evaluate_along=True, checkpoint_at_task_ends=True)


@dataclasses.dataclass
class SeedSetup:
    """Everything one seed trains with, built in the order that fixes its random numbers (setup_seed); `loop` trains
    the seed alone (a group trains through a loop of its own, gcl.training.stacking)."""

    seed: int
    stream: Stream
    schedule: Schedule
    net: torch.nn.Module
    method: Method
    evaluate: Evaluator
    amp: Callable[[], contextlib.AbstractContextManager]
    train_transform: Callable[[torch.Tensor], torch.Tensor]
    has_tasks: bool

    @functools.cached_property
    def loop(self) -> StreamLoop:
        """The loop that trains this seed alone (made when first asked: a member of a group never trains alone)."""
        return StreamLoop([self], self.method, self.train_transform, self.has_tasks, self.method.ctx.device,
                          self.amp)


def setup_seed(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seed: int, device: torch.device,
               compiled: str | None = None) -> SeedSetup:
    """Seed every RNG, then build the stream, the network, the method, the evaluator and the loop of one seed
    (`training`: its benchmark's training settings; `run`: its method's Run; `compiled`: compile_mode's)."""
    kind = KINDS[training.kind]
    train_transform, test_transform = kind.transforms(bench, training)
    generator = seed_everything(seed)
    method_cls = METHODS[run.algorithm]
    schedule = Schedule.of(method_cls, training.epochs)
    stream = kind.stream(bench, training, schedule.stream_epochs, run.batch, generator)
    if not schedule.evaluate_along:
        stream = dataclasses.replace(stream, eval_after=[])
    net = build_backbone(training.backbone, bench["input_shape"], bench["n_classes"],
                         channels_last=training.channels_last, width=training.width,
                         input_size=training.input_size, head=run.head, head_scale=run.head_scale).to(device)
    net.compile_mode = compiled
    ctx = MethodContext(device=device, n_classes=bench["n_classes"], train_transform=train_transform,
                        generator=generator, epochs=training.epochs, plain_transform=test_transform)
    method = method_cls(net, run, ctx)
    evaluate = Evaluator(bench, test_transform, device, evaluation_batch(training.backbone, device))
    # bf16 autocast (on a GPU, or a CPU) is entered afresh for every step and evaluation: autocast caches its bf16
    # copies of the weights until its context exits, so one context around the whole loop would keep training
    # on the weights as they were before the first in-place SGD update; a method that updates several times in
    # one step drops the copies itself after each update (gcl.methods.base.weights_changed)
    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=training.bf16)

    return SeedSetup(seed, stream, schedule, net, method, evaluate, amp, train_transform, kind.has_tasks)
