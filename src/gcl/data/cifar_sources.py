"""CIFAR-10 and CIFAR-100 as uint8 (N, 3, 32, 32) tensors, from torchvision's pickled batches.

Every file is checked against the MD5 torchvision publishes before it is parsed; what is missing or damaged is
extracted again from the archive (gcl.data.image_sources.locate_archive: the `archive` setting, one in place, or
a download), and a file that still does not parse is named with the fix.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gcl.data.image_sources import ArchiveSourceSettings, locate_archive, stats
from gcl.data.source_registry import SourceError, register_source

# the class names in label order, as batches.meta (label_names) and meta (fine_label_names) hold them: sorted
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = tuple("""
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can castle
caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish
forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle
mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine
possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar
sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale
willow_tree wolf woman worm
""".split())


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


def _fetch_cifar_archive(name: str, cls, settings: ArchiveSourceSettings, root: Path, problem: str) -> None:
    """Put the original files under `root/<base_folder>` from the archive: the one `archive` names, else the one
    already at `root/<filename>` (the place the error messages name), else a download; each checked by MD5."""
    archive = locate_archive(name, settings, root, cls.filename, cls.tgz_md5, cls.url, _cifar_fix(name, cls, root),
                             problem)
    _extract_cifar(name, cls, archive, root)


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


def load_cifar(name: str, cls, settings: ArchiveSourceSettings, root: Path) -> dict:
    """One of torchvision's CIFAR datasets, every file checked against torchvision's MD5s, as tensors."""
    folder = root / cls.base_folder
    files = _cifar_files(cls)
    bad = _first_bad_file(folder, files)
    if bad is not None:
        _fetch_cifar_archive(name, cls, settings, root, f"{bad[0]} {bad[1]}")
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
    return {**out, **stats(name)}


@register_source("cifar10", ArchiveSourceSettings)
def cifar10(settings: ArchiveSourceSettings, download_dir: Path) -> dict:
    """CIFAR-10: 50,000 / 10,000 images of 32x32x3, classes in the dataset's label order."""
    from torchvision.datasets import CIFAR10
    return load_cifar("cifar10", CIFAR10, settings, download_dir)


@register_source("cifar100", ArchiveSourceSettings)
def cifar100(settings: ArchiveSourceSettings, download_dir: Path) -> dict:
    """CIFAR-100 with its 100 fine labels."""
    from torchvision.datasets import CIFAR100
    return load_cifar("cifar100", CIFAR100, settings, download_dir)
