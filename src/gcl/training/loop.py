"""The stream loop of a group of seeds of one run: one seed alone, or several stacked (one network and one step for
all of them, gcl.core.seeds). It feeds each seed's stream batch by batch, tells task boundaries to the methods that
need them, evaluates every seed at segment and task ends with its own evaluator, checks that training stays finite,
and saves and restores the group's checkpoints. A seed's numbers do not depend on whether it trains alone or in a
group beyond the kernels' rounding (float64: equal to 1e-9, tests/test_stacking.py)."""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field

import torch

from gcl.core.backbones import begin_step
from gcl.core.buffer import seed_rows
from gcl.core.errors import UserError
from gcl.data.stream import Stream
from gcl.methods.base import Method, TaskData
from gcl.training.checkpoint import Checkpoint, global_rng_states, restore_global_rng_states
from gcl.training.evaluate import summarise
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


@dataclass
class SeedRecord:
    """What the loop records of one seed: its evaluation rows and loss curve, its evaluation seconds, and the
    confusion matrix of an evaluation of its final model (the last step's, unless `finish` changes the model after
    it), which the seed's result takes instead of another pass over the evaluation set."""

    rows: list[dict] = field(default_factory=list)
    loss_curve: list[float] = field(default_factory=list)
    eval_seconds: float = 0.0
    final_confusion: list[list[int]] | None = None


class GroupPool:
    """A group's training images and labels on the device: one copy where every seed's stream holds the same pool (a
    sequential benchmark's: each seed only orders it its own way, and a lone seed's), else each seed's own pool,
    stacked (MNIST-360's, rotated by each seed's draws). So a group on Tiny ImageNet holds its 1.2 GB once."""

    def __init__(self, streams: list[Stream], device: torch.device):
        first = streams[0]
        self.shared = all(st.images is first.images and st.labels is first.labels for st in streams)
        if self.shared:
            self.images, self.labels = first.images.to(device), first.labels.to(device)
        else:
            self.images = torch.stack([st.images for st in streams]).to(device)       # (S, pool, ...)
            self.labels = torch.stack([st.labels for st in streams]).to(device)
            self.rows = seed_rows(len(streams), device)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The images and labels at pool indices `idx`: (B,) alone, each seed's (S, B) stacked."""
        if self.shared:
            return self.images[idx], self.labels[idx]
        return self.images[self.rows, idx], self.labels[self.rows, idx]


class StreamLoop:
    """Feeds a group's streams batch by batch to `method` (a lone seed's own method, or the group's stacked one),
    evaluating at segment/task ends; boundaries reach only methods that declare they need them, and only on
    benchmarks that have tasks (such methods train alone). `setups` are the seeds' own (gcl.training.train.SeedSetup:
    stream, evaluator, lone method); `transform` is the training transform of a batch, and `augment_generators` the
    stacked seeds' augmentation generators (gcl.data.augment.SeedwiseTransform; none alone, where augmentation draws
    from the global generator). Its position and records, with the method's state and every random state, make a
    checkpoint (`state` / `restore`)."""

    def __init__(self, setups: list, method: Method, transform, has_tasks: bool, device: torch.device,
                 amp=contextlib.nullcontext, augment_generators: list[torch.Generator] | None = None):
        self.setups, self.method, self.train_transform = setups, method, transform
        self.has_tasks, self.device, self.amp = has_tasks, device, amp
        self.augment_generators = augment_generators or []
        self.stacked = method.seeds.stacked
        self.stream = setups[0].stream      # every seed's stream has the same batches, evaluations and task ends
        self.checkpoint_at_task_ends = setups[0].schedule.checkpoint_at_task_ends
        self.tell_boundaries = method.needs_boundaries and has_tasks
        self.step = 0          # the next step to run
        self.task = 0
        self.records = [SeedRecord() for _ in setups]
        shape = (len(setups),) if self.stacked else ()
        self.loss_sum, self.loss_steps = torch.zeros(shape, device=device), 0
        # the losses since the last evaluation (loss_steps of them), kept on the device and read only where their
        # sum is no longer finite, to name the first step that was not
        self.window: list[torch.Tensor] = []
        self.seconds = 0.0     # training time of earlier attempts (a resumed group)

    # the streams' images and labels on the device, copied when the loop first uses them
    @functools.cached_property
    def pool(self) -> GroupPool:
        return GroupPool([s.stream for s in self.setups], self.device)

    # -------------------------------------------------------------- checkpoints

    def state(self, seconds: float) -> dict:
        """What a checkpoint holds; `seconds`: the training time of this and earlier attempts."""
        records = [{"rows": r.rows, "loss_curve": r.loss_curve, "eval_seconds": r.eval_seconds} for r in self.records]
        window = torch.stack(self.window).cpu() if self.window else torch.zeros((0, *self.loss_sum.shape))
        return {"loop": {"step": self.step, "task": self.task, "seeds": records, "loss_sum": self.loss_sum.cpu(),
                         "loss_steps": self.loss_steps, "window": window, "seconds": seconds},
                "method": self.method.state_dict(),
                "rng": {"global": global_rng_states(self.device),
                        "runs": [g.get_state() for g in self.method.seeds.generators],
                        "augment": [g.get_state() for g in self.augment_generators]}}

    def restore(self, saved: dict) -> None:
        loop, rng = saved["loop"], saved["rng"]
        if len(loop["seeds"]) != len(self.records):
            raise ValueError(f"a checkpoint of {len(loop['seeds'])} seeds does not fit a group of {len(self.records)}")
        self.step, self.task, self.seconds = loop["step"], loop["task"], loop["seconds"]
        self.loss_sum, self.loss_steps = loop["loss_sum"].to(self.device), loop["loss_steps"]
        self.window = list(loop["window"].to(self.device).unbind(0))
        self.records = [SeedRecord(r["rows"], r["loss_curve"], r["eval_seconds"]) for r in loop["seeds"]]
        self.method.load_state_dict(saved["method"])
        restore_global_rng_states(rng["global"], self.device)
        for g, state in zip([*self.method.seeds.generators, *self.augment_generators], [*rng["runs"], *rng["augment"]]):
            g.set_state(state)

    # -------------------------------------------------------------- the loop

    def task_data(self, t: int) -> TaskData:
        """A lone seed's task `t` (boundary-aware methods train alone)."""
        idx = self.stream.task_pool(t).to(self.device)
        x_raw, y = self.pool.batch(idx)
        return TaskData(index=t, x_raw=x_raw, y=y, classes=self.stream.task_classes[t])

    def _who(self, bad: list[int]) -> str:
        """The seeds named in a group's divergence (a lone seed's caller names it)."""
        return f"seed(s) {[self.setups[s].seed for s in bad]}: " if self.stacked else ""

    def check_finite(self, step: int) -> None:
        """Refuse a group whose loss since the last evaluation (up to `step`) or whose weights stopped being finite,
        naming the first step whose loss was not (and the seeds, stacked)."""
        steps = self.stream.steps
        finite = torch.isfinite(self.loss_sum).reshape(-1).tolist()     # one host synchronisation for the group
        bad = [s for s, fine in enumerate(finite) if not fine]
        if bad:
            first = step - len(self.window) + 1
            losses = torch.stack(self.window).reshape(len(self.window), -1)[:, bad[0]]
            where = (~torch.isfinite(losses)).nonzero()
            at = f"at step {first + int(where[0])}" if len(where) else f"(its sum overflowed) by step {step}"
            raise DivergenceError(f"{self._who(bad)}the loss became non-finite (NaN or inf) {at} of {steps}: the "
                                  "learning rate or a loss weight is probably too high")
        # every parameter together, each seed's apart (CN-DPM has none before its first expert)
        finite = [torch.isfinite(p.flatten(1)).all(1) if self.stacked else torch.isfinite(p).all()
                  for p in self.method.params]
        if finite:
            ok = torch.stack(finite).all(0).reshape(-1).tolist()
            bad = [s for s, fine in enumerate(ok) if not fine]
            if bad:
                raise DivergenceError(f"{self._who(bad)}the network's parameters are no longer finite after step "
                                      f"{step} of {steps}: the learning rate or a loss weight is probably too high")

    def evaluate_now(self, of_final_model: bool = False) -> None:
        """An evaluation row of every seed, each by its own evaluator through its own method (a stacked seed's state
        copied back into it first); `of_final_model`: nothing changes the model after it (its confusion matrix is
        the seed's)."""
        for s, (setup, record) in enumerate(zip(self.setups, self.records)):
            started = time.perf_counter()
            lone = setup.method
            if lone is not self.method:
                self.method.unstack(s, lone)
            lone.net.eval()
            with self.amp():
                record.rows.append(setup.evaluate(lone.predict))
            lone.net.train()
            record.final_confusion = setup.evaluate.last_confusion if of_final_model else None
            record.eval_seconds += time.perf_counter() - started

    def run(self, progress: StreamProgress | list[StreamProgress], checkpoint: Checkpoint | None = None) -> list[dict]:
        """Every remaining step; each seed's scores (gcl.training.evaluate.summarise). `progress`: each seed's
        progress lines (one, alone), reported at each task end, at the end and at least every minute."""
        lines = progress if isinstance(progress, list) else [progress]
        method, stream, amp, pool = self.method, self.stream, self.amp, self.pool
        orders = torch.stack([s.stream.order for s in self.setups]) if self.stacked else stream.order
        orders, bounds = orders.to(self.device), stream.bounds
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
            x_raw, y = pool.batch(orders[..., bounds[step]:bounds[step + 1]])
            begin_step(method.net, eager=step < EAGER_STEPS)
            with amp():
                loss = method.step(self.train_transform(x_raw), y, x_raw)
            self.loss_sum += loss
            self.window.append(loss)
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
            if step in eval_after:
                timer.stop()
                self.check_finite(step)
                for record, total in zip(self.records, self.loss_sum.reshape(-1).tolist()):
                    record.loss_curve.append(total / max(self.loss_steps, 1))
                self.loss_sum.zero_()
                self.loss_steps = 0
                self.window = []
                self.evaluate_now(of_final_model=step == stream.steps - 1 and not changes_at_finish(method))
                timer.start()
            self.step = step + 1
            if task_ended or self.step == stream.steps or lines[0].due():
                for line, record in zip(lines, self.records):
                    line.report(step, last_accuracy(record.rows, self.has_tasks))
            if checkpoint is not None and self.step < stream.steps and \
                    checkpoint.due(task_ended and self.checkpoint_at_task_ends):
                timer.stop()
                checkpoint.save(self.state(seconds=self.seconds + timer.total))
                timer.start()
        with amp():
            method.finish()
        timer.stop()
        self.check_finite(stream.steps - 1)
        if self.stacked:       # each seed's final state in its own method, which its result reads
            for s, setup in enumerate(self.setups):
                method.unstack(s, setup.method)
        if not self.records[0].rows:    # a stream without evaluation points (Schedule.evaluate_along) is scored once
            self.evaluate_now(of_final_model=True)
        seconds = (self.seconds + timer.total) / len(self.records)          # each seed's share of the group's time
        return [summarise(r.rows, r.loss_curve, self.has_tasks, stream.steps, stream.n_samples, seconds,
                          r.eval_seconds) for r in self.records]
