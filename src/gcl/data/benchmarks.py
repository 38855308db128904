"""Benchmark builders by kind: from a prepared source to tensors on disk, and from those to a stream."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

import torch
from pydantic import Field

from gcl.core.atomic import save_tensors
from gcl.data import mnist360, sequential
from gcl.data.class_orders import CLASS_ORDERS
from gcl.data.stream import Stream
from gcl.data.transforms import to_unit_float
from gcl.core.errors import UserError
from gcl.core.settings import Settings
from gcl.core.backbones import BACKBONES

Backbone = Literal[tuple(BACKBONES)]


class BenchmarkData(TypedDict, total=False):
    """A built benchmark, as every kind's builder returns it and benchmark.pt stores it (a typed dict of
    tensors and plain values, so that torch.load(weights_only=True) reads it back)."""

    kind: str                       # "mnist-360" | "sequential"
    config: dict                    # the data settings it was built from (checked on loading)
    n_classes: int                  # outputs of the network
    n_tasks: int                    # 0: no tasks (general continual)
    classes_per_task: int           # sequential kinds: task t holds labels [t * c, (t + 1) * c)
    input_shape: list[int]          # (C, H, W)
    train_x: torch.Tensor           # uint8 (N, C, H, W), grouped by class
    train_y: torch.Tensor           # int64 (N,)
    train_task: torch.Tensor        # int64 (N,), sequential kinds
    class_sizes: list[int]          # training images per class
    test_x: torch.Tensor            # uint8 evaluation images (MNIST-360: rotated as the test sweep)
    test_y: torch.Tensor
    test_group: torch.Tensor        # each evaluation image's group: its task, or its digit on MNIST-360
    group_names: list[str]
    evaluated_on: str               # "test" | "validation"
    mean: list[float] | None        # normalisation of the network's input (None: pixels in [0, 1])
    std: list[float] | None
    crop_padding: int
    class_order: list[int] | None   # the source class of each label, when a class order renumbers them


class BenchmarkError(UserError, RuntimeError):
    """A benchmark file is missing or does not match its configuration."""


class BenchmarkSettings(Settings):
    """Settings every benchmark kind reads. Each field belongs to one of two groups (see `groups`): data
    (what benchmark@ builds from) and training (what changes a run's numbers). Nothing else belongs here,
    so that the block is exactly what a run's results depend on: how fast (`threads`, top level) and the
    report's words (`report.benchmarks`) live elsewhere."""

    kind: str
    source: str = Field(description="a key of sources: the raw data this benchmark is built from")
    backbone: Backbone = Field(description="the network: mlp (MNIST) or resnet18 (the image benchmarks)")
    epochs: int = Field(gt=0, description="passes over each task (1: a single pass over the stream)")
    validation_fraction: float = Field(0.0, ge=0, lt=1, description="share of each class's training images "
                                       "held out and evaluated instead of the test set (tuning only)")
    width: int | None = Field(None, gt=0, description="the backbone's width: the ResNet's first-stage channels (64) or "
                              "the MLP's hidden units (100); none: the architecture's own. Narrower only for dry runs "
                              "(tools/dryrun.py): it changes every number")
    input_size: int | None = Field(None, gt=0, description="average-pool the network's input to this side (none: the "
                                   "images as they are). Only for dry runs (tools/dryrun.py), to cut a step's cost on "
                                   "images of the real shape")
    bf16: bool = Field(False, description="bf16 autocast in training and evaluation (for GPUs; a CPU runs it too, "
                       "slowly, as the dry run's --bf16 does)")
    channels_last: bool = Field(False, description="channels_last memory format for convolutions (CUDA option)")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the backbone's training passes (on a GPU with CUDA graphs) for the methods "
        "that allow it; auto: on a GPU with Triton only (the numbers move by rounding, so a CPU run stays eager)")


class Mnist360Settings(BenchmarkSettings):
    """MNIST-360: digits 0-8 turning through 360 degrees in pairs, a single stream without tasks."""

    kind: Literal["mnist-360"]
    draw: Literal[mnist360.DRAW_MODES] = Field(
        "without-replacement", description="each chunk image drawn once, or with replacement as the reference loader")


class SequentialSettings(BenchmarkSettings):
    """Class-incremental tasks of consecutive labels (seq-mnist, seq-cifar10/100, seq-tinyimg)."""

    kind: Literal["sequential"]
    n_tasks: int = Field(gt=0, description="tasks, shown one after the other")
    classes_per_task: int = Field(gt=0, description="classes of each task, in the source's label order")
    augment: bool = Field(True, description="random crop (padding 4) and horizontal flip of training images")
    normalize: bool = Field(True, description="normalise by the source's mean/std (false: pixels stay in [0, 1])")
    class_order: Literal[tuple(CLASS_ORDERS)] | None = Field(
        None, description="a named class order (tasks take consecutive groups of it); none: label order")


DATA_FIELDS = {"kind", "source", "validation_fraction", "n_tasks", "classes_per_task", "normalize", "class_order"}
MOVED_FIELDS = {"label": "report.benchmarks.{name}.label", "threads": "the top-level `threads`"}


def groups(settings: BenchmarkSettings) -> dict[str, dict]:
    """The settings split by what they change: `data` (the benchmark file) and `training` (a run's numbers)."""
    values = settings.model_dump()
    out = {"data": {}, "training": {}}
    for key, value in values.items():
        out["data" if key in DATA_FIELDS else "training"][key] = value
    out["training"]["kind"] = values["kind"]
    return out


@dataclass(frozen=True)
class BenchmarkKind:
    Settings: type[BenchmarkSettings]
    build: Callable[[dict, dict], BenchmarkData]              # (source tensors, data settings) -> benchmark
    stream: Callable[[BenchmarkData, dict, int, torch.Generator], Stream]   # (bench, training settings, batch, gen)
    # (bench, training settings) -> (train transform, test transform), batched uint8 -> network input on the device
    transforms: Callable[[dict, dict], tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]]
    has_tasks: bool


KINDS: dict[str, BenchmarkKind] = {
    "mnist-360": BenchmarkKind(
        Settings=Mnist360Settings,
        build=mnist360.build_benchmark,
        stream=lambda bench, cfg, batch, gen: mnist360.build_stream(bench, batch, gen, cfg.get("draw", "without-replacement")),
        transforms=lambda bench, cfg: (to_unit_float, to_unit_float),
        has_tasks=False,
    ),
    "sequential": BenchmarkKind(
        Settings=SequentialSettings,
        build=sequential.build_benchmark,
        stream=sequential.build_stream,
        transforms=sequential.transforms,
        has_tasks=True,
    ),
}


def kind_of(cfg: dict) -> BenchmarkKind:
    return KINDS[cfg["kind"]]


def build_benchmark(cfg: dict, source: dict, out_dir: str | Path) -> Path:
    bench = kind_of(cfg).build(source, cfg)
    bench["config"] = dict(cfg)
    out = Path(out_dir) / "benchmark.pt"
    save_tensors(out, bench)
    return out


def load_benchmark(path: str | Path, cfg: dict) -> BenchmarkData:
    path = Path(path)
    if not path.exists():
        raise BenchmarkError(f"{path} does not exist: run `dvc repro` (the benchmark stage builds it)")
    try:
        bench = torch.load(path, weights_only=True)
    except Exception as exc:
        raise BenchmarkError(f"{path} is corrupt ({exc}); delete it and run `dvc repro` again") from exc
    if bench.get("config") != dict(cfg):
        raise BenchmarkError(f"{path} was built with {bench.get('config')}, but params.yaml now says {cfg}: "
                             "run `dvc repro` to rebuild it")
    return bench
