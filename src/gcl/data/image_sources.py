"""The image benchmarks' raw data: CIFAR-10, CIFAR-100 and Tiny ImageNet as uint8 (N, 3, H, W) tensors.

Every file is checked against its published MD5 before it is parsed, so a truncated download or a
foreign file stops the stage with a message that names the file and says how to supply a good one.
Settings (under `sources.<name>` in params.yaml), all optional:
    download: true        fetch what is missing (false: only use files already in place)
    url: <mirror>         where to fetch the archive from instead of the canonical address
    archive: <path>       a local copy of the archive (checked like a download)
    md5: <hex>            Tiny ImageNet only: the archive's checksum, if you deliberately use another one
    download_dir: <dir>   where archives are kept and extracted (default data/downloads, outside DVC)
Each source also records its dataset's normalisation constants (reference/PROTOCOL.md), so that a
benchmark built from it normalises with the right mean and std.
"""
from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pydantic import Field

from gcl.data.sources import SourceError, SourceSettings, register_source

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


def _fetch_cifar_archive(name: str, cls, cfg: dict, root: Path, problem: str) -> None:
    """Put the original files under `root/<base_folder>`: from a local archive, or by downloading one."""
    from torchvision.datasets.utils import check_integrity, download_url, extract_archive
    if cfg["archive"]:
        archive = Path(cfg["archive"])
        if not archive.is_file():
            raise SourceError(f"sources.{name}.archive: {archive} does not exist. {_cifar_fix(name, cls, root)}")
        if not check_integrity(str(archive), cls.tgz_md5):
            raise SourceError(f"{archive} is not the original {cls.filename} (its MD5 is not {cls.tgz_md5}). "
                              f"{_cifar_fix(name, cls, root)}")
    elif cfg["download"]:
        archive = root / cls.filename
        url = cfg["url"] or cls.url
        try:  # download_url keeps a copy that already matches the MD5, and verifies a fresh download
            download_url(url, str(root), filename=cls.filename, md5=cls.tgz_md5)
        except Exception as exc:
            raise SourceError(f"could not download {url} to {archive} ({exc}). {_cifar_fix(name, cls, root)}") from exc
    else:
        raise SourceError(f"{problem}, and sources.{name}.download is false. {_cifar_fix(name, cls, root)}")
    try:
        extract_archive(str(archive), str(root))
    except Exception as exc:
        raise SourceError(f"could not extract {archive} ({exc}). {_cifar_fix(name, cls, root)}") from exc


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
            raise SourceError(f"torchvision could not parse {folder} ({split}): {exc}. "
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

    def __init__(self, where: Path):
        self.where = where
        try:
            self.zip = zipfile.ZipFile(where) if where.is_file() else None
        except zipfile.BadZipFile as exc:
            raise SourceError(f"{where} is not a zip archive ({exc}). {_tiny_fix(where.parent)}") from exc
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
                              f"archive. {_tiny_fix(self.where.parent)}")
        if self.zip is not None:
            return self.zip.read(self.prefix + name)
        return (self.where / (self.prefix + name)).read_bytes()

    def text(self, name: str) -> list[str]:
        return [line for line in self.read(name).decode().splitlines() if line.strip()]


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
                          f"{_tiny_fix(files.where.parent)}") from exc
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
                              f"{_tiny_fix(files.where.parent)}")
        out[i] = img
    return out


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
    files = _Files(_locate_tiny(cfg, Path(download_dir)))
    wnids = [line.strip() for line in files.text("wnids.txt")]
    if not wnids or len(set(wnids)) != len(wnids):
        raise SourceError(f"{files.where}: wnids.txt is empty or repeats a class. {_tiny_fix(files.where.parent)}")
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
                              f"{_tiny_fix(files.where.parent)}")
        train_names += imgs
        train_y += [label[w]] * len(imgs)
    test_names, test_y = [], []
    for line in files.text("val/val_annotations.txt"):
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label:
            raise SourceError(f"{files.where}: val/val_annotations.txt has a line {line!r} that names no class "
                              f"of wnids.txt. {_tiny_fix(files.where.parent)}")
        test_names.append(f"val/images/{fields[0]}")
        test_y.append(label[fields[1]])
    names = {}
    if "words.txt" in files.names:   # human-readable class names where the archive has them
        for line in files.text("words.txt"):
            w, _, words = line.partition("\t")
            names[w] = words.split(",")[0].strip()
    train_x, test_x = _decode(files, train_names), _decode(files, test_names)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise SourceError(f"{files.where}: training images are {tuple(train_x.shape[1:])}, test images "
                          f"{tuple(test_x.shape[1:])}. {_tiny_fix(files.where.parent)}")
    return {"train_x": train_x, "train_y": torch.tensor(train_y, dtype=torch.int64),
            "test_x": test_x, "test_y": torch.tensor(test_y, dtype=torch.int64),
            "classes": [names.get(w, w) for w in wnids], **_stats("tinyimagenet")}
