"""The image benchmarks' raw data: CIFAR-10, CIFAR-100 and Tiny ImageNet as uint8 (N, 3, H, W) tensors.

Every file is checked against its published MD5 before it is parsed, so a truncated download or a
foreign file stops the stage with a message that names the file and says how to supply a good one. An
extracted Tiny ImageNet folder has no checksum: there, as in the zip, the image counts must be what wnids.txt,
the boxes files and val_annotations.txt promise (a partial copy is refused, naming the missing files).
Settings (under `sources.<name>` in params.yaml), all optional:
    download: true        fetch what is missing (false: only use files already in place; an intact
                          archive in download_dir is checked and extracted either way)
    url: <mirror>         where to fetch the archive from instead of the canonical address
    archive: <path>       a local copy of the archive (checked like a download)
    md5: <hex>            Tiny ImageNet only: the archive's checksum, if you deliberately use another one
    download_dir: <dir>   where archives are kept and extracted (default data/downloads, outside DVC)
Each source also records its dataset's normalisation constants (docs/protocol.md), so that a
benchmark built from it normalises with the right mean and std.

Longer than ~300 lines because three datasets' readers, in three on-disk formats, share one download,
checksum and extraction path here.
"""
from __future__ import annotations

import io
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pydantic import Field

from gcl.data.source_registry import SourceError, SourceSettings, register_source

# torchvision is imported inside the functions that read or download files: importing it takes about
# a second (it pulls in torch._dynamo), which every train stage would otherwise pay for nothing.

# mean / std per channel, in [0, 1] units, as the reference framework (mammoth) normalises
NORMALIZATION = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)),
    "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "tinyimagenet": ((0.4802, 0.4480, 0.3975), (0.2770, 0.2691, 0.2821)),
}


def _stats(name: str) -> dict:
    mean, std = NORMALIZATION[name]
    return {"mean": list(mean), "std": list(std)}


# ---------------------------------------------------------------- CIFAR (torchvision's pickled batches)

def _cifar_files(cls) -> dict[str, str]:
    """File name -> MD5 of every file torchvision's class reads, taken from torchvision itself."""
    files = {name: md5 for name, md5 in cls.train_list + cls.test_list}
    files[cls.meta["filename"]] = cls.meta["md5"]
    return files


def _first_bad_file(folder: Path, files: dict[str, str]) -> tuple[Path, str] | None:
    from torchvision.datasets.utils import check_integrity
    for name, md5 in files.items():
        path = folder / name
        if not path.exists():
            return path, "is missing"
        if not check_integrity(str(path), md5):
            return path, f"does not match its published MD5 {md5} (truncated or not the original file)"
    return None


def _cifar_fix(name: str, cls, root: Path) -> str:
    return (f"Fix: let the stage download it (sources.{name}.download: true, with internet access); or download "
            f"{cls.url} (MD5 {cls.tgz_md5}) yourself and set sources.{name}.archive to its path, or put it at "
            f"{root / cls.filename}; or set sources.{name}.url to a mirror of that file; or extract it so that "
            f"{root / cls.base_folder} holds the original files. Delete a damaged copy first.")


def _extract_cifar(name: str, cls, archive: Path, root: Path) -> None:
    from torchvision.datasets.utils import extract_archive
    try:
        extract_archive(str(archive), str(root))
    except Exception as exc:   # tarfile.ReadError, EOFError, zlib/gzip errors for a damaged .tar.gz; OSError
        raise SourceError(f"could not extract {archive} ({type(exc).__name__}: {exc}): the archive is truncated or "
                          f"damaged, or {root} is not writable. {_cifar_fix(name, cls, root)}") from exc


def _fetch_cifar_archive(name: str, cls, cfg: dict, root: Path, problem: str) -> None:
    """Put the original files under `root/<base_folder>` from the archive: the one `archive` names, else the one
    already at `root/<filename>` (the place the error messages name), else a download; each checked by MD5."""
    from torchvision.datasets.utils import check_integrity, download_url
    if cfg["archive"]:
        archive = Path(cfg["archive"])
        if not archive.is_file():
            raise SourceError(f"{problem}; sources.{name}.archive: {archive} does not exist. "
                              f"{_cifar_fix(name, cls, root)}")
        if not check_integrity(str(archive), cls.tgz_md5):
            raise SourceError(f"{problem}; {archive} is not the original {cls.filename} (its MD5 is not "
                              f"{cls.tgz_md5}: truncated or another file). {_cifar_fix(name, cls, root)}")
        return _extract_cifar(name, cls, archive, root)
    archive = root / cls.filename
    if check_integrity(str(archive), cls.tgz_md5):   # an intact archive in place: usable without download
        return _extract_cifar(name, cls, archive, root)
    if cfg["download"]:
        url = cfg["url"] or cls.url
        try:  # download_url replaces a copy that does not match the MD5, and verifies a fresh download
            download_url(url, str(root), filename=cls.filename, md5=cls.tgz_md5)
        except Exception as exc:
            raise SourceError(f"{problem}; could not download {url} to {archive} ({exc}). "
                              f"{_cifar_fix(name, cls, root)}") from exc
        return _extract_cifar(name, cls, archive, root)
    state = (f"{archive} is there but does not match its published MD5 {cls.tgz_md5} (truncated or not the "
             f"original file)" if archive.exists() else f"{archive} is missing")
    raise SourceError(f"{problem}; {state}, and sources.{name}.download is false. {_cifar_fix(name, cls, root)}")


def _unreadable_batch(folder: Path, files: dict[str, str]) -> tuple[Path, Exception] | None:
    """The first of the pickled batches that does not unpickle, to name it (torchvision's error does not)."""
    import pickle
    for name in files:
        try:
            with open(folder / name, "rb") as f:
                pickle.load(f, encoding="latin1")
        except Exception as exc:   # EOFError / UnpicklingError when truncated; others for foreign bytes
            return folder / name, exc
    return None


def load_cifar(name: str, cls, cfg: dict, root: Path) -> dict:
    """One of torchvision's CIFAR datasets, every file checked against torchvision's MD5s, as tensors."""
    folder = root / cls.base_folder
    files = _cifar_files(cls)
    bad = _first_bad_file(folder, files)
    if bad is not None:
        _fetch_cifar_archive(name, cls, cfg, root, f"{bad[0]} {bad[1]}")
        bad = _first_bad_file(folder, files)
        if bad is not None:
            raise SourceError(f"{bad[0]} {bad[1]}, even after extracting the archive. {_cifar_fix(name, cls, root)}")
    out = {}
    for split, train in (("train", True), ("test", False)):
        try:
            ds = cls(str(root), train=train, download=False)
        except Exception as exc:
            culprit = _unreadable_batch(folder, files)
            where = (f"{culprit[0]} is not a readable pickled batch ({type(culprit[1]).__name__}: {culprit[1]})"
                     if culprit else f"torchvision could not parse {folder} ({split}: {type(exc).__name__}: {exc})")
            raise SourceError(f"{where}: it is truncated or damaged; delete {folder}. "
                              f"{_cifar_fix(name, cls, root)}") from exc
        x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
        y = torch.as_tensor(ds.targets, dtype=torch.int64)
        if len(x) != len(y) or (len(y) and (y.min() < 0 or y.max() >= len(ds.classes))):
            raise SourceError(f"{folder} ({split}) holds {len(x)} images and {len(y)} labels outside "
                              f"[0, {len(ds.classes)}). {_cifar_fix(name, cls, root)}")
        out[f"{split}_x"], out[f"{split}_y"] = x, y
        out["classes"] = list(ds.classes)
    return {**out, **_stats(name)}


# ---------------------------------------------------------------- Tiny ImageNet (the Stanford zip)

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_FILE = "tiny-imagenet-200.zip"
TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"     # 248,100,043 bytes
TINY_ROOT = "tiny-imagenet-200"
TINY_CLASSES, TINY_TRAIN_PER_CLASS, TINY_VAL_PER_CLASS = 200, 500, 50   # the canonical set: 100,000 / 10,000 images


class ArchiveSourceSettings(SourceSettings):
    archive: str | None = Field(None, description="a local copy of the archive to use instead of downloading")
    url: str | None = Field(None, description="a mirror to download the archive from")


class TinyImagenetSettings(ArchiveSourceSettings):
    md5: str = Field(TINY_MD5, pattern="^[0-9a-f]{32}$", description="MD5 the archive must have")


@register_source("cifar10", ArchiveSourceSettings)
def cifar10(cfg: dict, download_dir: Path) -> dict:
    """CIFAR-10: 50,000 / 10,000 images of 32x32x3, classes in the dataset's label order."""
    from torchvision.datasets import CIFAR10
    return load_cifar("cifar10", CIFAR10, cfg, download_dir)


@register_source("cifar100", ArchiveSourceSettings)
def cifar100(cfg: dict, download_dir: Path) -> dict:
    """CIFAR-100 with its 100 fine labels."""
    from torchvision.datasets import CIFAR100
    return load_cifar("cifar100", CIFAR100, cfg, download_dir)



def _tiny_fix(root: Path) -> str:
    return (f"Fix: download {TINY_FILE} (MD5 {TINY_MD5}, 248,100,043 bytes; the canonical address {TINY_URL} "
            "has gone offline before) and either put it at "
            f"{root / TINY_FILE} or set sources.tinyimagenet.archive to its path (an extracted "
            f"{TINY_ROOT}/ folder works too); or set sources.tinyimagenet.url to a mirror of the same file.")


class _Files:
    """Read-only view of the dataset's files, inside the zip or in an extracted folder."""

    def __init__(self, where: Path, root: Path):
        self.where = where
        self.fix = _tiny_fix(root)    # where the archive belongs: the download folder
        try:
            self.zip = zipfile.ZipFile(where) if where.is_file() else None
        except zipfile.BadZipFile as exc:
            raise SourceError(f"{where} is not a zip archive ({exc}). {self.fix}") from exc
        if self.zip is not None:
            names = self.zip.namelist()
        else:
            names = [p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file()]
        # the archive holds one top folder `tiny-imagenet-200/`; accept a folder given either way
        self.prefix = f"{TINY_ROOT}/" if any(n.startswith(f"{TINY_ROOT}/") for n in names) else ""
        self.names = {n[len(self.prefix):] for n in names if n.startswith(self.prefix)}

    def read(self, name: str) -> bytes:
        if name not in self.names:
            raise SourceError(f"{self.where} has no {self.prefix}{name}: it is not a complete Tiny ImageNet "
                              f"archive. {self.fix}")
        try:
            if self.zip is not None:
                return self.zip.read(self.prefix + name)
            return (self.where / (self.prefix + name)).read_bytes()
        # a damaged member: BadZipFile (bad CRC, bad local header), zlib.error (bad deflate stream), EOFError
        # (cut short); NotImplementedError / RuntimeError for a compression method or encryption the
        # canonical zip does not use; OSError for an unreadable file in an extracted folder
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, OSError) as exc:
            kind = "the archive is corrupt" if self.zip is not None else "the extracted folder is damaged"
            raise SourceError(f"{self.where}: {self.prefix}{name} cannot be read ({type(exc).__name__}: {exc}): "
                              f"{kind}. Delete {self.where} and supply a fresh copy. {self.fix}") from exc

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


def _natural(name: str):
    """n01443537_10.JPEG after n01443537_9.JPEG: the images' own numbering."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _decode_one(files: _Files, name: str) -> torch.Tensor:
    """One JPEG as uint8 (3, H, W); the set has some grey-scale images, expanded to RGB as PIL does."""
    try:
        with Image.open(io.BytesIO(files.read(name))) as img:
            pixels = np.array(img if img.mode == "RGB" else img.convert("RGB"))   # a writable copy
    except (OSError, SyntaxError, ValueError) as exc:   # what PIL raises for damaged or foreign files
        raise SourceError(f"{files.where}: {files.prefix}{name} is not a readable image ({exc}). "
                          f"{files.fix}") from exc
    return torch.from_numpy(pixels).permute(2, 0, 1)


def _decode(files: _Files, names: list[str]) -> torch.Tensor:
    """Decode every image into one preallocated uint8 (N, 3, H, W) tensor (a data-preparation step, run once)."""
    first = _decode_one(files, names[0])
    out = torch.empty((len(names), *first.shape), dtype=torch.uint8)
    for i, name in enumerate(names):
        img = first if i == 0 else _decode_one(files, name)
        if img.shape != first.shape:
            raise SourceError(f"{files.where}: {files.prefix}{name} is {tuple(img.shape)}, unlike the "
                              f"{tuple(first.shape)} of the others: the archive is damaged or not Tiny ImageNet. "
                              f"{files.fix}")
        out[i] = img
    return out


def _some(items: list[str], k: int = 5) -> str:
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


def _check_complete(files: _Files, wnids: list[str], per_class: dict[str, list[str]], test_names: list[str],
                    test_y: list[int], canonical: bool) -> None:
    """Refuse a partial copy. What the files promise: every class of wnids.txt has the same number of training
    images (each listed in its <wnid>_boxes.txt where that file has lines), every image val_annotations.txt
    names exists and every image in val/images is annotated, every class has the same number of validation
    images; and, for the canonical set (the zip with the published MD5, or a folder with its 200 classes),
    exactly 500 training and 50 validation images per class."""
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
                          f"{TINY_TRAIN_PER_CLASS} and {TINY_VAL_PER_CLASS}. {again} {fix}")


def _locate_tiny(cfg: dict, root: Path) -> Path:
    """The archive (or extracted folder) to read, checked or downloaded."""
    from torchvision.datasets.utils import check_integrity, download_url
    md5 = cfg["md5"]
    if cfg["archive"]:
        where = Path(cfg["archive"])
        if where.is_dir():
            return where          # an extracted folder has no checksum; its structure is checked as it is read
        if not where.is_file():
            raise SourceError(f"sources.tinyimagenet.archive: {where} does not exist. {_tiny_fix(root)}")
        if not check_integrity(str(where), md5):
            raise SourceError(f"{where} does not match the MD5 {md5} of {TINY_FILE}. {_tiny_fix(root)}")
        return where
    where = root / TINY_FILE
    if check_integrity(str(where), md5):
        return where
    if not cfg["download"]:
        state = "does not match its MD5" if where.exists() else "is missing"
        raise SourceError(f"{where} {state}, and sources.tinyimagenet.download is false. {_tiny_fix(root)}")
    url = cfg["url"] or TINY_URL
    try:
        download_url(url, str(root), filename=TINY_FILE, md5=md5)
    except Exception as exc:
        raise SourceError(f"could not download {url} to {where} with MD5 {md5} ({exc}). {_tiny_fix(root)}") from exc
    return where


@register_source("tinyimagenet", TinyImagenetSettings)
def tinyimagenet(cfg: dict, download_dir: Path) -> dict:
    """Tiny ImageNet: classes in the order of wnids.txt; train/<wnid>/images/*.JPEG for training (in the
    images' own numbering), val/images with val/val_annotations.txt as the test set (in annotation order)."""
    files = _Files(_locate_tiny(cfg, Path(download_dir)), Path(download_dir))
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
    # canonical: verified against the published MD5, or an (unchecksummed) folder with the canonical 200 classes
    canonical = files.zip is not None and cfg["md5"] == TINY_MD5 or files.zip is None and len(wnids) == TINY_CLASSES
    _check_complete(files, wnids, per_class, test_names, test_y, canonical)
    names = {}
    if "words.txt" in files.names:   # human-readable class names where the archive has them (not identifiers:
        for line in files.text("words.txt", strict=False):   # an odd byte there is shown, not fatal)
            w, _, words = line.partition("\t")
            names[w] = words.split(",")[0].strip()
    train_x, test_x = _decode(files, train_names), _decode(files, test_names)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise SourceError(f"{files.where}: training images are {tuple(train_x.shape[1:])}, test images "
                          f"{tuple(test_x.shape[1:])}. {files.fix}")
    return {"train_x": train_x, "train_y": torch.tensor(train_y, dtype=torch.int64),
            "test_x": test_x, "test_y": torch.tensor(test_y, dtype=torch.int64),
            "classes": [names.get(w, w) for w in wnids], **_stats("tinyimagenet")}
