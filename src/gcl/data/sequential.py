"""Sequential class-incremental benchmarks (seq-mnist, seq-cifar10/100, seq-tinyimg), as docs/protocol.md describes.

Task t holds the labels [t * c, (t + 1) * c) in the source's natural label order. The stream shows
task after task; within a task, `epochs` passes, each over a fresh seeded permutation of the task's
training images, in batches of the run's batch size (the last batch of a pass is smaller when the
batch does not divide the task, as mammoth's loader does). The evaluator scores every task's test
set after the last step of each task, and reads each test sample's task from `test_group`.

Settings under `benchmarks.<name>` (the kind `sequential`, class Sequential at the end): n_tasks,
classes_per_task (required), validation_fraction (the last part of each class's training images, in source
order, becomes the evaluation set and the real test set is left out), augment (random crop with padding 4 +
flip, default true), normalize (false: pixels stay in [0, 1] even when the source has a mean/std; default true)
and class_order (the name of an order in class_orders.py: tasks take consecutive groups of that order, and
labels are renumbered so that task t still holds [t * c, (t + 1) * c), the class names following their classes).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from gcl.core.errors import UserError
from gcl.data.augment import Normalize, TrainAugment
from gcl.data.benchmark_registry import BenchmarkData, BenchmarkSettings, data_setting, register_kind, training_setting
from gcl.data.class_orders import CLASS_ORDERS
from gcl.data.split import kept_count, split_per_class
from gcl.data.stream import Stream

CROP_PADDING = 4


class SequentialConfigError(UserError, ValueError):
    """A sequential benchmark's settings do not fit its source."""


def build_benchmark(source: dict, data: Sequential.Data) -> BenchmarkData:
    """Keep the first n_tasks * classes_per_task classes, group the training images by class, and tag
    every evaluation image with its task."""
    n_tasks, per_task = data.n_tasks, data.classes_per_task
    n_classes = n_tasks * per_task
    names = list(source.get("classes") or range(int(source["train_y"].max()) + 1))
    if n_classes > len(names):
        raise SequentialConfigError(f"{n_tasks} tasks x {per_task} classes need {n_classes} classes; the source "
                                    f"{data.source!r} has {len(names)}")
    fraction = data.validation_fraction
    train_x, train_y, test_y = source["train_x"], source["train_y"], source["test_y"]
    class_order = _class_order(data.class_order, len(names))
    if class_order is not None:   # renumber: source class class_order[j] becomes label j; names follow their classes
        rank = torch.empty(len(class_order), dtype=torch.long)
        rank[torch.tensor(class_order)] = torch.arange(len(class_order))
        train_y, test_y, names = rank[train_y], rank[test_y], [names[c] for c in class_order]
    train_idx, eval_idx = [], []
    for j, (kept, held) in enumerate(split_per_class(train_y, n_classes, fraction)):
        train_idx.append(kept)
        eval_idx.append(held)
        if len(kept) == 0:
            raise SequentialConfigError(f"class {j} ({names[j]}) has no training images left "
                                        f"(validation_fraction {fraction})")
    if fraction > 0:
        held = torch.cat(eval_idx)
        eval_x, eval_y = train_x.index_select(0, held), train_y.index_select(0, held)
    else:
        keep = test_y < n_classes
        eval_x, eval_y = source["test_x"][keep], test_y[keep]
    missing = sorted(set(range(n_classes)) - set(eval_y.unique().tolist()))
    if missing:
        raise SequentialConfigError(f"classes {missing} have no evaluation images")
    order = torch.cat(train_idx)
    labels = train_y[order]
    mean, std = (source.get("mean"), source.get("std")) if data.normalize else (None, None)
    return {
        "kind": "sequential",
        "n_classes": n_classes,
        "n_tasks": n_tasks,
        "classes_per_task": per_task,
        "input_shape": list(train_x.shape[1:]),
        "train_x": train_x.index_select(0, order),
        "train_y": labels,
        "train_task": labels // per_task,
        "class_sizes": [len(i) for i in train_idx],
        "test_x": eval_x.contiguous(),
        "test_y": eval_y,
        "test_group": eval_y // per_task,
        "group_names": [", ".join(str(names[k]) for k in range(t * per_task, (t + 1) * per_task))
                        for t in range(n_tasks)],
        "evaluated_on": "validation" if fraction > 0 else "test",
        "class_order": list(class_order[:n_classes]) if class_order is not None else None,   # source class of each label
        # how the network sees the pixels: the source's statistics if it has them (and normalize is on), else [0, 1]
        "mean": list(mean) if mean is not None else None,
        "std": list(std) if std is not None else None,
        "crop_padding": CROP_PADDING,
    }


def _class_order(name, n_source_classes: int) -> tuple[int, ...] | None:
    """The named order, which must be a permutation of the source's classes; None keeps the source's order."""
    if name is None:
        return None
    if name not in CLASS_ORDERS:
        raise SequentialConfigError(f"class_order {name!r} is not a known class order; known: {sorted(CLASS_ORDERS)}")
    order = CLASS_ORDERS[name]
    if sorted(order) != list(range(n_source_classes)):
        raise SequentialConfigError(f"class_order {name!r} orders {len(order)} classes, not the source's "
                                    f"{n_source_classes} classes 0..{n_source_classes - 1}")
    return order


def build_stream(bench: BenchmarkData, epochs: int, batch_size: int, generator: torch.Generator) -> Stream:
    """Task by task, `epochs` seeded permutations of the task's images, cut into batches."""
    if batch_size <= 0 or epochs <= 0:
        raise SequentialConfigError(f"batch ({batch_size}) and epochs ({epochs}) must be positive")
    task_of = bench["train_task"].numpy()
    order, bounds, task_ends = [], [0], []
    for t in range(bench["n_tasks"]):
        idx = torch.from_numpy(np.flatnonzero(task_of == t))
        n = len(idx)
        cuts = pass_cuts(n, batch_size)
        for _ in range(epochs):
            order.append(idx.index_select(0, torch.randperm(n, generator=generator)))
            base = bounds[-1]
            bounds += [base + c for c in cuts]
        task_ends.append(len(bounds) - 2)
    # the pool is the benchmark's training set itself, so each pool image is its own origin
    return Stream(images=bench["train_x"], labels=bench["train_y"], order=torch.cat(order),
                  bounds=bounds, eval_after=list(task_ends), task_ends=task_ends,
                  origin=torch.arange(len(bench["train_x"])), pool_task=bench["train_task"],
                  task_classes=[(t * bench["classes_per_task"], (t + 1) * bench["classes_per_task"])
                                for t in range(bench["n_tasks"])])


def pass_cuts(n: int, batch_size: int) -> list[int]:
    """Where one pass over `n` images ends each batch: every `batch_size`, the last batch shorter when it does not
    divide `n`."""
    return list(range(batch_size, n, batch_size)) + [n]


def task_sizes(class_counts: list[int], data: Sequential.Data) -> list[int]:
    """Each task's training images, from the source's training images per class: the class order's classes, each
    less its validation part, as build_benchmark keeps them."""
    n_classes = data.n_tasks * data.classes_per_task
    order = _class_order(data.class_order, len(class_counts)) or range(len(class_counts))
    kept = [kept_count(class_counts[c], data.validation_fraction) for c in list(order)[:n_classes]]
    return [sum(kept[t * data.classes_per_task:(t + 1) * data.classes_per_task]) for t in range(data.n_tasks)]


def batch_sizes(class_counts: list[int], data: Sequential.Data, epochs: int, batch_size: int) -> list[int]:
    sizes = []
    for n in task_sizes(class_counts, data):
        cuts = [0, *pass_cuts(n, batch_size)]
        sizes += [b - a for a, b in zip(cuts, cuts[1:])] * epochs
    return sizes


def transforms(bench: BenchmarkData, augment: bool):
    """(train, test) maps from uint8 batches to network inputs; train augments (random crop and flip) if `augment`."""
    normalize = Normalize(bench["mean"], bench["std"])
    train = TrainAugment(normalize, bench["crop_padding"]) if augment else normalize
    return train, normalize


@register_kind
class Sequential(BenchmarkSettings):
    """Class-incremental tasks of consecutive labels (seq-mnist, seq-cifar10/100, seq-tinyimg)."""

    has_tasks = True
    kind: Literal["sequential"] = data_setting()
    n_tasks: int = data_setting(gt=0, description="tasks, shown one after the other")
    classes_per_task: int = data_setting(gt=0, description="classes of each task, in the source's label order")
    augment: bool = training_setting(True, description="random crop (padding 4) and horizontal flip of training images")
    normalize: bool = data_setting(True, description="normalise by the source's mean/std (false: pixels stay in [0, 1])")
    class_order: Literal[tuple(CLASS_ORDERS)] | None = data_setting(
        None, description="a named class order (tasks take consecutive groups of it); none: label order")

    @staticmethod
    def build(source: dict, data: Sequential.Data) -> BenchmarkData:
        return build_benchmark(source, data)

    @staticmethod
    def stream(bench: BenchmarkData, training: Sequential.Training, epochs: int, batch: int,
               generator: torch.Generator) -> Stream:
        return build_stream(bench, epochs, batch, generator)

    @staticmethod
    def batch_sizes(class_counts: list[int], data: Sequential.Data, epochs: int, batch: int) -> list[int]:
        return batch_sizes(class_counts, data, epochs, batch)

    @staticmethod
    def transforms(bench: BenchmarkData, training: Sequential.Training):
        return transforms(bench, training.augment)
