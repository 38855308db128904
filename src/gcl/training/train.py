"""One seed of one run: its setup (stream, network, method, evaluator, loop), its training and its result."""
from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from gcl.core.backbones import build_backbone
from gcl.core.devices import environment
from gcl.core.results import SeedResult
from gcl.data.benchmarks import KINDS, BenchmarkData, TrainingSettings
from gcl.data.stream import Stream
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import Method, RunSettings
from gcl.training.checkpoint import Checkpoint
from gcl.training.evaluate import Evaluator, evaluation_batch
from gcl.training.loop import DivergenceError, StreamLoop
from gcl.training.progress import Progress, StreamProgress


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
    """Everything one seed trains with, built in the order that fixes its random numbers (gcl.training.train.setup_seed)."""

    stream: Stream
    schedule: Schedule
    net: torch.nn.Module
    method: Method
    evaluate: Evaluator
    loop: StreamLoop
    amp: Callable[[], contextlib.AbstractContextManager]




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

    loop = StreamLoop(method, stream, train_transform, evaluate, kind.has_tasks, device, amp,
                      schedule.checkpoint_at_task_ends)
    return SeedSetup(stream, schedule, net, method, evaluate, loop, amp)


def run_seed(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seed: int, device: torch.device,
             feature_samples: int = 0, progress: Progress | None = None, checkpoint: Checkpoint | None = None,
             compiled: str | None = None) -> SeedResult:
    """Train `run`'s method over the benchmark stream and return this seed's metrics (setup_seed's arguments).

    With `feature_samples` > 0 the result also holds `features`: the final network's penultimate
    features of that many evaluation images (for t-SNE), which the caller stores apart from the JSON.
    `progress` receives a line at every evaluation and at least every minute; with `checkpoint` the seed
    resumes from its saved state (if one with the same fingerprint exists) and saves it as it goes.
    """
    s = setup_seed(bench, training, run, seed, device, compiled)
    loop = s.loop
    progress = progress or Progress(run.method, seed=seed)
    saved = checkpoint.load(progress.say) if checkpoint else None
    if saved is not None:
        loop.restore(saved)
        progress.say(f"resumed from {checkpoint.path} at step {loop.step} of {s.stream.steps}")
    scores = loop.run(StreamProgress(progress, s.stream, loop.has_tasks, s.schedule.stream_epochs, loop.step),
                      checkpoint)
    return seed_result(s, scores, bench, training, device, feature_samples)


def seed_result(s: SeedSetup, scores: dict, bench: BenchmarkData, training: TrainingSettings, device: torch.device,
                feature_samples: int = 0, **environment_extra) -> SeedResult:
    """A trained seed's result: its scores (summarise's), with the final network's confusion matrix, its method's
    own metrics and (`feature_samples` > 0) features for the t-SNE, after the collapse check."""
    net, method, evaluate = s.net, s.method, s.evaluate
    started = time.perf_counter()
    with s.amp():
        net.eval()
        confusion = s.loop.final_confusion or evaluate.confusion(method.predict)
        if evaluate.features_collapsed(method.features):
            raise DivergenceError("the trained network gives every evaluation image the same features (a collapsed "
                                  "network, e.g. all-zero after dead ReLUs), so it predicts one class for everything: "
                                  "the learning rate or a loss weight is probably too high")
        method_metrics = method.extra_metrics()
        features = evaluate.features(method.features, feature_samples) if feature_samples else None
    if scores.get("eval_seconds") is not None:
        scores = scores | {"eval_seconds": scores["eval_seconds"] + time.perf_counter() - started}
    # the memory layout changes a convolution's rounding, not its arithmetic: recorded where it is not the default
    layout = {"layout": "channels_last"} if training.channels_last else {}
    return SeedResult(**scores, confusion=confusion, method_metrics=method_metrics,
                      environment=environment(device, training.bf16, net.compile_mode) | layout | environment_extra,
                      features=features)


