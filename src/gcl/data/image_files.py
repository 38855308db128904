"""A dataset's image files wherever they are kept, and their decoding into one uint8 (N, C, H, W) tensor.

What the readers of image files share (gcl.data.tinyimagenet_sources: Tiny ImageNet's zip or an extracted copy;
gcl.data.folder_sources: class folders, torchvision ImageFolder's layout): `ImageFiles` is a read-only view of
the files of a folder, a zip, or a tar (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz), possibly all under one top
folder, named by their paths below it. Nothing is extracted to disk, so a failure leaves nothing behind: a
folder's and a zip's files are read where they are; a tar, whose compressed stream cannot be read out of order
without decompressing it again from the start, is read once in its own order into memory (its files as stored:
compressed images, a fraction of the decoded tensor). `decode` fills one preallocated tensor, one image at a time,
with a progress line to stderr every 10% of a long decode. Every failure is a SourceError (one line) naming the
archive, the member and the fix the reader gives.
"""
from __future__ import annotations

import io
import lzma
import re
import sys
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from gcl.data.source_registry import SourceError

# what an image file's name ends with (torchvision's ImageFolder's list, lower case)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
PROGRESS_IMAGES = 5000   # a decode of at least this many images prints a line every PROGRESS_PERCENT
PROGRESS_PERCENT = 10
# what reading a damaged member raises: BadZipFile (bad CRC, bad local header), zlib.error (bad deflate stream),
# EOFError (cut short), lzma.LZMAError; NotImplementedError / RuntimeError for a compression method or encryption
# the archive's writer should not have used; OSError for an unreadable file in a folder (and gzip's errors)
READ_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, lzma.LZMAError, EOFError, NotImplementedError,
               RuntimeError, OSError)


def natural(name: str):
    """n01443537_10.JPEG after n01443537_9.JPEG: the images' own numbering."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def some(items: list[str], k: int = 5) -> str:
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def hidden(name: str) -> bool:
    """A file a system or an archiver adds beside the data (.DS_Store, ._x.jpg, .ipynb_checkpoints/, __MACOSX/)."""
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/"))


def _clean(name: str) -> str:
    """An archive member's path relative to the archive's root: `./train/x.jpg` and `/train/x.jpg` as `train/x.jpg`."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


class ImageFiles:
    """Read-only view of a dataset's files in a folder, a zip or a tar. `names`: the files' paths below the top
    folder (`prefix`), `dirs`: the folders there (those holding files, and empty ones). The top folder is `top`
    where the files are under it (a dataset's known root, e.g. tiny-imagenet-200), else the one folder that holds
    `marker` (e.g. train) when the root does not. `fix` ends every error (`image_fix`, where given, that about an
    image that cannot be decoded); `dataset` names what a complete copy is."""

    def __init__(self, where: Path, fix: str, top: str | None = None, marker: str | None = None,
                 dataset: str = "image", image_fix: str | None = None):
        self.where, self.fix, self.dataset, self.image_fix = where, fix, dataset, image_fix or fix
        self.zip, self.members = None, None       # an open zip; a tar's files (path -> bytes; None: a link)
        if where.is_dir():
            self.kind = "folder"
            found = [(p.relative_to(where).as_posix(), p.is_dir()) for p in where.rglob("*")]
            files = [n for n, is_dir in found if not is_dir]
            dirs = [n for n, is_dir in found if is_dir]
        elif not where.exists():
            raise SourceError(f"{where} does not exist. {fix}")
        elif where.name.lower().endswith(TAR_SUFFIXES) or not where.name.lower().endswith(".zip") \
                and not zipfile.is_zipfile(where) and _is_tar(where):
            self.kind = "tar"
            files, dirs = self._read_tar()
        else:
            self.kind = "zip"
            try:
                self.zip = zipfile.ZipFile(where)
            except (zipfile.BadZipFile, OSError) as exc:
                what = "not a zip archive" if where.name.lower().endswith(".zip") else \
                    "neither a folder nor a zip or tar archive"
                raise SourceError(f"{where} is {what} ({exc}): it is truncated, damaged or another kind of file. "
                                  f"{fix}") from exc
            names = [_clean(n) for n in self.zip.namelist()]
            files = [n for n in names if n and not n.endswith("/")]
            dirs = [n.rstrip("/") for n in names if n.endswith("/")]
        self.prefix = _top_folder(files + dirs, top, marker, where)
        self.names = {n[len(self.prefix):] for n in files if n.startswith(self.prefix)}
        self.dirs = {d[len(self.prefix):] for d in dirs if d.startswith(self.prefix) and len(d) > len(self.prefix)}
        for n in self.names:     # the folders that hold files, where an archive lists no entry of their own
            parts = n.split("/")[:-1]
            self.dirs.update("/".join(parts[:k]) for k in range(1, len(parts) + 1))

    @property
    def archive(self) -> bool:
        return self.kind != "folder"

    def _read_tar(self) -> tuple[list[str], list[str]]:
        """Every member of the tar, in one pass: its files' bytes kept (links named, to refuse when read)."""
        files, dirs, self.members = [], [], {}
        try:
            with tarfile.open(self.where, "r:*") as tar:
                for member in tar:
                    name = _clean(member.name)
                    if member.isdir():
                        dirs.append(name.rstrip("/"))
                    elif member.isfile():
                        self.members[name] = tar.extractfile(member).read()
                        files.append(name)
                    elif member.issym() or member.islnk():
                        self.members[name] = None
                        files.append(name)
        except READ_ERRORS as exc:
            raise SourceError(f"{self.where} cannot be read as a tar archive ({type(exc).__name__}: {exc}): it is "
                              f"truncated or damaged. Supply a complete copy. {self.fix}") from exc
        return files, dirs

    def __enter__(self) -> ImageFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()
        self.members = None

    def read(self, name: str) -> bytes:
        """The bytes of file `name` (a path below the top folder)."""
        if name not in self.names:
            raise SourceError(f"{self.where} has no {self.prefix}{name}: it is not a complete {self.dataset} "
                              f"archive. {self.fix}")
        path = self.prefix + name
        try:
            if self.zip is not None:
                return self.zip.read(path)
            if self.members is not None:
                data = self.members[path]
                if data is None:
                    raise SourceError(f"{self.where}: {path} is a link inside the archive, which is not read. Fix: "
                                      "archive the files themselves (tar --dereference).")
                return data
            return (self.where / path).read_bytes()
        except READ_ERRORS as exc:
            if self.archive:
                raise SourceError(f"{self.where}: {path} cannot be read ({type(exc).__name__}: {exc}): the archive is "
                                  f"corrupt. Delete {self.where} and supply a fresh copy. {self.fix}") from exc
            raise SourceError(f"{self.where}: {path} cannot be read ({type(exc).__name__}: {exc}): the folder is "
                              f"damaged or unreadable. Replace the file, or check the disk and the permissions. "
                              f"{self.fix}") from exc

    def decode_one(self, name: str, mode: str = "RGB", size: tuple[int, int] | None = None) -> torch.Tensor:
        """Image `name` as uint8 (C, H, W) in PIL mode `mode` (RGB: grey-scale, palette, CMYK and RGBA images are
        converted as PIL converts them, an alpha channel dropped; L: grey-scale), resized to `size` (width, height)
        with PIL's bilinear filter (antialiased when it shrinks) where given and different."""
        try:
            with Image.open(io.BytesIO(self.read(name))) as img:
                img = img if img.mode == mode else img.convert(mode)
                if size is not None and img.size != size:
                    img = img.resize(size, Image.BILINEAR)
                pixels = np.array(img)   # a writable copy
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:   # damaged or foreign
            raise SourceError(f"{self.where}: {self.prefix}{name} is not a readable image ({exc}). "
                              f"{self.image_fix}") from exc
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def decode(self, names: list[str], mismatch: Callable[[str, tuple, tuple], str], mode: str = "RGB",
               size: tuple[int, int] | None = None, shape: tuple[int, int, int] | None = None,
               what: str = "images") -> torch.Tensor:
        """Decode every image into one preallocated uint8 (N, C, H, W) tensor (a data-preparation step, run once).
        Each image must have `shape` (C, H, W) where given, else the first's; `mismatch(name, its shape, the
        shape)` says why not. `size`: resize to it (decode_one). Progress lines name `what`."""
        first = self.decode_one(names[0], mode, size)
        shape = tuple(shape or first.shape)
        out = torch.empty((len(names), *shape), dtype=torch.uint8)
        progress = _Progress(self.where, len(names), what)
        for i, name in enumerate(names):
            img = first if i == 0 else self.decode_one(name, mode, size)
            if tuple(img.shape) != shape:
                raise SourceError(mismatch(name, tuple(img.shape), shape))
            out[i] = img
            progress(i + 1)
        return out


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _top_folder(names: list[str], top: str | None, marker: str | None, where: Path) -> str:
    """The prefix below which the dataset's paths are read: `top/` where the files are under it; else, when no path
    starts with `marker/`, the one folder holding `marker/` (several such folders: an error naming them)."""
    if top is not None:
        return f"{top}/" if any(n.startswith(f"{top}/") for n in names) else ""
    if marker is None or any(n == marker or n.startswith(f"{marker}/") for n in names):
        return ""
    tops = sorted({n.split("/")[0] for n in names if n.split("/")[1:2] == [marker] and not hidden(n)})
    if len(tops) > 1:
        raise SourceError(f"{where}: several folders hold a {marker}/ folder ({some(tops)}). Fix: point the path at "
                          "one of them")
    return f"{tops[0]}/" if tops else ""


class _Progress:
    """A line to stderr every PROGRESS_PERCENT of a decode of PROGRESS_IMAGES images or more."""

    def __init__(self, where: Path, total: int, what: str):
        self.where, self.total, self.what = where, total, what
        self.on, self.next, self.start = total >= PROGRESS_IMAGES, PROGRESS_PERCENT, time.monotonic()

    def __call__(self, done: int) -> None:
        if self.on and done * 100 >= self.next * self.total:
            print(f"{self.where.name}: {done:,} of {self.total:,} {self.what} decoded ({self.next}%, "
                  f"{time.monotonic() - self.start:.0f} s)", file=sys.stderr, flush=True)
            self.next += PROGRESS_PERCENT
