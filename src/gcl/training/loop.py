"""The stream loop of one seed: feeding the stream batch by batch, telling boundaries to the methods that need
them, evaluating at segment and task ends, checking that training stays finite, and its checkpoints."""
from __future__ import annotations

import contextlib
import functools
import time

import torch

from gcl.core.backbones import begin_step
from gcl.core.errors import UserError
from gcl.methods.base import Method, TaskData
from gcl.training.checkpoint import Checkpoint, restore_rng_states, rng_states
from gcl.training.evaluate import Evaluator, summarise
from gcl.training.progress import StreamProgress


class DivergenceError(UserError, RuntimeError):
    """Training produced a non-finite loss or parameters, or a network that predicts one class for everything."""


# a compiled backbone's first steps run eagerly: while the buffer fills, each step replays a batch of another size
# (at batch 1 and 16 replayed samples, 16 sizes), and each new size would be compiled for one use
EAGER_STEPS = 20


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
