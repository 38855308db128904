"""Tiny ImageNet as uint8 (N, 3, 64, 64) tensors, from the Stanford zip or an extracted copy of it.

The zip is checked against its published MD5 before it is read (gcl.data.image_sources.locate_archive). An
extracted folder has no checksum: there, as in the zip, the image counts must be what wnids.txt, the boxes files
and val_annotations.txt promise (a partial copy is refused, naming the missing files). The canonical set must also
hold its 200 classes, 500 training and 50 validation images each: the zip with the published MD5 and, since it has
no checksum, any extracted folder (one that lacks classes is refused naming them). The `md5` setting replaces the
published checksum, for a deliberately different archive; for a folder it only says that the copy is deliberately
not the canonical set, which is then held to what its own files promise.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from gcl.data.image_files import ImageFiles
from gcl.data.image_files import natural as _natural
from gcl.data.image_files import some as _some
from gcl.data.image_sources import ArchiveSourceSettings, locate_archive, stats
from gcl.data.source_registry import SourceError, register_source

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_FILE = "tiny-imagenet-200.zip"
TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"     # 248,100,043 bytes
TINY_ROOT = "tiny-imagenet-200"
TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS = 200, 500, 50   # the canonical set: 100,000 / 10,000 images
# the canonical set's 200 WordNet ids in the order of its wnids.txt: the labels this reader gives them, which are
# mammoth's (its seq-tinyimg CLASS_NAMES, egyptian_cat, reel, ... african_elephant, follow this order); an image
# folder `like: tinyimagenet` takes its labels from it, and a copy lacking some of them is named as such
TINY_WNIDS = tuple("""
n02124075 n04067472 n04540053 n04099969 n07749582 n01641577 n02802426 n09246464 n07920052 n03970156 n03891332
n02106662 n03201208 n02279972 n02132136 n04146614 n07873807 n02364673 n04507155 n03854065 n03838899 n03733131
n01443537 n07875152 n03544143 n09428293 n03085013 n02437312 n07614500 n03804744 n04265275 n02963159 n02486410
n01944390 n09256479 n02058221 n04275548 n02321529 n02769748 n02099712 n07695742 n02056570 n02281406 n01774750
n02509815 n03983396 n07753592 n04254777 n02233338 n04008634 n02823428 n02236044 n03393912 n07583066 n04074963
n01629819 n09332890 n02481823 n03902125 n03404251 n09193705 n03637318 n04456115 n02666196 n03796401 n02795169
n02123045 n01855672 n01882714 n02917067 n02988304 n04398044 n02843684 n02423022 n02669723 n04465501 n02165456
n03770439 n02099601 n04486054 n02950826 n03814639 n04259630 n03424325 n02948072 n03179701 n03400231 n02206856
n03160309 n01984695 n03977966 n03584254 n04023962 n02814860 n01910747 n04596742 n03992509 n04133789 n03937543
n02927161 n01945685 n02395406 n02125311 n03126707 n04532106 n02268443 n02977058 n07734744 n03599486 n04562935
n03014705 n04251144 n04356056 n02190166 n03670208 n02002724 n02074367 n04285008 n04560804 n04366367 n02403003
n07615774 n04501370 n03026506 n02906734 n01770393 n04597913 n03930313 n04118538 n04179913 n04311004 n02123394
n04070727 n02793495 n02730930 n02094433 n04371430 n04328186 n03649909 n04417672 n03388043 n01774384 n02837789
n07579787 n04399382 n02791270 n03089624 n02814533 n04149813 n07747607 n03355925 n01983481 n04487081 n03250847
n03255030 n02892201 n02883205 n03100240 n02415577 n02480495 n01698640 n01784675 n04376876 n03444034 n01917289
n01950731 n03042490 n07711569 n04532670 n03763968 n07768694 n02999410 n03617480 n06596364 n01768244 n02410509
n03976657 n01742172 n03980874 n02808440 n02226429 n02231487 n02085620 n01644900 n02129165 n02699494 n03837869
n02815834 n07720875 n02788148 n02909870 n03706229 n07871810 n03447447 n02113799 n12267677 n03662601 n02841315
n07715103 n02504458
""".split())


class TinyImagenetSettings(ArchiveSourceSettings):
    # another than the published MD5 also says that a folder is deliberately not the canonical set (module docstring)
    md5: str = Field(TINY_MD5, pattern="^[0-9a-f]{32}$", description="MD5 the archive must have")


def _tiny_fix(root: Path) -> str:
    return (f"Fix: download {TINY_FILE} (MD5 {TINY_MD5}, 248,100,043 bytes; the canonical address {TINY_URL} "
            "has gone offline before) and either put it at "
            f"{root / TINY_FILE} or set sources.tinyimagenet.archive to its path (an extracted "
            f"{TINY_ROOT}/ folder works too); or set sources.tinyimagenet.url to a mirror of the same file.")


class _Files(ImageFiles):
    """Read-only view of the dataset's files, inside the zip or in an extracted folder (gcl.data.image_files), the
    archive's top folder `tiny-imagenet-200/` accepted either way."""

    def __init__(self, where: Path, root: Path):
        # where the archive belongs: the download folder
        super().__init__(where, _tiny_fix(root), top=TINY_ROOT, dataset="Tiny ImageNet")

    def text(self, name: str, strict: bool = True) -> list[str]:
        """The non-empty lines of a text file; `strict` refuses bytes that are not UTF-8 (the files are ASCII)."""
        raw = self.read(name)
        try:
            text = raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError as exc:
            raise SourceError(f"{self.where}: {self.prefix}{name} is not the UTF-8 (ASCII) text file of Tiny ImageNet "
                              f"({exc}): the file is damaged or was replaced. Delete {self.where} and supply a fresh copy. "
                              f"{self.fix}") from exc
        return [line for line in text.splitlines() if line.strip()]


def _decode(files: _Files, names: list[str], what: str) -> torch.Tensor:
    """Every image as RGB (the set has some grey-scale images, expanded to RGB as PIL does), all of one size."""
    def mismatch(name: str, shape: tuple, first: tuple) -> str:
        return (f"{files.where}: {files.prefix}{name} is {shape}, unlike the {first} of the others: the archive is "
                f"damaged or not Tiny ImageNet. {files.fix}")
    return files.decode(names, mismatch, what=what)


def _check_complete(files: _Files, wnids: list[str], per_class: dict[str, list[str]], test_names: list[str],
                    test_y: list[int], canonical: bool) -> None:
    """Refuse a partial copy. What the files promise: every class of wnids.txt has the same number of training
    images (each listed in its <wnid>_boxes.txt where that file has lines), every image val_annotations.txt
    names exists and every image in val/images is annotated, every class has the same number of validation
    images; and, for the canonical set (the zip with the published MD5, or a folder unless `md5` says otherwise),
    exactly 200 classes (those missing named, where its classes are all Tiny ImageNet's) with 500 training and 50
    validation images each."""
    fix, pre, where = files.fix, files.prefix, files.where
    again = "The copy is incomplete (an interrupted extraction or copy): delete it and supply a complete one."
    counts = {w: len(per_class[w]) for w in wnids}
    most = max(counts.values())
    short = [w for w in wnids if counts[w] < most]
    if short:
        missing = []
        for w in short:   # the images are numbered <wnid>_0.JPEG .. <wnid>_<n-1>.JPEG
            have = {n.rsplit("/", 1)[1] for n in per_class[w]}
            missing += [f"{pre}train/{w}/images/{w}_{i}.JPEG" for i in range(most) if f"{w}_{i}.JPEG" not in have]
        raise SourceError(f"{where}: training images are missing: the classes of wnids.txt have {most} images each "
                          f"except {_some([f'{w} ({counts[w]})' for w in short])}"
                          + (f"; missing {_some(missing)}" if missing else "") + f". {again} {fix}")
    for w in wnids:
        boxes = f"train/{w}/{w}_boxes.txt"
        if boxes in files.names:
            have = {n.rsplit("/", 1)[1] for n in per_class[w]}
            listed = [line.split("\t")[0].strip() for line in files.text(boxes)]
            missing = [f"{pre}train/{w}/images/{n}" for n in listed if n not in have]
            if missing:
                raise SourceError(f"{where}: {pre}{boxes} lists {len(missing)} training images that are missing: "
                                  f"{_some(missing)}. {again} {fix}")
    missing = [pre + n for n in test_names if n not in files.names]
    if missing:
        raise SourceError(f"{where}: {pre}val/val_annotations.txt names {len(missing)} of its {len(test_names)} "
                          f"images that are missing: {_some(missing)}. {again} {fix}")
    annotated = set(test_names)
    extra = sorted((pre + n for n in files.names if n.startswith("val/images/") and n.endswith(".JPEG")
                    and n not in annotated), key=_natural)
    if extra:
        raise SourceError(f"{where}: {len(extra)} images under {pre}val/images/ have no line in "
                          f"{pre}val/val_annotations.txt ({_some(extra)}): the annotation file is cut short or "
                          f"damaged. {again} {fix}")
    val = np.bincount(np.asarray(test_y, dtype=np.int64), minlength=len(wnids))
    if val.min() != val.max():
        short = [f"{w} ({val[k]})" for k, w in enumerate(wnids) if val[k] < val.max()]
        raise SourceError(f"{where}: {pre}val/val_annotations.txt gives the classes {val.max()} images each except "
                          f"{_some(short)}. {again} {fix}")
    if canonical and (len(wnids), most, int(val.max())) != (TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS):
        raise SourceError(f"{where} holds {len(wnids)} classes with {most} training and {val.max()} validation "
                          f"images each; the canonical {TINY_FILE} holds {TINY_CLASSES} classes with "
                          f"{TINY_TRAIN_PER_CLASS} and {TINY_VAL_PER_CLASS}{_missing_classes(wnids)}. {again} "
                          + ("" if files.archive else "If the folder is deliberately not the canonical set, say so: set "
                             "sources.tinyimagenet.md5 to another MD5 (such as its archive's). ") + fix)


def _missing_classes(wnids: list[str]) -> str:
    """Where a copy holds fewer classes than the canonical set, all of them Tiny ImageNet's (a cut copy), the
    missing ones named, in the clause that ends the count's message; otherwise nothing (they cannot be known)."""
    have = set(wnids)
    if len(have) >= TINY_CLASSES or not have <= set(TINY_WNIDS):
        return ""
    missing = [w for w in TINY_WNIDS if w not in have]
    them = "it" if len(missing) == 1 else "them"
    return f"; missing: {_some(missing)} (no line in wnids.txt: the classes after {them} would take shifted labels)"


def _locate_tiny(settings: TinyImagenetSettings, root: Path) -> Path:
    """The archive (or extracted folder) to read, checked or downloaded."""
    return locate_archive("tinyimagenet", settings, root, TINY_FILE, settings.md5, TINY_URL, _tiny_fix(root),
                          folder_ok=True)


@register_source("tinyimagenet", TinyImagenetSettings)
def tinyimagenet(settings: TinyImagenetSettings, download_dir: Path) -> dict:
    """Tiny ImageNet: classes in the order of wnids.txt; train/<wnid>/images/*.JPEG for training (in the
    images' own numbering), val/images with val/val_annotations.txt as the test set (in annotation order)."""
    files = _Files(_locate_tiny(settings, Path(download_dir)), Path(download_dir))
    wnids = [line.strip() for line in files.text("wnids.txt")]
    if not wnids or len(set(wnids)) != len(wnids):
        raise SourceError(f"{files.where}: wnids.txt is empty or repeats a class. {files.fix}")
    label = {w: i for i, w in enumerate(wnids)}
    per_class: dict[str, list[str]] = {w: [] for w in wnids}
    for n in files.names:   # train/<wnid>/images/<file>.JPEG
        parts = n.split("/")
        if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and parts[3].endswith(".JPEG") \
                and parts[1] in per_class:
            per_class[parts[1]].append(n)
    train_names, train_y = [], []
    for w in wnids:
        imgs = sorted(per_class[w], key=_natural)
        if not imgs:
            raise SourceError(f"{files.where}: no training images under {files.prefix}train/{w}/images/. "
                              f"{files.fix}")
        train_names += imgs
        train_y += [label[w]] * len(imgs)
    test_names, test_y = [], []
    for line in files.text("val/val_annotations.txt"):
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label:
            raise SourceError(f"{files.where}: {files.prefix}val/val_annotations.txt has a line {line!r} that names no class "
                              f"of wnids.txt. {files.fix}")
        test_names.append(f"val/images/{fields[0]}")
        test_y.append(label[fields[1]])
    # canonical: the zip verified against the published MD5, or a folder (no checksum) unless `md5` says otherwise
    canonical = settings.md5 == TINY_MD5
    _check_complete(files, wnids, per_class, test_names, test_y, canonical)
    names = {}
    if "words.txt" in files.names:   # human-readable class names where the archive has them (not identifiers:
        for line in files.text("words.txt", strict=False):   # an odd byte there is shown, not fatal)
            w, _, words = line.partition("\t")
            names[w] = words.split(",")[0].strip()
    train_x, test_x = _decode(files, train_names, "training images"), _decode(files, test_names, "validation images")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise SourceError(f"{files.where}: training images are {tuple(train_x.shape[1:])}, test images "
                          f"{tuple(test_x.shape[1:])}. {files.fix}")
    return {"train_x": train_x, "train_y": torch.tensor(train_y, dtype=torch.int64),
            "test_x": test_x, "test_y": torch.tensor(test_y, dtype=torch.int64),
            "classes": [names.get(w, w) for w in wnids], **stats("tinyimagenet")}
