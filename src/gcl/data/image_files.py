"""A dataset's image files wherever they are kept, and their decoding into one uint8 (N, C, H, W) tensor.

What the readers of image files share (gcl.data.tinyimagenet_sources: Tiny ImageNet's zip or an extracted copy;
gcl.data.folder_sources: class folders, torchvision ImageFolder's layout): `ImageFiles` is a read-only view of
the files of a folder, a zip, or a tar (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz), possibly all under one top
folder, named by their paths below it (an archive's `./train/x.png` and `/train/x.png` as `train/x.png`). Nothing
is extracted to disk, so a failure leaves nothing behind. A folder is listed following its symbolic links, as
torchvision's ImageFolder does (a link to nowhere, or one that makes a loop, is refused); its files and a zip's
are read where they are. A tar's compressed stream cannot be read out of order without decompressing it again
from the start: it is listed in one pass that keeps no file's bytes, and its images are decoded in one more pass,
in the archive's order, each into its place in the tensor, so that only the image being decoded is held.
`decode` fills one preallocated tensor, one image at a time, with a progress line to stderr every 10% of a long
decode. Images of more than 8 bits per channel become 8-bit as PIL makes 16-bit colour 8-bit (the high byte of
each value); 32-bit integer and floating-point images, whose values have no fixed range, are refused. Every
failure is a SourceError (one line) naming the archive, the member and the fix the reader gives.
"""
from __future__ import annotations

import contextlib
import io
import lzma
import os
import re
import sys
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
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
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")     # PIL's 16-bit grey (PNG, TIFF)
SIXTEEN_BIT_AS_I = ("PNG", "PPM")     # formats whose PIL mode I is 16-bit grey (a PGM's maxval is scaled to 65535)
CONVERT_FIX = ("Fix: convert it to an 8-bit RGB or grey-scale PNG or JPEG (e.g. with ImageMagick: convert <file> "
               "-depth 8 <file>.png), or remove it.")


def natural(name: str) -> tuple[list, str]:
    """The order of names: n01443537_9.JPEG before n01443537_10.JPEG (the images' own numbering); names that
    number alike (01.png and 1.png) in the order of the names themselves, the same in every process."""
    parts = re.split(r"(\d+)", name)      # text, digits, text, ...: the digit runs at the odd places
    return [int(p) if i % 2 else p for i, p in enumerate(parts)], name


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


class _Unconvertible(Exception):
    """An image whose pixels cannot be made 8-bit in the mode asked for; the message says what it is."""


class ImageFiles:
    """Read-only view of a dataset's files in a folder, a zip or a tar. `names`: the files' paths below the top
    folder (`prefix`), `dirs`: the folders there (those holding files, and empty ones). The top folder is `top`
    where the files are under it (a dataset's known root, e.g. tiny-imagenet-200), else the one folder that holds
    `marker` (e.g. train) when the root does not. `fix` ends every error (`image_fix`, where given, that about an
    image that cannot be decoded); `dataset` names what a complete copy is."""

    def __init__(self, where: Path, fix: str, top: str | None = None, marker: str | None = None,
                 dataset: str = "image", image_fix: str | None = None):
        self.where, self.fix, self.dataset, self.image_fix = where, fix, dataset, image_fix or fix
        self.zip = None
        self.zip_members: dict[str, zipfile.ZipInfo] = {}     # a zip's files by their clean path
        self.tar_members: dict[str, tuple[int, int]] = {}     # a tar's files: where their bytes start, how many
        self.tar_unread: dict[str, str] = {}     # a tar's links and sparse files: why they are not read, the fix
        if where.is_dir():
            self.kind = "folder"
            files, dirs = _folder_listing(where)
        elif not where.exists():
            raise SourceError(f"{where} does not exist. {fix}")
        elif where.name.lower().endswith(TAR_SUFFIXES) or not where.name.lower().endswith(".zip") \
                and not zipfile.is_zipfile(where) and _is_tar(where):
            self.kind = "tar"
            files, dirs = self._list_tar()
        else:
            self.kind = "zip"
            files, dirs = self._list_zip()
        self.prefix = _top_folder(files + dirs, top, marker, where)
        self.names = {n[len(self.prefix):] for n in files if n.startswith(self.prefix)}
        self.dirs = {d[len(self.prefix):] for d in dirs if d.startswith(self.prefix) and len(d) > len(self.prefix)}
        for n in self.names:     # the folders that hold files, where an archive lists no entry of their own
            parts = n.split("/")[:-1]
            self.dirs.update("/".join(parts[:k]) for k in range(1, len(parts) + 1))

    @property
    def archive(self) -> bool:
        return self.kind != "folder"

    def _list_zip(self) -> tuple[list[str], list[str]]:
        """The zip's files and folders by their clean paths; each file's entry kept to read it by."""
        try:
            self.zip = zipfile.ZipFile(self.where)
        except (zipfile.BadZipFile, OSError) as exc:
            what = "not a zip archive" if self.where.name.lower().endswith(".zip") else \
                "neither a folder nor a zip or tar archive"
            raise SourceError(f"{self.where} is {what} ({exc}): it is truncated, damaged or another kind of file. "
                              f"{self.fix}") from exc
        files, dirs = [], []
        for info in self.zip.infolist():
            name = _clean(info.filename)
            if not name:
                continue
            if info.is_dir():
                dirs.append(name.rstrip("/"))
            else:
                files.append(name)
                self.zip_members[name] = info
        return files, dirs

    def _list_tar(self) -> tuple[list[str], list[str]]:
        """Every member of the tar, in one pass that keeps no file's bytes: where each file's bytes are, to read
        them when they are wanted (links and sparse files named, to refuse when read)."""
        files, dirs = [], []
        try:
            with tarfile.open(self.where, "r:*") as tar:
                for member in tar:
                    name = _clean(member.name)
                    if member.isdir():
                        dirs.append(name.rstrip("/"))
                    elif member.isfile() or member.issym() or member.islnk():
                        files.append(name)
                        self.tar_members.pop(name, None)     # a member stored again: its last copy counts
                        self.tar_unread.pop(name, None)
                        if member.issparse():
                            self.tar_unread[name] = ("stored as a sparse file inside the archive, which is not "
                                                     "read. Fix: archive the files without --sparse.")
                        elif member.isfile():
                            self.tar_members[name] = (member.offset_data, member.size)
                        elif member.issym():
                            self.tar_unread[name] = ("a symbolic link inside the archive, which is not read. Fix: "
                                                     "archive the files themselves (tar --dereference).")
                        else:        # GNU tar stores a file's second name as a hard link, even with --dereference
                            self.tar_unread[name] = ("a hard link inside the archive, which is not read. Fix: "
                                                     "archive each name as a file of its own (tar --hard-dereference).")
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

    def _readable(self, name: str) -> str:
        """The stored path of file `name`, which must be there and, in a tar, neither a link nor sparse."""
        path = self.prefix + name
        if name not in self.names:
            raise SourceError(f"{self.where} has no {path}: it is not a complete {self.dataset} archive. {self.fix}")
        if path in self.tar_unread:
            raise SourceError(f"{self.where}: {path} is {self.tar_unread[path]}")
        return path

    def _unreadable(self, path: str, exc: Exception) -> SourceError:
        if self.archive:
            return SourceError(f"{self.where}: {path} cannot be read ({type(exc).__name__}: {exc}): the archive is "
                               f"corrupt. Delete {self.where} and supply a fresh copy. {self.fix}")
        return SourceError(f"{self.where}: {path} cannot be read ({type(exc).__name__}: {exc}): the folder is "
                           f"damaged or unreadable. Replace the file, or check the disk and the permissions. {self.fix}")

    def read(self, name: str) -> bytes:
        """The bytes of file `name` (a path below the top folder); in a tar, its stream read up to them."""
        path = self._readable(name)
        if self.kind == "tar":
            with contextlib.closing(self._tar_contents([name])) as found:    # closes the tar once it is read
                return next(found)[1]
        try:
            if self.zip is not None:
                return self.zip.read(self.zip_members[path])
            return (self.where / path).read_bytes()
        except READ_ERRORS as exc:
            raise self._unreadable(path, exc) from exc

    def _contents(self, names: list[str]) -> Iterable[tuple[str, bytes]]:
        """(name, bytes) of each of the files `names`: in their order, or a tar's in the archive's (one pass)."""
        if self.kind == "tar":
            for name in names:
                self._readable(name)
            return self._tar_contents(names)
        return ((name, self.read(name)) for name in names)

    def _tar_contents(self, names: list[str]) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) of the tar's files `names`, in the archive's order, in one pass through its decompressed
        stream that neither reads another file's bytes nor parses a header again (a file stored twice: the last
        copy, as tar extracts it)."""
        places = sorted((self.tar_members[self.prefix + name], name) for name in names)
        path = self.prefix + places[0][1]
        try:
            with tarfile.open(self.where, "r:*") as tar:
                stream = tar.fileobj      # the decompressed archive, read forward only
                for (start, size), name in places:
                    path = self.prefix + name
                    stream.seek(start)
                    data = stream.read(size)
                    if len(data) != size:
                        raise EOFError(f"{size - len(data):,} of its {size:,} bytes are missing")
                    yield name, data
        except READ_ERRORS as exc:
            raise self._unreadable(path, exc) from exc

    def decode_one(self, name: str, mode: str = "RGB", size: tuple[int, int] | None = None) -> torch.Tensor:
        """Image `name` as uint8 (C, H, W) in PIL mode `mode` (decode_bytes)."""
        return self.decode_bytes(name, self.read(name), mode, size)

    def decode_bytes(self, name: str, data: bytes, mode: str = "RGB",
                     size: tuple[int, int] | None = None) -> torch.Tensor:
        """The bytes `data` of image `name` as uint8 (C, H, W) in PIL mode `mode` (RGB: grey-scale, palette, CMYK
        and RGBA images are converted as PIL converts them, an alpha channel dropped; L: grey-scale), 8 bits per
        channel (_eight_bit), resized to `size` (width, height) with PIL's bilinear filter (antialiased when it
        shrinks) where given and different."""
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()      # a damaged file fails here, not as a conversion
                img = _in_mode(img, mode)
                if size is not None and img.size != size:
                    img = img.resize(size, Image.BILINEAR)
                pixels = np.array(img)   # a writable copy
        except _Unconvertible as exc:
            raise SourceError(f"{self.where}: {self.prefix}{name} is {exc}. {CONVERT_FIX}") from exc
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:   # damaged or foreign
            raise SourceError(f"{self.where}: {self.prefix}{name} is not a readable image ({exc}). "
                              f"{self.image_fix}") from exc
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def decode(self, names: list[str], mismatch: Callable[[str, tuple, tuple], str], mode: str = "RGB",
               size: tuple[int, int] | None = None, shape: tuple[int, int, int] | None = None,
               what: str = "images") -> torch.Tensor:
        """Decode every image into one preallocated uint8 (N, C, H, W) tensor (a data-preparation step, run once),
        image i at row i whatever order the files are read in. Each image must have `shape` (C, H, W) where given,
        else the first's; `mismatch(name, its shape, the shape)` says why not. `size`: resize to it (decode_bytes).
        Progress lines name `what`."""
        shape = tuple(shape or self.decode_one(names[0], mode, size).shape)
        rows: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            rows.setdefault(name, []).append(i)
        out = torch.empty((len(names), *shape), dtype=torch.uint8)
        progress = _Progress(self.where, len(rows), what)
        for done, (name, data) in enumerate(self._contents(list(rows)), 1):
            img = self.decode_bytes(name, data, mode, size)
            if tuple(img.shape) != shape:
                raise SourceError(mismatch(name, tuple(img.shape), shape))
            for i in rows[name]:     # one row at a time: indexing by a list copies the whole tensor
                out[i] = img
            progress(done)
        return out


def _eight_bit(img: Image.Image) -> Image.Image:
    """`img` with 8 bits per channel. 16-bit grey keeps the high byte of each value, as PIL makes 16-bit colour
    8-bit (PIL's own conversion clips it at 255: near-white); a palette with transparency becomes RGBA (whose
    alpha is then dropped, without PIL's warning about it). 32-bit integer and floating-point images are refused:
    their values have no fixed range to scale from."""
    if img.mode in SIXTEEN_BIT_MODES or img.mode == "I" and img.format in SIXTEEN_BIT_AS_I:
        return Image.fromarray((np.asarray(img) >> 8).astype(np.uint8))
    if img.mode in ("I", "F"):
        kind = "integer" if img.mode == "I" else "floating-point"
        raise _Unconvertible(f"a 32-bit {kind} image (PIL mode {img.mode}), whose values have no fixed range to "
                             "scale to 8 bits")
    if img.mode == "P" and "transparency" in img.info:
        return img.convert("RGBA")
    return img


def _in_mode(img: Image.Image, mode: str) -> Image.Image:
    """`img` 8-bit (_eight_bit) in PIL mode `mode`."""
    img = _eight_bit(img)
    if img.mode == mode:
        return img
    try:
        return img.convert(mode)
    except ValueError as exc:       # a mode PIL does not convert (La, LAB to L, ...)
        raise _Unconvertible(f"a PIL mode {img.mode} image, which PIL does not convert to {mode} ({exc})") from exc


def _folder_listing(root: Path) -> tuple[list[str], list[str]]:
    """The files and folders below `root` (paths relative to it), following symbolic links as torchvision's
    ImageFolder does; hidden ones skipped. A link to nowhere, or to a folder that holds it (a loop that would
    never end), is refused in one line."""
    files, dirs = [], []
    pending = [("", frozenset({_identity(root)}))]      # a folder to list, and the folders that hold it
    while pending:
        rel, holders = pending.pop()
        for entry in _entries(root, rel):
            name = rel + entry.name
            if hidden(entry.name):
                continue
            if entry.is_dir():
                identity = _identity(entry.path)
                if identity in holders:
                    raise SourceError(f"{root}: {name} is a symbolic link to {_target(entry)}, a folder that holds "
                                      "it, so following it would never end (a loop). Fix: point the link at the "
                                      "folder it stands for, or remove it.")
                dirs.append(name)
                pending.append((name + "/", holders | {identity}))
            elif entry.is_file():
                files.append(name)
            elif entry.is_symlink():
                raise SourceError(f"{root}: {name} is a symbolic link to {_target(entry)}, which does not exist or "
                                  "cannot be reached. Fix: point the link at the folder or file it stands for, or "
                                  "remove it.")
    return files, dirs


def _entries(root: Path, rel: str) -> list[os.DirEntry]:
    try:
        with os.scandir(root / rel) as entries:
            return list(entries)
    except OSError as exc:
        raise SourceError(f"{root}: {rel or '.'} cannot be listed ({type(exc).__name__}: {exc}). Fix: check the "
                          "folder's permissions and the disk.") from exc


def _identity(path) -> tuple[int, int]:
    """What a folder is, whatever path (or link) leads to it."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _target(entry: os.DirEntry) -> str:
    return os.readlink(entry.path) if entry.is_symlink() else os.path.realpath(entry.path)


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
