"""The stream loop: one run of one method on one benchmark with one seed."""
from __future__ import annotations

import contextlib
import dataclasses
import random
import time

import numpy as np
import torch

from gcl.backbones import build_backbone
from gcl.data.benchmarks import kind_of
from gcl.evaluate import Evaluator, summarise
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import TaskData


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or parameters, or a network that predicts one class for everything."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("params.yaml asks for device: cuda, but no CUDA device is visible; use device: auto or cpu")
    return torch.device(name)


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


def run_seed(bench: dict, bench_cfg: dict, run_cfg: dict, seed: int, device: torch.device,
             feature_samples: int = 0) -> dict:
    """Train `run_cfg`'s method over the benchmark stream and return this seed's metrics.

    With `feature_samples` > 0 the result also holds "features": the final network's penultimate
    features of that many evaluation images (for t-SNE), which the caller stores apart from the JSON.
    """
    kind = kind_of(bench_cfg)
    train_transform, test_transform = kind.transforms(bench, bench_cfg)
    generator = seed_everything(seed)
    method_cls = METHODS[run_cfg["algorithm"]]
    stream = (offline_stream(kind, bench, bench_cfg, run_cfg["batch"], generator) if method_cls.offline
              else kind.stream(bench, bench_cfg, run_cfg["batch"], generator))
    net = build_backbone(bench_cfg["backbone"], bench["input_shape"], bench["n_classes"],
                         channels_last=bench_cfg.get("channels_last", False)).to(device)
    ctx = MethodContext(device=device, n_classes=bench["n_classes"], train_transform=train_transform,
                        generator=generator, epochs=bench_cfg["epochs"], plain_transform=test_transform)
    method = method_cls(net, run_cfg, ctx)
    evaluate = Evaluator(bench, test_transform, device)
    # bf16 autocast (a CUDA option) is entered afresh for every step and evaluation: autocast caches its bf16
    # copies of the weights until its context exits, so one context around the whole loop would keep training
    # on the weights as they were before the first in-place SGD update (the network would never learn)
    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bench_cfg.get("bf16", False))

    result = _stream_loop(method, stream, train_transform, evaluate, kind.has_tasks, device, amp)
    with amp():
        net.eval()
        result["confusion"] = evaluate.confusion(method.predict, bench["n_classes"])
        if evaluate.features_collapsed(net.features):
            raise DivergenceError("the trained network gives every evaluation image the same features (a collapsed "
                                  "network, e.g. all-zero after dead ReLUs), so it predicts one class for everything: "
                                  "the learning rate or a loss weight is probably too high")
        result["method_metrics"] = method.extra_metrics()
        if feature_samples:
            result["features"] = evaluate.features(net.features, feature_samples)
    return result


def offline_stream(kind, bench: dict, bench_cfg: dict, batch: int, generator: torch.Generator):
    """What an offline method (JOINT) is shown: every training image once, with no evaluation along the way;
    it makes its own `epochs` passes once the stream is over and is evaluated only then."""
    return dataclasses.replace(kind.stream(bench, {**bench_cfg, "epochs": 1}, batch, generator), eval_after=[])


def _stream_loop(method, stream, train_transform, evaluate: Evaluator, has_tasks: bool,
                 device: torch.device, amp=contextlib.nullcontext) -> dict:
    """Feed the stream batch by batch, evaluating at segment/task ends; boundaries reach only methods
    that declare they need them, and only on benchmarks that have tasks."""
    net = method.net
    tell_boundaries = method.needs_boundaries and has_tasks
    pool, labels = stream.images.to(device), stream.labels.to(device)
    order, bounds = stream.order.to(device), stream.bounds
    eval_after, task_ends = set(stream.eval_after), stream.task_ends
    rows, loss_curve = [], []
    loss_sum, loss_steps = torch.zeros((), device=device), 0
    # the first step whose loss was not finite (-1: none), kept on the device and read at evaluations only
    first_bad = torch.full((), -1, dtype=torch.long, device=device)
    task = 0
    timer = Timer(device)

    def task_data(t: int) -> TaskData:
        idx = stream.task_pool(t).to(device)
        return TaskData(index=t, x_raw=pool[idx], y=labels[idx], classes=stream.task_classes[t])

    def check_finite(step: int):
        bad = int(first_bad)
        if bad >= 0:
            raise DivergenceError(f"the loss became non-finite (NaN or inf) at step {bad} of {stream.steps}: the "
                                  "learning rate or a loss weight is probably too high")
        if not all(bool(torch.isfinite(p).all()) for p in method.params):
            raise DivergenceError(f"the network's parameters are no longer finite after step {step} of {stream.steps}: "
                                  "the learning rate or a loss weight is probably too high")

    def evaluate_now():
        net.eval()
        with amp():
            rows.append(evaluate(method.predict))
        net.train()

    net.train()
    timer.start()
    if tell_boundaries:
        current = task_data(0)
        with amp():
            method.begin_task(current)
    for step in range(stream.steps):
        idx = order[bounds[step]:bounds[step + 1]]
        x_raw, y = pool[idx], labels[idx]
        with amp():
            loss = method.observe(train_transform(x_raw), y, x_raw)
        loss_sum += loss
        first_bad.masked_fill_((first_bad < 0) & ~torch.isfinite(loss), step)
        loss_steps += 1
        if tell_boundaries and step == task_ends[task]:
            with amp():
                method.end_task(current)
            task += 1
            if task < len(task_ends):
                current = task_data(task)
                with amp():
                    method.begin_task(current)
        if step in eval_after:
            timer.stop()
            check_finite(step)
            loss_curve.append(float(loss_sum) / max(loss_steps, 1))
            loss_sum.zero_()
            loss_steps = 0
            evaluate_now()
            timer.start()
    with amp():
        method.finish()
    timer.stop()
    check_finite(stream.steps - 1)
    if not rows:          # an offline method (JOINT) is evaluated once, after its own training
        evaluate_now()
    return summarise(rows, loss_curve, has_tasks, stream.steps, stream.n_samples, timer.total)
