"""An image dataset kept as class folders (torchvision ImageFolder's layout), as uint8 (N, C, H, W) tensors: the
source kind `image-folder`, for a copy of a dataset on a machine that cannot download it.

    sources:
      cifar10-jpeg: {kind: image-folder, path: /data/cifar10-jpeg.tar.gz, like: cifar10}

`path` is a folder, or a .tar / .tar.gz / .tgz / .zip of one, holding train/<class>/<image> and
test/<class>/<image> (JPEG, PNG or another format PIL reads; hidden files such as .DS_Store are skipped; symbolic
links followed, as ImageFolder follows them), possibly all under one top folder. It is read where it is
(gcl.data.image_files: nothing is extracted), once, by prepare@, into the tensors every source writes. Labels
follow the class folders sorted by name (as ImageFolder numbers them) unless `classes` gives the order, or `like`
names a published dataset whose classes they are (its label order, below); a class's
images are taken in their names' natural order (2.png before 10.png; 01.png before 1.png, by the names
themselves, so that every process reads them in one order); grey-scale, palette and RGBA images become RGB (alpha
dropped), 16-bit images 8-bit (the high byte), or every image grey-scale with `channels: 1`. The images must all
have one size, unless `image_size` resizes every other one (PIL's bilinear filter, antialiased when it shrinks;
stretched to a square); `resize: false` refuses them instead. The normalisation mean and std are computed from the
training images (per channel, in [0, 1] units, over every pixel) unless `mean` and `std` give them. `like` names
the published dataset the folder copies (e.g. cifar10): its class count (the classes a short copy lacks named),
class names in label order (CIFAR-10's airplane ... truck, sorted as the folders sort; Tiny ImageNet's WordNet ids
in the order of its wnids.txt, as the tinyimagenet source numbers them), images per class and image size are
checked before anything is decoded, the folders take the dataset's label order, so that the same images get the
same labels as from the dataset's own source, and the dry-run and timing tools stand in for the folder with random
images of that shape (gcl.data.random_sources.shape_name). DVC does not watch the folder: after changing its
contents, `dvc repro -f prepare@<source>`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from gcl.core.settings import Settings
from gcl.data.cifar_sources import CIFAR10_CLASSES, CIFAR100_CLASSES
from gcl.data.image_files import IMAGE_SUFFIXES, ImageFiles, hidden, is_image, natural, some
from gcl.data.random_sources import SOURCE_SHAPES
from gcl.data.source_registry import SourceError, register_source
from gcl.data.tinyimagenet_sources import TINY_WNIDS

FOLDER_KIND = "image-folder"
STATS_CHUNK = 1 << 23     # pixel values summed at a time for the mean and std (64 MB as int64)
DIGITS = tuple(str(d) for d in range(10))
# each published dataset's class names in the label order its own source gives them (sorted, as the folders sort,
# except Tiny ImageNet's, in its wnids.txt order): what `like` checks and numbers the folders by, so that a copy's
# labels (and so a benchmark's tasks) are the dataset's
LIKE_CLASSES = {"mnist": DIGITS, "mnist-bundled": DIGITS, "cifar10": CIFAR10_CLASSES, "cifar100": CIFAR100_CLASSES,
                "tinyimagenet": TINY_WNIDS}


class ImageFolderSettings(Settings):
    """An image folder's settings (`kind: image-folder`)."""

    path: str = Field(min_length=1, description="a folder, or a .tar/.tar.gz/.tgz/.zip of one, holding "
                      "train/<class>/ and test/<class>/ images (possibly under one top folder); relative paths "
                      "start at the project's folder")
    like: Literal[tuple(SOURCE_SHAPES)] | None = Field(None, description="the published dataset the folder "
                                                       "copies: its class names in label order, images per class and "
                                                       "image size are checked, and the dry-run and timing tools use it")
    classes: list[str] | None = Field(None, min_length=1, description="the class folders in label order (default: "
                                      "sorted by name)")
    image_size: int | None = Field(None, ge=1, le=4096, description="side of the square images it yields (default: "
                                   "the images' own size, which must be the same for all)")
    resize: bool = Field(True, description="with image_size: resize an image of another size (PIL bilinear, "
                         "antialiased when shrinking, stretched to a square); false: refuse it")
    channels: Literal[1, 3] = Field(3, description="3: RGB (grey-scale, palette and RGBA images converted, alpha "
                                    "dropped); 1: grey-scale")
    mean: list[float] | None = Field(None, description="normalisation mean per channel, in [0, 1] units (default: "
                                     "computed from the training images)")
    std: list[float] | None = Field(None, description="normalisation std per channel, in [0, 1] units (default: "
                                    "computed from the training images)")

    @model_validator(mode="after")
    def _consistent(self):
        if (self.mean is None) != (self.std is None):
            raise ValueError("give mean and std together, or neither (both are then computed from the training images)")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and len(values) != self.channels:
                raise ValueError(f"{name} needs {self.channels} values (one per channel), got {len(values)}")
        if self.mean is not None and not (all(0 <= m <= 1 for m in self.mean) and all(0 < s <= 1 for s in self.std)):
            raise ValueError("mean must be in [0, 1] and std in (0, 1] (pixels in [0, 1] units)")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError("classes repeats a class")
        if self.like is not None:
            channels, height, width = SOURCE_SHAPES[self.like].image
            if channels != self.channels:
                raise ValueError(f"{self.like} has {channels} channel(s): set channels: {channels}")
            if self.image_size is not None and (self.image_size, self.image_size) != (height, width):
                raise ValueError(f"image_size {self.image_size} is not {self.like}'s {height}x{width}")
        return self


def _fix(path: Path) -> str:
    return (f"Fix: point the source's `path` at a folder, or a .tar/.tar.gz/.tgz/.zip of one, holding "
            f"train/<class>/ and test/<class>/ images (now {path}).")


def _class_files(files: ImageFiles, split: str) -> dict[str, list[str]]:
    """Each class folder of `split` and its images (in natural order), refusing a missing split, a file that is
    not an image and an empty class folder."""
    where, pre = files.where, files.prefix
    if split not in files.dirs:
        tops = sorted({d.split("/")[0] + "/" for d in files.dirs if not hidden(d)}
                      | {n for n in files.names if "/" not in n and not hidden(n)})
        raise SourceError(f"{where} has no {pre}{split}/ folder (it holds {some(tops) or 'nothing'}): an image folder "
                          f"holds train/<class>/ and test/<class>/ images. {files.fix}")
    per_class = {d.split("/")[1]: [] for d in files.dirs if d.startswith(f"{split}/") and not hidden(d)}
    for name in files.names:
        parts = name.split("/")
        if parts[0] != split or hidden(name):
            continue
        if len(parts) == 2:
            if is_image(name):
                raise SourceError(f"{where}: {pre}{name} is in no class folder. Fix: move it into its class's folder "
                                  f"({pre}{split}/<class>/).")
            continue     # a README beside the class folders
        if not is_image(name):
            raise SourceError(f"{where}: {pre}{name} is not an image file (accepted: {', '.join(IMAGE_SUFFIXES)}). "
                              "Fix: remove it from the class folder, or convert it.")
        per_class[parts[1]].append(name)
    if not per_class:
        raise SourceError(f"{where}: {pre}{split}/ holds no class folders. {files.fix}")
    empty = sorted(f"{pre}{split}/{c}/" for c, names in per_class.items() if not names)
    if empty:
        raise SourceError(f"{where}: {some(empty)} holds no images. Fix: add its images, or remove the class's "
                          "folder from train/ and test/.")
    return {c: sorted(names, key=natural) for c, names in per_class.items()}


def _classes(files: ImageFiles, splits: dict, settings: ImageFolderSettings) -> list[str]:
    """The class names in label order: `classes`, or the published order of `like` where the folders are its
    classes, or the folders sorted; train/ and test/ must hold the same."""
    train, test = set(splits["train"]), set(splits["test"])
    if train != test:
        raise SourceError(f"{files.where}: the class folders of {files.prefix}train/ and {files.prefix}test/ differ "
                          f"(only in train/: {some(sorted(train - test)) or 'none'}; only in test/: "
                          f"{some(sorted(test - train)) or 'none'}). Fix: give both the same class folders.")
    if settings.classes is None:
        published = LIKE_CLASSES.get(settings.like, ())
        # `like`'s own order, not the folders sorted: Tiny ImageNet's source numbers its classes by wnids.txt
        return list(published) if train == set(published) else sorted(train)
    extra, left_out = sorted(set(settings.classes) - train), sorted(train - set(settings.classes))
    if extra or left_out:
        problems = ([f"names {some(extra)}, which {files.where} has no folder for"] if extra else []) + \
                   ([f"leaves out its class folders {some(left_out)}"] if left_out else [])
        raise SourceError(f"the source's `classes` {' and '.join(problems)}. Fix: list exactly the class folders of "
                          f"{files.prefix}train/ in `classes`, or remove it (they are then sorted by name).")
    return list(settings.classes)


def _check_like(files: ImageFiles, splits: dict, classes: list[str], like: str) -> None:
    """The folder's class count, class names in label order and images per class must be those of the published
    dataset `like`."""
    shape, problems = SOURCE_SHAPES[like], []
    if len(classes) != shape.classes:
        problems.append(f"{len(classes)} classes, not {shape.classes}{_missing_classes(classes, like)}")
    else:
        _check_like_names(files, classes, like)
        for split in ("train", "test"):
            for c, want in zip(classes, shape.counts(split)):
                if len(splits[split][c]) != want:
                    problems.append(f"{files.prefix}{split}/{c}/ holds {len(splits[split][c]):,} images, not {want:,}")
    if problems:
        raise SourceError(f"{files.where} is not shaped like {like} (the source's `like`): {some(problems, 3)}. Fix: "
                          f"point `path` at a complete copy of {like}, or remove `like` (the dry-run and timing tools "
                          "then know no shape for it).")


def _missing_classes(classes: list[str], like: str) -> str:
    """Where a folder holds fewer classes than `like`, all of them `like`'s (a copy cut short, whose labels would
    shift), the missing ones named, as a clause; otherwise nothing (which are missing cannot be known)."""
    published = LIKE_CLASSES[like]
    if len(classes) >= len(published) or not set(classes) <= set(published):
        return ""
    return f" ({some([c for c in published if c not in classes])} missing)"


def _check_like_names(files: ImageFiles, classes: list[str], like: str) -> None:
    """The class folders must be named as `like`'s classes and be in its label order: a copy whose folders are
    named otherwise (plane, car, ...) sorts into other labels, and so other tasks, than the dataset's."""
    published = list(LIKE_CLASSES[like])
    foreign = [c for c in classes if c not in published]
    if foreign:
        missing = [c for c in published if c not in classes]
        raise SourceError(f"{files.where}: the class folders {some(foreign)} of {files.prefix}train/ are not "
                          f"{like}'s classes (the source's `like`), which has {some(missing)} instead: the labels "
                          f"would not be {like}'s. Fix: rename the class folders (in train/ and test/) to {like}'s "
                          f"names ({some(published, 10)}), or remove `like` if the copy is not {like}.")
    if classes != published:
        k = next(k for k, (c, p) in enumerate(zip(classes, published)) if c != p)
        raise SourceError(f"the source's `classes` numbers {files.where}'s classes otherwise than {like} does "
                          f"(label {k} is {classes[k]}, where {like}'s is {published[k]}). Fix: remove `classes` "
                          f"(the folders then take {like}'s label order).")


def channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per channel, the mean and the (population) std of uint8 images x (N, C, H, W), in [0, 1] units: summed
    exactly in integers, chunk by chunk, so the same images give the same numbers on every machine."""
    n, channels = x.shape[0], x.shape[1]
    per_image = max(1, math.prod(x.shape[1:]))
    total, squares = [0] * channels, [0] * channels
    for start in range(0, n, max(1, STATS_CHUNK // per_image)):
        part = x[start:start + max(1, STATS_CHUNK // per_image)].to(torch.int64)
        for c in range(channels):
            total[c] += int(part[:, c].sum())
            squares[c] += int((part[:, c] * part[:, c]).sum())
    count = n * math.prod(x.shape[2:])
    mean = [t / count / 255 for t in total]
    std = [math.sqrt(max(s * count - t * t, 0)) / count / 255 for s, t in zip(squares, total)]
    return mean, std


@register_source(FOLDER_KIND, ImageFolderSettings)
def image_folder(settings: ImageFolderSettings, _download_dir: Path) -> dict:
    """Images in class folders (train/<class>/, test/<class>/): a folder, or a zip or tar of one."""
    path = Path(settings.path).expanduser()
    with ImageFiles(path, _fix(path), marker="train", dataset="image-folder",
                    image_fix="Fix: replace the file with an intact copy of the image, or remove it.") as files:
        splits = {split: _class_files(files, split) for split in ("train", "test")}
        classes = _classes(files, splits, settings)
        if settings.like is not None:
            _check_like(files, splits, classes, settings.like)
        mode = "RGB" if settings.channels == 3 else "L"
        side = settings.image_size
        resize = (side, side) if side is not None and settings.resize else None
        if side is None and settings.like is not None:
            side = SOURCE_SHAPES[settings.like].image[1]
        shape = (settings.channels, side, side) if side is not None else None
        out = {}
        for split in ("train", "test"):
            names = [n for c in classes for n in splits[split][c]]
            labels = [k for k, c in enumerate(classes) for _ in splits[split][c]]
            x = files.decode(names, _mismatch(files, settings), mode, resize, shape, f"{split} images")
            shape = tuple(x.shape[1:])     # test images must have the training images' size
            out[f"{split}_x"], out[f"{split}_y"] = x, torch.tensor(labels, dtype=torch.int64)
    mean, std = (settings.mean, settings.std) if settings.mean is not None else channel_stats(out["train_x"])
    return {**out, "classes": classes, "mean": list(mean), "std": list(std)}


def _mismatch(files: ImageFiles, settings: ImageFolderSettings):
    """The error for an image whose (C, H, W) is not the one every image must have (sizes as width x height)."""
    def message(name: str, got: tuple, want: tuple) -> str:
        size = f"{want[2]}x{want[1]}"
        if settings.image_size is not None:     # and resize is false
            why, fix = f"the {size} that image_size sets (resize is false)", "set resize: true to resize it, or replace it"
        elif settings.like is not None:
            why, fix = f"{settings.like}'s {size} (the source's `like`)", f"set image_size: {want[1]} to resize it"
        else:
            why, fix = (f"the {size} of the first training image", "set image_size to resize every image to one "
                        "size, or replace it")
        return (f"{files.where}: {files.prefix}{name} is {got[2]}x{got[1]} pixels (width x height), not {why}. "
                f"Fix: {fix}.")
    return message
