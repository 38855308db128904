"""MNIST-360 (Buzzega et al. 2020): digits 0-8 turning through 360 degrees, in pairs, with no task boundaries.

Stream (docs/protocol.md):
- class j's training images are split into 6 contiguous chunks of n_j // 6 + 1 images (the last one
  shorter), used last chunk first, as the reference framework (mammoth) does: this reproduces its
  step counts (3,573 / 910 / 459 / 243 steps at batch 1 / 4 / 8 / 16 on 400 images per digit);
- 27 segments: the pairs (0,1), (1,2), ..., (7,8), (8,0), three rounds; each segment uses the next
  unused chunk of both of its classes;
- a batch mixes the two classes in proportion to what is left of each chunk; the segment ends
  when either chunk runs out, and what is left of the other is discarded;
- class j's k-th drawn training image is rotated by (k * 360 / n_j + (j - 1) * 60) mod 360 degrees;
- the test sweep rotates class j's i-th test image by i * 360 / n_test_j.

Each image of a chunk is drawn once, in a seeded random order ("without-replacement", the default);
"with-replacement" reproduces mammoth's loader, which draws a random image of the chunk every time.

The kind `mnist-360` (class Mnist360, at the end) declares the settings of such a benchmark.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from gcl.data.benchmark_registry import BenchmarkData, BenchmarkSettings, data_setting, register_kind, training_setting
from gcl.data.split import kept_count, split_per_class
from gcl.data.stream import Stream
from gcl.data.transforms import rotate, to_unit_float

N_CLASSES = 9
N_ROUNDS = 3
CHUNKS_PER_CLASS = 2 * N_ROUNDS
DRAW_MODES = ("without-replacement", "with-replacement")


def segment_pairs(n_classes: int = N_CLASSES, n_rounds: int = N_ROUNDS) -> list[tuple[int, int]]:
    return [(s, (s + 1) % n_classes) for _ in range(n_rounds) for s in range(n_classes)]


def chunk_bounds(n: int, n_chunks: int = CHUNKS_PER_CLASS) -> list[tuple[int, int]]:
    """[start, end) of each chunk, in the order the stream uses them (the last chunk first)."""
    per_chunk = n // n_chunks + 1
    bounds = [(k * per_chunk, min((k + 1) * per_chunk, n)) for k in range(n_chunks)]
    if any(end <= start for start, end in bounds):
        raise ValueError(f"{n} images per class are too few for {n_chunks} chunks")
    return bounds[::-1]


def segment_batches(len_a: int, len_b: int, batch_size: int) -> list[tuple[int, int]]:
    """(from a, from b) per batch: proportional to what is left, until either chunk is exhausted.

    Python's round() (half to even) as in mammoth, so step counts match the reference framework.
    """
    rem_a, rem_b, batches = len_a, len_b, []
    while rem_a > 0 and rem_b > 0:
        take_a = min(int(round(rem_a / (rem_a + rem_b) * batch_size)), rem_a)
        take_b = min(batch_size - take_a, rem_b)
        batches.append((take_a, take_b))
        rem_a -= take_a
        rem_b -= take_b
    return batches


def segment_plan(sizes: list[int], batch_size: int):
    """The stream's 27 segments, in order, from each class's training images: per segment its two classes, the
    [start, end) of the chunk each uses, and its batches (from a, from b). The one statement of the stream's
    structure, which build_stream fills with images and batch_sizes counts."""
    chunks = [chunk_bounds(n) for n in sizes]
    chunk_used = [0] * N_CLASSES
    for a, b in segment_pairs():
        bounds = {}
        for j in (a, b):
            bounds[j] = chunks[j][chunk_used[j]]
            chunk_used[j] += 1
        (start_a, end_a), (start_b, end_b) = bounds[a], bounds[b]
        yield a, b, bounds, segment_batches(end_a - start_a, end_b - start_b, batch_size)


def batch_sizes(class_counts: list[int], validation_fraction: float, batch_size: int) -> list[int]:
    """The size of every batch of the stream, from the source's training images per digit (each less its
    validation part, as build_benchmark keeps them)."""
    sizes = [kept_count(n, validation_fraction) for n in class_counts[:N_CLASSES]]
    return [take_a + take_b for _, _, _, batches in segment_plan(sizes, batch_size) for take_a, take_b in batches]


def train_angle(k: np.ndarray, n_j: int, j: int) -> np.ndarray:
    return np.mod(k * 360.0 / n_j + (j - 1) * 60.0, 360.0)


def test_angle(i: np.ndarray, n_test_j: int) -> np.ndarray:
    return np.mod(i * 360.0 / n_test_j, 360.0)


def build_benchmark(source: dict, data: Mnist360.Data) -> BenchmarkData:
    """Group the source's digits 0-8 by class and pre-rotate the evaluation sweep.

    With `validation_fraction` > 0 the last part of each class's training images becomes the evaluation set
    (rotated as the test sweep) and the real test set is left out altogether.
    """
    validation_fraction = data.validation_fraction
    train_x, train_y = source["train_x"], source["train_y"]
    per_class_train, eval_x, eval_y = [], [], []
    for j, (kept, held_idx) in enumerate(split_per_class(train_y, N_CLASSES, validation_fraction)):
        imgs = train_x[kept]
        if validation_fraction > 0:
            held = train_x[held_idx]
        else:
            held = source["test_x"][source["test_y"] == j]
        per_class_train.append(imgs)
        angles = torch.from_numpy(test_angle(np.arange(len(held)), len(held)))
        eval_x.append(rotate(held, angles))
        eval_y.append(torch.full((len(held),), j, dtype=torch.int64))
    sizes = [len(x) for x in per_class_train]
    return {
        "kind": "mnist-360",
        "n_classes": N_CLASSES,
        "input_shape": list(train_x.shape[1:]),
        "train_x": torch.cat(per_class_train),
        "train_y": torch.cat([torch.full((n,), j, dtype=torch.int64) for j, n in enumerate(sizes)]),
        "class_sizes": sizes,
        "test_x": torch.cat(eval_x),
        "test_y": torch.cat(eval_y),
        # one evaluation group per digit: the accuracy matrix tracks each digit over the stream
        "test_group": torch.cat(eval_y),
        "group_names": [str(j) for j in range(N_CLASSES)],
        "n_tasks": 0,
        "evaluated_on": "validation" if validation_fraction > 0 else "test",
    }


def build_stream(bench: BenchmarkData, batch_size: int, generator: torch.Generator, draw: str) -> Stream:
    """Precompute the whole stream (order, angles, batches) and rotate every drawn image in one call."""
    if draw not in DRAW_MODES:
        raise ValueError(f"mnist-360 draw mode {draw!r} is not one of {DRAW_MODES}")
    sizes = bench["class_sizes"]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    drawn = [0] * N_CLASSES          # k: how many images of class j were drawn so far
    pool_idx, angles, bounds, eval_after = [], [], [0], []
    for a, b, chunk, batches in segment_plan(sizes, batch_size):
        picks = {}
        for j in (a, b):
            start, end = chunk[j]
            n = end - start
            if draw == "without-replacement":
                local = torch.randperm(n, generator=generator).numpy()
            else:
                local = torch.randint(0, n, (n,), generator=generator).numpy()
            picks[j] = offsets[j] + start + local
        used = {a: 0, b: 0}
        for take_a, take_b in batches:
            for j, take in ((a, take_a), (b, take_b)):
                pool_idx.append(picks[j][used[j]: used[j] + take])
                angles.append(train_angle(np.arange(drawn[j], drawn[j] + take), sizes[j], j))
                used[j] += take
                drawn[j] += take
            bounds.append(bounds[-1] + take_a + take_b)
        eval_after.append(len(bounds) - 2)
    pool_idx_t = torch.from_numpy(np.concatenate(pool_idx).astype(np.int64))
    images = rotate(bench["train_x"][pool_idx_t], torch.from_numpy(np.concatenate(angles)))
    return Stream(images=images, labels=bench["train_y"][pool_idx_t],
                  order=torch.arange(len(pool_idx_t)), bounds=bounds,
                  eval_after=eval_after, task_ends=[], origin=pool_idx_t)


@register_kind
class Mnist360(BenchmarkSettings):
    """MNIST-360: digits 0-8 turning through 360 degrees in pairs, a single stream without tasks."""

    has_tasks = False
    kind: Literal["mnist-360"] = data_setting()
    draw: Literal[DRAW_MODES] = training_setting(
        "without-replacement", description="each chunk image drawn once, or with replacement as the reference loader")

    @staticmethod
    def build(source: dict, data: Mnist360.Data) -> BenchmarkData:
        return build_benchmark(source, data)

    @staticmethod
    def stream(bench: BenchmarkData, training: Mnist360.Training, epochs: int, batch: int,
               generator: torch.Generator) -> Stream:
        return build_stream(bench, batch, generator, training.draw)    # one pass: the stream is its 27 segments

    @staticmethod
    def batch_sizes(class_counts: list[int], data: Mnist360.Data, epochs: int, batch: int) -> list[int]:
        return batch_sizes(class_counts, data.validation_fraction, batch)

    @staticmethod
    def transforms(bench: BenchmarkData, training: Mnist360.Training):
        return to_unit_float, to_unit_float       # no augmentation, no normalisation
