"""Tiny copies of the image datasets in their exact on-disk formats, for offline tests.

CIFAR: the python pickles torchvision reads (CIFAR-10: data_batch_1..5, test_batch, batches.meta in
cifar-10-batches-py/; CIFAR-100: train, test, meta in cifar-100-python/), each a dict with a
(N, 3072) uint8 `data` array (R, G, B planes, row-major), and the .tar.gz that holds the folder.
Tiny ImageNet: tiny-imagenet-200/ with wnids.txt, words.txt, train/<wnid>/images/<wnid>_<i>.JPEG,
train/<wnid>/<wnid>_boxes.txt, val/images/val_<i>.JPEG, val/val_annotations.txt, test/images (a zip of the
fixture's 3 classes; or, for the real classes, an extracted folder, and the same images as an image folder).
An image folder: <split>/<class>/<i>.png, and its zip or .tar.gz.
Also a small labelled source dict (what any source writes) for benchmark-level tests.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import pickle
import struct
import tarfile
import threading
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from torchvision.datasets import CIFAR10, CIFAR100

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def md5(path: Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def class_images(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """(N, 3, size, size) uint8 noise with a bright patch whose place encodes the class (learnable)."""
    x = rng.integers(0, 80, (len(labels), 3, size, size), dtype=np.uint8)
    for i, c in enumerate(labels):
        r, col = 4 * (c // 4) + 2, 6 * (c % 4) + 2
        x[i, c % 3, r:r + 8, col:col + 8] = 255
    return x


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _cifar_split(classes: int, train_per_class: int, test_per_class: int, seed: int) -> dict:
    """Class-mixed labels and 32x32 images of a CIFAR-like train and test split."""
    rng = np.random.default_rng(seed)
    train_y = rng.permutation(np.repeat(np.arange(classes), train_per_class))
    test_y = rng.permutation(np.repeat(np.arange(classes), test_per_class))
    return {"train_x": class_images(train_y, 32, rng), "train_y": train_y,
            "test_x": class_images(test_y, 32, rng), "test_y": test_y}


def write_cifar10(root: Path, train_per_class: int = 10, test_per_class: int = 4, seed: int = 0,
                  split: dict | None = None) -> dict:
    """cifar-10-batches-py/ under `root`; the training images spread over the five batches, in class-mixed order
    (`split`: these images and labels instead, {train_x, train_y, test_x, test_y} as numpy arrays)."""
    folder = root / CIFAR10.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    split = split if split is not None else _cifar_split(10, train_per_class, test_per_class, seed)
    train_x, train_y, test_x, test_y = split["train_x"], split["train_y"], split["test_x"], split["test_y"]
    for b, part in enumerate(np.array_split(np.arange(len(train_y)), 5)):
        _pickle(folder / f"data_batch_{b + 1}", {"batch_label": f"training batch {b + 1} of 5",
                                                 "labels": train_y[part].tolist(),
                                                 "data": train_x[part].reshape(len(part), -1),
                                                 "filenames": [f"img_{i}.png" for i in part]})
    _pickle(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": test_y.tolist(),
                                    "data": test_x.reshape(len(test_y), -1),
                                    "filenames": [f"test_{i}.png" for i in range(len(test_y))]})
    _pickle(folder / "batches.meta", {"num_cases_per_batch": 10000, "label_names": CIFAR10_NAMES, "num_vis": 3072})
    return split


def write_cifar100(root: Path, train_per_class: int = 2, test_per_class: int = 1, seed: int = 0) -> dict:
    folder = root / CIFAR100.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    split = _cifar_split(100, train_per_class, test_per_class, seed)
    train_x, train_y, test_x, test_y = split["train_x"], split["train_y"], split["test_x"], split["test_y"]
    for name, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        _pickle(folder / name, {"filenames": [f"{name}_{i}.png" for i in range(len(y))], "batch_label": name,
                                "fine_labels": y.tolist(), "coarse_labels": (y // 5).tolist(),
                                "data": x.reshape(len(y), -1)})
    _pickle(folder / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                              "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    return split


def cifar_checksums(monkeypatch, cls, folder: Path, archive: Path | None = None) -> None:
    """Make torchvision's class expect the fixture's MD5s (the real ones are of the real files)."""
    monkeypatch.setattr(cls, "train_list", [[n, md5(folder / n)] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, md5(folder / n)] for n, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(folder / cls.meta["filename"])})
    if archive is not None:
        monkeypatch.setattr(cls, "tgz_md5", md5(archive))


def tar_folder(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


def write_image_folder(root: Path, images: dict, suffix: str = ".png") -> Path:
    """An image folder (torchvision ImageFolder's layout) under `root`: images {split: {class: [(C, H, W) uint8 arrays]}}
    as root/<split>/<class>/<i>.png, i numbered from 0 without padding (so that natural order differs from name
    order past 9); one channel is written as a grey-scale image. PNG keeps every pixel exact."""
    for split, classes in images.items():
        for name, arrays in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i, img in enumerate(arrays):
                pil = Image.fromarray(img[0]) if img.shape[0] == 1 else Image.fromarray(img.transpose(1, 2, 0))
                pil.save(root / split / name / f"{i}{suffix}")
    return root


def zip_folder(folder: Path, archive: Path, top: bool = True, lead: str = "") -> Path:
    """A zip of `folder`'s files, under a top folder of its name (`top`) or at the zip's root, each member's name
    starting with `lead` (`./` or `/`, as some archivers write them; ZipFile.write would drop it)."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                rel = path.relative_to(folder.parent if top else folder).as_posix()
                z.writestr(zipfile.ZipInfo(lead + rel, date_time=(2020, 1, 1, 0, 0, 0)), path.read_bytes(),
                           compress_type=zipfile.ZIP_DEFLATED)
    return archive


def png16(pixels: np.ndarray) -> bytes:
    """A 16-bit PNG written byte by byte (PIL writes 16-bit grey only): `pixels` uint16 (H, W) grey, (H, W, 2) grey
    and alpha, (H, W, 3) RGB or (H, W, 4) RGBA; big-endian samples, filter 0 on every row, as the PNG spec lays them."""
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    colour_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]      # grey, grey and alpha, RGB, RGBA
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def pgm16(pixels: np.ndarray, maxval: int = 65535) -> bytes:
    """A binary 16-bit PGM (P5): uint16 (H, W) values up to `maxval`, big-endian."""
    height, width = pixels.shape
    return f"P5\n{width} {height}\n{maxval}\n".encode() + pixels.astype(">u2").tobytes()


WNIDS = ["n02124075", "n01443537", "n09256479"]   # deliberately not sorted: wnids.txt sets the order


def _jpeg(img: np.ndarray) -> bytes:
    """(C, H, W) uint8 -> JPEG bytes; one channel is written as a grey-scale JPEG."""
    buf = io.BytesIO()
    pil = Image.fromarray(img[0]) if img.shape[0] == 1 else Image.fromarray(img.transpose(1, 2, 0))
    pil.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_tinyimagenet_zip(path: Path, train_per_class: int = 12, val_per_class: int = 2, size: int = 64) -> dict:
    """A tiny-imagenet-200.zip with flat-coloured images (JPEG keeps flat colours nearly exact): class k's
    image i has the colour (40 k + 20, 10 i, 200) and one grey-scale JPEG is among them, as in the real set."""
    colour = lambda k, i: np.array([40 * k + 20, 10 * i, 200], dtype=np.uint8)
    flat = lambda c: np.broadcast_to(c[:, None, None], (3, size, size)).copy()
    expected_train, expected_val = [], []
    with zipfile.ZipFile(path, "w") as z:
        top = "tiny-imagenet-200/"
        z.writestr(top + "wnids.txt", "\n".join(WNIDS) + "\n")
        z.writestr(top + "words.txt", "".join(f"{w}\tname{k}, other\n" for k, w in enumerate(WNIDS)))
        for k, w in enumerate(WNIDS):
            # written out of order: 10 before 2 lexically, the loader must use the numbering
            for i in reversed(range(train_per_class)):
                z.writestr(f"{top}train/{w}/images/{w}_{i}.JPEG", _jpeg(flat(colour(k, i))))
            z.writestr(f"{top}train/{w}/{w}_boxes.txt", "")
            expected_train += [colour(k, i) for i in range(train_per_class)]
        lines = []
        for v in range(val_per_class * len(WNIDS)):
            k = (v * 2) % len(WNIDS)
            img = flat(colour(k, 7))
            if v == 0:   # a grey JPEG: must come back as 3 equal channels
                img = img[:1]
            z.writestr(f"{top}val/images/val_{v}.JPEG", _jpeg(img))
            lines.append(f"val_{v}.JPEG\t{WNIDS[k]}\t0\t0\t63\t63")
            expected_val.append((k, img))
        z.writestr(top + "val/val_annotations.txt", "\n".join(lines) + "\n")
        z.writestr(top + "test/images/test_0.JPEG", _jpeg(flat(colour(0, 0))))
    return {"train": expected_train, "val": expected_val}


def write_tinyimagenet_folder(folder: Path, wnids, train_per_class: int = 1, val_per_class: int = 1, size: int = 8,
                              seed: int = 0) -> Path:
    """An extracted tiny-imagenet-200/ folder at `folder` holding the classes `wnids` (its wnids.txt, in that order;
    no words.txt, so the source's class names are the wnids), every image distinct noise as a JPEG, each class's
    boxes file listing its training images, the validation images numbered class by class in wnids order."""
    rng = np.random.default_rng(seed)
    noise = lambda: _jpeg(rng.integers(0, 256, (3, size, size), dtype=np.uint8))
    (folder / "val" / "images").mkdir(parents=True, exist_ok=True)
    (folder / "wnids.txt").write_text("".join(f"{w}\n" for w in wnids))
    lines = []
    for k, w in enumerate(wnids):
        (folder / "train" / w / "images").mkdir(parents=True, exist_ok=True)
        for i in range(train_per_class):
            (folder / "train" / w / "images" / f"{w}_{i}.JPEG").write_bytes(noise())
        (folder / "train" / w / f"{w}_boxes.txt").write_text(
            "".join(f"{w}_{i}.JPEG\t0\t0\t{size - 1}\t{size - 1}\n" for i in range(train_per_class)))
        for j in range(val_per_class):
            name = f"val_{k * val_per_class + j}.JPEG"
            (folder / "val" / "images" / name).write_bytes(noise())
            lines.append(f"{name}\t{w}\t0\t0\t{size - 1}\t{size - 1}\n")
    (folder / "val" / "val_annotations.txt").write_text("".join(lines))
    return folder


def tinyimagenet_as_image_folder(tiny: Path, out: Path) -> Path:
    """The images of an extracted Tiny ImageNet folder laid out as an image folder at `out` (the same files):
    train/<wnid>/<wnid>_<i>.JPEG, and the validation images, by their val_annotations.txt lines, as test/<wnid>/."""
    for images in sorted((tiny / "train").glob("*/images")):
        (out / "train" / images.parent.name).mkdir(parents=True)
        for image in images.iterdir():
            (out / "train" / images.parent.name / image.name).write_bytes(image.read_bytes())
    for line in (tiny / "val" / "val_annotations.txt").read_text().splitlines():
        name, wnid = line.split("\t")[:2]
        (out / "test" / wnid).mkdir(parents=True, exist_ok=True)
        (out / "test" / wnid / name).write_bytes((tiny / "val" / "images" / name).read_bytes())
    return out


@contextlib.contextmanager
def serve_folder(folder: Path):
    """A local HTTP server for `folder` (offline stand-in for a mirror); yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def labelled_source(per_class=12, test_per_class=3, classes=10, channels=1, size=8, stats=False):
    """A source dict shaped as sources.py writes it, class-mixed order; pixel (0, 0, 0) = class, (0, 0, 1) = index."""
    rng = np.random.default_rng(0)

    def make(n):
        y = torch.from_numpy(rng.permutation(np.repeat(np.arange(classes), n)))
        x = torch.zeros((len(y), channels, size, size), dtype=torch.uint8)
        x[:, 0, 0, 0] = y.to(torch.uint8)
        x[:, 0, 0, 1] = torch.arange(len(y), dtype=torch.uint8)
        return x, y.long()

    (train_x, train_y), (test_x, test_y) = make(per_class), make(test_per_class)
    out = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
           "classes": [f"c{i}" for i in range(classes)]}
    if stats:
        out.update(mean=[0.5] * channels, std=[0.25] * channels)
    return out


SEQ_BENCHMARK = {"kind": "sequential", "source": "mnist-bundled", "backbone": "mlp", "epochs": 1,
                 "n_tasks": 5, "classes_per_task": 2, "augment": False}


def write_er_params(folder: Path, key: str = "seq-er-50") -> dict:
    """A params.yaml in `folder` with one ER run on a 5-task sequential benchmark named "seq"."""
    params = {"seeds": [0], "device": "cpu", "sources": {"mnist-bundled": {}}, "benchmarks": {"seq": dict(SEQ_BENCHMARK)},
              "methods": {"er": {}},
              "runs": {key: {"benchmark": "seq", "method": "er", "buffer": 50, "lr": 0.1, "batch": 8, "replay_batch": 8}}}
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    return params


def rewrite_zip(src: Path, dst: Path, drop=(), replace=None, compression=zipfile.ZIP_STORED) -> Path:
    """A copy of zip `src` without the members in `drop`, with `replace` {member: bytes}, in `compression`."""
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=compression) as zout:
        for name in zin.namelist():
            if name not in drop:
                zout.writestr(name, replace.get(name, zin.read(name)))
    return dst


def read_folder(path, **settings) -> dict:
    """The image-folder source read from `path` with these settings, as prepare@ reads it."""
    from gcl.data.sources import read_source
    return read_source("image-folder", {"path": str(path), **settings})


def one_line(exc_info) -> str:
    """A raised error's message, which must be a single line."""
    text = str(exc_info.value)
    assert "\n" not in text
    return text
