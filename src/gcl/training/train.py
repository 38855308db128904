"""The stream loop: one run of one method on one benchmark with one seed."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from gcl.core.backbones import begin_step, build_backbone
from gcl.core.devices import environment
from gcl.core.errors import UserError
from gcl.core.results import SeedResult
from gcl.data.benchmarks import KINDS, BenchmarkData, TrainingSettings
from gcl.data.stream import Stream
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import Method, RunSettings, TaskData
from gcl.training.checkpoint import Checkpoint, restore_rng_states, rng_states
from gcl.training.evaluate import Evaluator, evaluation_batch, summarise
from gcl.training.progress import Progress, StreamProgress


class DivergenceError(UserError, RuntimeError):
    """Training produced a non-finite loss or parameters, or a network that predicts one class for everything."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed every global RNG and return the run's own CPU generator (stream order, buffer decisions)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


class Timer:
    """Wall time of the training steps only; synchronises CUDA just when it is read or paused."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self.started = None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self):
        self._sync()
        self.started = time.perf_counter()

    def stop(self):
        self._sync()
        self.total += time.perf_counter() - self.started


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


# a compiled backbone's first steps run eagerly: while the buffer fills, each step replays a batch of another size
# (at batch 1 and 16 replayed samples, 16 sizes), and each new size would be compiled for one use
EAGER_STEPS = 20


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
                         input_size=training.input_size).to(device)
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


def changes_at_finish(method) -> bool:
    """Whether `method` changes its model after the stream's last batch (JOINT trains there)."""
    return type(method).finish is not Method.finish


def last_accuracy(rows: list[dict], has_tasks: bool) -> float | None:
    """The latest evaluation's Class-IL accuracy: over the tasks seen so far, or the whole set (MNIST-360)."""
    if not rows:
        return None
    if not has_tasks:
        return rows[-1]["overall"]
    seen = rows[-1]["class_il"][:len(rows)]
    return sum(seen) / len(seen)


class StreamLoop:
    """Feeds the stream batch by batch, evaluating at segment/task ends; boundaries reach only methods that
    declare they need them, and only on benchmarks that have tasks. Its position and bookkeeping, with the
    method's state and the random states, make a checkpoint (`state` / `restore`)."""

    def __init__(self, method, stream, train_transform, evaluate: Evaluator, has_tasks: bool,
                 device: torch.device, amp=contextlib.nullcontext, checkpoint_at_task_ends: bool = True):
        self.method, self.stream, self.train_transform = method, stream, train_transform
        self.evaluate, self.has_tasks, self.device, self.amp = evaluate, has_tasks, device, amp
        self.checkpoint_at_task_ends = checkpoint_at_task_ends
        self.tell_boundaries = method.needs_boundaries and has_tasks
        self.step = 0          # the next step to run
        self.task = 0
        self.rows, self.loss_curve = [], []
        self.loss_sum, self.loss_steps = torch.zeros((), device=device), 0
        # the first step whose loss was not finite (-1: none), kept on the device and read at evaluations only
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.seconds = 0.0     # training time of earlier attempts (a resumed seed)
        self.eval_seconds = 0.0   # evaluation time, this attempt's and earlier ones'
        # the confusion matrix of an evaluation of the final model (the last step's, unless `finish` changes the
        # model after it): the seed's result takes it instead of another pass over the evaluation set
        self.final_confusion: list[list[int]] | None = None

    # the stream's images and labels on the device, copied when the loop first uses them: a stacked group
    # (gcl.training.stacked_train) never runs its seeds' loops, and keeps one copy for all of them
    @functools.cached_property
    def pool(self) -> torch.Tensor:
        return self.stream.images.to(self.device)

    @functools.cached_property
    def labels(self) -> torch.Tensor:
        return self.stream.labels.to(self.device)

    # -------------------------------------------------------------- checkpoints

    def state(self, seconds: float) -> dict:
        """What a checkpoint holds; `seconds`: the training time of this and earlier attempts."""
        return {"loop": {"step": self.step, "task": self.task, "rows": self.rows, "loss_curve": self.loss_curve,
                         "loss_sum": self.loss_sum.cpu(), "loss_steps": self.loss_steps,
                         "first_bad": self.first_bad.cpu(), "seconds": seconds, "eval_seconds": self.eval_seconds},
                "method": self.method.state_dict(),
                "rng": rng_states(self.method.ctx.generator, self.device)}

    def restore(self, saved: dict) -> None:
        loop = saved["loop"]
        self.step, self.task, self.loss_steps, self.seconds = loop["step"], loop["task"], loop["loss_steps"], loop["seconds"]
        self.eval_seconds = loop["eval_seconds"]
        self.rows, self.loss_curve = loop["rows"], loop["loss_curve"]
        self.loss_sum = loop["loss_sum"].to(self.device)
        self.first_bad = loop["first_bad"].to(self.device)
        self.method.load_state_dict(saved["method"])
        restore_rng_states(saved["rng"], self.method.ctx.generator, self.device)

    # -------------------------------------------------------------- the loop

    def task_data(self, t: int) -> TaskData:
        idx = self.stream.task_pool(t).to(self.device)
        return TaskData(index=t, x_raw=self.pool[idx], y=self.labels[idx], classes=self.stream.task_classes[t])

    def check_finite(self, step: int) -> None:
        steps = self.stream.steps
        bad = int(self.first_bad)
        if bad >= 0:
            raise DivergenceError(f"the loss became non-finite (NaN or inf) at step {bad} of {steps}: the "
                                  "learning rate or a loss weight is probably too high")
        # one host synchronisation for every parameter together (CN-DPM has none before its first expert)
        finite = [torch.isfinite(p).all() for p in self.method.params]
        if finite and not bool(torch.stack(finite).all()):
            raise DivergenceError(f"the network's parameters are no longer finite after step {step} of {steps}: "
                                  "the learning rate or a loss weight is probably too high")

    def evaluate_now(self, of_final_model: bool = False) -> None:
        """An evaluation row; `of_final_model`: nothing changes the model after it (its confusion matrix is the
        seed's)."""
        started = time.perf_counter()
        net = self.method.net
        net.eval()
        with self.amp():
            self.rows.append(self.evaluate(self.method.predict))
        net.train()
        self.final_confusion = self.evaluate.last_confusion if of_final_model else None
        self.eval_seconds += time.perf_counter() - started

    def run(self, progress: StreamProgress, checkpoint: Checkpoint | None = None) -> dict:
        """Every remaining step; returns the scores of gcl.training.evaluate.summarise."""
        method, stream, amp = self.method, self.stream, self.amp
        order, bounds = stream.order.to(self.device), stream.bounds
        eval_after, task_ends = set(stream.eval_after), stream.task_ends
        timer = Timer(self.device)
        method.net.train()
        timer.start()
        current = None
        if self.tell_boundaries and self.task < len(task_ends):
            current = self.task_data(self.task)
            if self.step == 0:   # a resumed seed's begin_task ran before its checkpoint
                with amp():
                    method.begin_task(current)
        for step in range(self.step, stream.steps):
            idx = order[bounds[step]:bounds[step + 1]]
            x_raw, y = self.pool[idx], self.labels[idx]
            begin_step(method.net, eager=step < EAGER_STEPS)
            with amp():
                loss = method.observe(self.train_transform(x_raw), y, x_raw)
            self.loss_sum += loss
            self.first_bad.masked_fill_((self.first_bad < 0) & ~torch.isfinite(loss), step)
            self.loss_steps += 1
            task_ended = bool(task_ends) and step == task_ends[self.task]
            if task_ended:
                self.task += 1
                if self.tell_boundaries:
                    with amp():
                        method.end_task(current)
                    if self.task < len(task_ends):
                        current = self.task_data(self.task)
                        with amp():
                            method.begin_task(current)
            evaluated = step in eval_after
            if evaluated:
                timer.stop()
                self.check_finite(step)
                self.loss_curve.append(float(self.loss_sum) / max(self.loss_steps, 1))
                self.loss_sum.zero_()
                self.loss_steps = 0
                self.evaluate_now(of_final_model=step == stream.steps - 1 and not changes_at_finish(method))
                timer.start()
            self.step = step + 1
            # a line at each task end, at the end, and at least every minute (MNIST-360's segments are too many)
            if task_ended or self.step == stream.steps or progress.due():
                progress.report(step, last_accuracy(self.rows, self.has_tasks))
            if checkpoint is not None and self.step < stream.steps and \
                    checkpoint.due(task_ended and self.checkpoint_at_task_ends):
                timer.stop()
                checkpoint.save(self.state(seconds=self.seconds + timer.total))
                timer.start()
        with amp():
            method.finish()
        timer.stop()
        self.check_finite(stream.steps - 1)
        if not self.rows:          # a stream without evaluation points (Schedule.evaluate_along) is scored once
            self.evaluate_now(of_final_model=True)
        return summarise(self.rows, self.loss_curve, self.has_tasks, stream.steps, stream.n_samples,
                         self.seconds + timer.total, self.eval_seconds)
