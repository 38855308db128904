"""The registry of benchmark kinds: each kind is a settings class registered under its `kind` name.

A kind's class declares the settings of a `benchmarks.<name>` block of that kind, and each field says which of
two groups it belongs to: `data_setting` (what the benchmark file is built from: a change rebuilds it, at
benchmark@) or `training_setting` (what only a run's training reads: a change re-runs the runs, never the
build). Registering derives a model of each group from the declarations (`Kind.Data`, `Kind.Training`): the
data group is what benchmark@ builds from and what benchmark.pt records; the training group, with `kind`, is a
resolved run's `benchmark`. A field with no group stops the import. The class's hooks turn the groups into
tensors: `build` (a prepared source -> a benchmark file's contents), `stream` (the batches a run sees) and
`transforms` (uint8 batches -> network inputs).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypedDict, get_args, get_origin

import torch
from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gcl.core.backbones import BACKBONES
from gcl.core.settings import Settings, derived_model
from gcl.data.stream import Stream

DATA, TRAINING = "data", "training"
GROUPS = (DATA, TRAINING)
Backbone = Literal[tuple(BACKBONES)]
Transform = Callable[[torch.Tensor], torch.Tensor]


def data_setting(default: Any = PydanticUndefined, **kwargs) -> Any:
    """A field that shapes the benchmark file (benchmark@ builds it from these): pydantic's Field, marked."""
    return Field(default, json_schema_extra={"group": DATA}, **kwargs)


def training_setting(default: Any = PydanticUndefined, **kwargs) -> Any:
    """A field that only a run's training reads (a change re-runs the runs, not benchmark@): Field, marked."""
    return Field(default, json_schema_extra={"group": TRAINING}, **kwargs)


def group_of(info: FieldInfo) -> str | None:
    """The group a field declares (data_setting / training_setting), or None."""
    extra = info.json_schema_extra
    return extra.get("group") if isinstance(extra, dict) else None


class BenchmarkData(TypedDict, total=False):
    """A built benchmark, as every kind's `build` returns it and benchmark.pt stores it (a typed dict of
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


class DataSettings(Settings):
    """A kind's data group (`Kind.Data`): what benchmark@ builds the file from, and the file records."""

    kind: str


class TrainingSettings(Settings):
    """A kind's training group (`Kind.Training`): what a run's training reads of its benchmark's block, with the
    run's own epochs and width applied (a resolved run's `benchmark`). Its fields are those of BenchmarkSettings
    marked training_setting, the kind's own, and `kind` last (declared by the derived model, in that order)."""

    if TYPE_CHECKING:      # what every kind's training group holds (BenchmarkSettings declares them)
        kind: str
        backbone: str
        epochs: int
        width: int | None
        input_size: int | None
        bf16: bool
        channels_last: bool
        stack: bool | Literal["auto"]
        compile: bool | Literal["auto"]


class BenchmarkSettings(Settings):
    """Settings every benchmark kind reads, each in its group (the module's docstring). Nothing else belongs in a
    benchmark's block, so that the block is exactly what a run's results depend on: how fast (`threads`, top
    level) and the report's words (`report.benchmarks`) live elsewhere."""

    has_tasks: ClassVar[bool]                    # tasks (Task-IL, boundaries) or one general-continual stream
    Data: ClassVar[type[DataSettings]]           # derived by register_kind
    Training: ClassVar[type[TrainingSettings]]

    kind: str = data_setting()
    source: str = data_setting(description="a key of sources: the raw data this benchmark is built from")
    backbone: Backbone = training_setting(description="the network: mlp (MNIST) or resnet18 (the image benchmarks)")
    epochs: int = training_setting(gt=0, description="passes over each task (1: a single pass over the stream)")
    validation_fraction: float = data_setting(0.0, ge=0, lt=1, description="share of each class's training images "
                                              "held out and evaluated instead of the test set (tuning only)")
    width: int | None = training_setting(
        None, gt=0, description="the backbone's width: the ResNet's first-stage channels (64) or the MLP's hidden "
        "units (100); none: the architecture's own. Narrower only for dry runs (gcl.dryrun): it changes every "
        "number")
    input_size: int | None = training_setting(
        None, gt=0, description="average-pool the network's input to this side (none: the images as they are). Only "
        "for dry runs (gcl.dryrun), to cut a step's cost on images of the real shape")
    bf16: bool = training_setting(False, description="bf16 autocast in training and evaluation (for GPUs; a CPU runs "
                                  "it too, slowly, as the dry run's --bf16 does)")
    channels_last: bool = training_setting(False, description="channels_last memory format for convolutions (CUDA "
                                           "option)")
    stack: bool | Literal["auto"] = training_setting(
        "auto", description="train a run's seeds as one stacked network (gcl.training.stacking), one step for all "
        "of them; auto: where the method's step stacks and stacking pays, the MLP (docs/performance.md); true: the "
        "ResNet-18 too. In float32 a stacked seed rounds differently from a lone one (equal in distribution); false: "
        "each seed alone")
    compile: bool | Literal["auto"] = training_setting(
        "auto", description="torch.compile the backbone's training passes (on a GPU with CUDA graphs) for the methods "
        "that allow it; auto: on a GPU with Triton only (the numbers move by rounding, so a CPU run stays eager)")

    # ------------------------------------------------------------------ the groups

    def data(self) -> DataSettings:
        """The data group: what benchmark@ builds the file from (resolved/data/benchmarks/<name>.json)."""
        return self.Data.model_validate(self.model_dump(include=set(self.Data.model_fields)))

    def training(self) -> TrainingSettings:
        """The training group, with `kind`: what a run trains with (a resolved run's `benchmark`)."""
        return self.Training.model_validate(self.model_dump(include=set(self.Training.model_fields)))

    # ------------------------------------------------------------------ the hooks a kind implements

    @staticmethod
    def build(source: dict, data: DataSettings) -> BenchmarkData:
        """The benchmark file's contents, from a prepared source (gcl.data.sources) and the data group."""
        raise NotImplementedError

    @staticmethod
    def stream(bench: BenchmarkData, training: TrainingSettings, epochs: int, batch: int,
               generator: torch.Generator) -> Stream:
        """The batches a run sees: `epochs` passes (the training loop's schedule: the setting, or 1 for an offline
        method) in batches of `batch`, drawn with `generator`."""
        raise NotImplementedError

    @staticmethod
    def batch_sizes(class_counts: list[int], data: DataSettings, epochs: int, batch: int) -> list[int]:
        """The size of every batch of the stream `stream` builds, in order, from the source's training images per
        class alone (no pixels, no generator: the sizes do not depend on the draw), by the same code. What the dry
        run keeps when it cuts a source's images (gcl.dryrun)."""
        raise NotImplementedError

    @staticmethod
    def transforms(bench: BenchmarkData, training: TrainingSettings) -> tuple[Transform, Transform]:
        """(train, test) maps from batched uint8 images on the device to the network's input."""
        raise NotImplementedError


KINDS: dict[str, type[BenchmarkSettings]] = {}


def _group_model(cls: type[BenchmarkSettings], group: str) -> type[Settings]:
    """The model of one group of `cls`'s fields, in declaration order; the training group ends with `kind`, as
    resolved runs have always stored it. Its `kind` defaults to the kind's name."""
    annotation = cls.model_fields["kind"].annotation
    name = get_args(annotation)[0]
    fields = {field: (info.annotation, info) for field, info in cls.model_fields.items()
              if group_of(info) == group and field != "kind"}
    kind = (annotation, Field(name))
    fields = {"kind": kind, **fields} if group == DATA else {**fields, "kind": kind}
    return derived_model(f"{cls.__name__}{group.title()}", cls.__module__,
                         DataSettings if group == DATA else TrainingSettings,
                         f"The {group} settings of a {name} benchmark.", **fields)


def register_kind(cls: type[BenchmarkSettings]) -> type[BenchmarkSettings]:
    """Register a kind under the one value its `kind` field accepts (`kind: Literal["<name>"] = data_setting()`),
    once every field declares its group."""
    annotation = cls.model_fields["kind"].annotation
    if get_origin(annotation) is not Literal or len(get_args(annotation)) != 1:
        raise TypeError(f"{cls.__name__}.kind must be Literal['<name of the kind>'], not {annotation}")
    ungrouped = [name for name, info in cls.model_fields.items() if group_of(info) not in GROUPS]
    if ungrouped:
        raise TypeError(f"{cls.__name__}: {ungrouped} declare no group: make each a data_setting (it shapes the "
                        "benchmark file) or a training_setting (only training reads it)")
    cls.Data, cls.Training = _group_model(cls, DATA), _group_model(cls, TRAINING)
    KINDS[get_args(annotation)[0]] = cls
    return cls
