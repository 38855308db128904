"""The edges of the image-folder reader (gcl.data.image_files, gcl.data.folder_sources): zips whose member names
start with ./ or /, images of other than 8 bits per channel, symbolic links, names that number alike, a tar read
without holding what is not decoded; and, for an ordinary archive, the very pixels and order PIL gives."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gcl.data import folder_sources, random_sources, tinyimagenet_sources
from gcl.data.image_files import ImageFiles, natural
from gcl.data.image_sources import NORMALIZATION
from gcl.data.random_sources import SourceShape
from gcl.data.sources import SourceError, read_source
from gcl.data.tinyimagenet_sources import TINY_WNIDS
from image_fixtures import (
    CIFAR10_NAMES,
    one_line,
    pgm16,
    png16,
    read_folder,
    tar_folder,
    tinyimagenet_as_image_folder,
    write_image_folder,
    write_tinyimagenet_folder,
    zip_folder,
)

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["dog", "ant", "cat"]


def images(per_class=4, test_per_class=2, size=8, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    make = lambda n: [rng.integers(0, 256, (3, size, size), dtype=np.uint8) for _ in range(n)]
    return {"train": {c: make(per_class) for c in CLASSES}, "test": {c: make(test_per_class) for c in CLASSES}}


def same_data(got: dict, want: dict) -> bool:
    return got["classes"] == want["classes"] and all(torch.equal(got[k], want[k])
                                                     for k in ("train_x", "train_y", "test_x", "test_y"))


# --- zips whose names start with ./ or / ---------------------------------------------------------------------

@pytest.mark.parametrize("lead", ["./", "/", "././"])
def test_a_zip_whose_member_names_start_with_dot_slash_or_slash_reads_as_the_folder(tmp_path, lead):
    root = write_image_folder(tmp_path / "copy", images())
    want = read_folder(root)
    for top in (True, False):
        archive = zip_folder(root, tmp_path / f"copy-{top}.zip", top=top, lead=lead)
        assert all(n.startswith(lead) for n in zipfile.ZipFile(archive).namelist())
        assert same_data(read_folder(archive), want), (lead, top)


# --- images of other than 8 bits per channel ----------------------------------------------------------------

def _one_image_folder(tmp_path: Path, name: str, data: bytes) -> Path:
    """An 8x8 RGB folder of classes ant, cat, dog whose train/ant/0<suffix> is replaced by `data` (named `name`)."""
    root = write_image_folder(tmp_path / "copy", images())
    (root / "train" / "ant" / "0.png").unlink()
    (root / "train" / "ant" / name).write_bytes(data)
    return root


def _saved(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


SIXTEEN = np.array([[0, 255, 256, 1000, 32767, 32768, 65280, 65535]] * 8, dtype=np.uint16)   # (8, 8)


@pytest.mark.parametrize("name, data", [
    ("0.png", png16(SIXTEEN)),                                                     # PIL: I;16
    ("0.tif", _saved(Image.fromarray(SIXTEEN), "TIFF")),                           # I;16 (little-endian)
    ("0.tiff", _saved(Image.frombytes("I;16B", (8, 8), SIXTEEN.astype(">u2").tobytes()), "TIFF")),   # I;16B
    ("0.pgm", pgm16(SIXTEEN)),                                                     # PIL: I (format PPM)
], ids=["png-I;16", "tiff-I;16", "tiff-I;16B", "pgm-I"])
def test_16_bit_grey_is_scaled_to_8_bits_by_its_high_byte_not_clipped_to_white(tmp_path, name, data):
    """PIL's convert('RGB') clips 16-bit grey at 255 (1000 -> 255); the reader keeps each value's high byte, as PIL
    itself makes a 16-bit RGB PNG 8-bit."""
    root = _one_image_folder(tmp_path, name, data)
    want = (SIXTEEN >> 8).astype(np.uint8)          # 0, 0, 1, 3, 127, 128, 255, 255
    assert torch.equal(read_folder(root)["train_x"][0], torch.from_numpy(np.stack([want] * 3)))
    assert torch.equal(read_folder(root, channels=1)["train_x"][0, 0], torch.from_numpy(want))


def test_16_bit_colour_grey_with_alpha_and_a_pgm_of_another_maxval_become_8_bit(tmp_path):
    rng = np.random.default_rng(4)
    rgb, la = rng.integers(0, 65536, (8, 8, 3), dtype=np.uint16), rng.integers(0, 65536, (8, 8, 2), dtype=np.uint16)
    root = write_image_folder(tmp_path / "copy", images())
    (root / "train" / "ant" / "0.png").write_bytes(png16(rgb))
    (root / "train" / "ant" / "1.png").write_bytes(png16(la))
    (root / "train" / "ant" / "2.png").unlink()
    grey12 = rng.integers(0, 4096, (8, 8), dtype=np.uint16)
    (root / "train" / "ant" / "2.pgm").write_bytes(pgm16(grey12, maxval=4095))
    x = read_folder(root)["train_x"]
    assert torch.equal(x[0], torch.from_numpy((rgb >> 8).astype(np.uint8).transpose(2, 0, 1)))
    assert torch.equal(x[1], torch.from_numpy(np.stack([(la[:, :, 0] >> 8).astype(np.uint8)] * 3)))   # alpha dropped
    # PIL stretches a 12-bit PGM to 16 bits (v * 65535 / 4095, rounded); its high byte is the 8-bit value
    stretched = np.round(grey12.astype(np.float64) * 65535 / 4095).astype(np.int64)
    assert torch.equal(x[2], torch.from_numpy(np.stack([(stretched >> 8).astype(np.uint8)] * 3)))


def test_one_bit_palette_with_transparency_grey_alpha_and_cmyk_images_convert_as_pil_does(tmp_path):
    rng = np.random.default_rng(5)
    root = write_image_folder(tmp_path / "copy", images())
    ant = root / "train" / "ant"
    bits = rng.integers(0, 2, (8, 8)).astype(bool)
    Image.fromarray(bits).save(ant / "0.png")                                           # mode 1
    palette = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).convert("P", palette=Image.Palette.ADAPTIVE,
                                                                                            colors=16)
    palette.save(ant / "1.png", transparency=bytes([0, 128] + [255] * 14))            # tRNS as bytes
    grey_alpha = rng.integers(0, 256, (8, 8, 2), dtype=np.uint8)
    Image.fromarray(grey_alpha, mode="LA").save(ant / "2.png")
    cmyk = Image.fromarray(rng.integers(0, 256, (8, 8, 4), dtype=np.uint8), mode="CMYK")
    cmyk.save(ant / "3.tif")
    (ant / "3.png").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # PIL warns when it drops a palette's transparency itself
        x = read_folder(root)["train_x"]
    assert torch.equal(x[0], torch.from_numpy(np.stack([bits.astype(np.uint8) * 255] * 3)))
    lut = np.array(Image.open(ant / "1.png").getpalette(), dtype=np.uint8).reshape(-1, 3)
    assert torch.equal(x[1], torch.from_numpy(lut[np.array(Image.open(ant / "1.png"))].transpose(2, 0, 1)))
    assert torch.equal(x[2], torch.from_numpy(np.stack([grey_alpha[:, :, 0]] * 3)))
    assert torch.equal(x[3], torch.from_numpy(np.array(cmyk.convert("RGB")).transpose(2, 0, 1)))


@pytest.mark.parametrize("mode, values, what", [
    ("I", np.arange(64, dtype=np.int32).reshape(8, 8) * 70000, r"a 32-bit integer image \(PIL mode I\)"),
    ("F", np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8), r"a 32-bit floating-point image \(PIL mode F\)"),
], ids=["I", "F"])
def test_32_bit_integer_and_float_images_are_refused_naming_the_file_and_the_fix(tmp_path, mode, values, what):
    root = _one_image_folder(tmp_path, "0.tif", _saved(Image.fromarray(values), "TIFF"))
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(rf"copy: train/ant/0\.tif is {what}, whose values have no fixed range to scale to 8 bits\. "
                     r"Fix: convert it to an 8-bit RGB or grey-scale PNG or JPEG .*, or remove it\.$", one_line(e))


def test_a_mode_pil_cannot_convert_is_refused_naming_it(tmp_path):
    lab = Image.new("LAB", (8, 8), (50, 10, 10))
    root = _one_image_folder(tmp_path, "0.tif", _saved(lab, "TIFF"))
    with pytest.raises(SourceError) as e:
        read_folder(root, channels=1)
    assert re.search(r"copy: train/ant/0\.tif is a PIL mode LAB image, which PIL does not convert to L \(.*\)\. "
                     r"Fix: convert it", one_line(e))


# --- symbolic links -----------------------------------------------------------------------------------------

def test_split_class_and_file_links_are_followed_as_imagefolder_follows_them(tmp_path):
    plain = write_image_folder(tmp_path / "plain", images())
    want = read_folder(plain)
    kept = write_image_folder(tmp_path / "elsewhere", images())      # the same images, stored elsewhere
    root = tmp_path / "copy"
    root.mkdir()
    (root / "train").symlink_to(kept / "train")                       # a split folder that is a link
    (root / "test").mkdir()
    (root / "test" / "ant").symlink_to(kept / "test" / "ant", target_is_directory=True)   # a class folder
    for c in ("cat", "dog"):
        (root / "test" / c).mkdir()
        for f in (kept / "test" / c).iterdir():
            (root / "test" / c / f.name).symlink_to(f)                # files that are links
    assert same_data(read_folder(root), want)
    linked = tmp_path / "linked-copy"
    linked.symlink_to(root)                                           # the path itself a link
    assert same_data(read_folder(linked), want)


def test_a_link_that_makes_a_loop_or_points_nowhere_is_named_in_one_line(tmp_path):
    root = write_image_folder(tmp_path / "copy", images())
    (root / "train" / "ant" / "again").symlink_to(root / "train")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/ant/again is a symbolic link to .*/copy/train, a folder that holds it, so "
                     r"following it would never end \(a loop\)\. Fix: point the link at the folder it stands for, "
                     r"or remove it\.$", one_line(e))
    (root / "train" / "ant" / "again").unlink()
    (root / "train" / "cat" / "9.png").symlink_to(tmp_path / "gone.png")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/cat/9\.png is a symbolic link to .*/gone\.png, which does not exist or cannot be "
                     r"reached\. Fix: point the link at the folder or file it stands for, or remove it\.$", one_line(e))
    (root / "train" / "cat" / "9.png").unlink()
    (root / "train" / "cat" / ".#9.png").symlink_to("user@host.1234")    # an editor's lock: hidden, skipped
    assert read_folder(root)["train_x"].shape == (12, 3, 8, 8)


# --- names that number alike --------------------------------------------------------------------------------

def test_names_that_number_alike_are_ordered_by_the_name_itself():
    names = ["1.png", "01.png", "10.png", "2.png", "001.png", "a01b.png", "a1b.png"]
    assert sorted(names, key=natural) == ["001.png", "01.png", "1.png", "2.png", "10.png", "a01b.png", "a1b.png"]
    assert sorted(reversed(names), key=natural) == sorted(names, key=natural)


ORDER_SCRIPT = """
import json, sys
from gcl.data.sources import read_source
data = read_source("image-folder", {"path": sys.argv[1]})
print(json.dumps(data["train_x"][:, 0, 0, 0].tolist()))
"""


@pytest.mark.slow
def test_the_image_order_is_the_same_in_every_process_whatever_the_hash_seed(tmp_path):
    """Ties in natural order (0001.png, 001.png, 01.png, 1.png) came out in a set's order, which changes with
    PYTHONHASHSEED: each process below lists the folder under another seed."""
    root = tmp_path / "copy"
    stems = ["1", "01", "001", "0001", "2", "02"]
    for split in ("train", "test"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for k, stem in enumerate(stems):
                pixel = np.full((4, 4, 3), 40 * k + (1 if c == "b" else 0), dtype=np.uint8)
                Image.fromarray(pixel).save(root / split / c / f"{stem}.png")
    by_name = [40 * stems.index(s) + b for b in (0, 1) for s in ["0001", "001", "01", "1", "02", "2"]]
    runs = [subprocess.Popen([sys.executable, "-c", ORDER_SCRIPT, str(root)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": seed}, cwd=ROOT)
            for seed in ("0", "1", "2")]          # side by side: each pays torch's import
    orders = []
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err
        orders.append(json.loads(out))
    assert orders == [by_name] * 3


# --- a tar read without holding what it does not decode -----------------------------------------------------

def test_a_tar_holds_in_memory_no_file_it_does_not_decode(tmp_path):
    """A 16 MB file beside the splits (a README, a video, another dataset) was held whole in memory while the tar
    was read; now the archive is listed and its images read in passes that keep only the image being decoded."""
    root = write_image_folder(tmp_path / "copy", images())
    blob = np.random.default_rng(6).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()   # incompressible
    (root / "extras.bin").write_bytes(blob)
    archive = tar_folder(root, tmp_path / "copy.tar.gz")
    (root / "extras.bin").unlink()
    want = read_folder(root)
    tracemalloc.start()
    try:
        got = read_folder(archive)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert same_data(got, want)
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB held while reading a tar with a 16 MiB file that is not an image"


def test_a_tar_member_is_read_alone_and_links_or_missing_files_are_refused(tmp_path):
    root = write_image_folder(tmp_path / "copy", images())
    (root / "notes.txt").write_text("a note")
    archive = tmp_path / "copy.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="copy")
        link = tarfile.TarInfo("copy/train/ant/9.png")
        link.type, link.linkname = tarfile.SYMTYPE, "0.png"
        tar.addfile(link)
    with ImageFiles(archive, "Fix: supply another copy.", marker="train") as files:
        assert files.read("notes.txt") == b"a note"
        assert torch.equal(files.decode_one("train/cat/2.png"), torch.from_numpy(images()["train"]["cat"][2]))
        with pytest.raises(SourceError, match=r"copy\.tar: copy/train/ant/9\.png is a symbolic link inside the "
                                              r"archive, which is not read\. Fix: archive the files themselves "
                                              r"\(tar --dereference\)"):
            files.read("train/ant/9.png")
        with pytest.raises(SourceError, match=r"copy\.tar has no copy/train/ant/99\.png"):
            files.read("train/ant/99.png")



@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar on this machine")
def test_a_hard_link_in_a_tar_is_refused_with_advice_that_works_when_followed(tmp_path):
    """GNU tar stores a file's second name as a hard link, `--dereference` or not; the refusal names the option that
    stores it as a file (`--hard-dereference`), and the archive made by following it reads, both names alike."""
    root = write_image_folder(tmp_path / "copy", images())
    os.link(root / "train/ant/0.png", root / "train/ant/9.png")
    tar = lambda archive, *options: subprocess.run(["tar", *options, "--sort=name", "-cf", str(archive), "copy"],
                                                   cwd=tmp_path, check=True, capture_output=True)
    tar(tmp_path / "linked.tar")
    with ImageFiles(tmp_path / "linked.tar", "Fix: supply another copy.", marker="train") as files:
        with pytest.raises(SourceError) as refused:
            files.read("train/ant/9.png")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'linked.tar'}: copy/train/ant/9.png is a hard link inside the archive, "
                              "which is not read. Fix: "), message
    advice = re.fullmatch(r".*\(tar (--[a-z-]+)\)\.", message)
    assert advice, message
    tar(tmp_path / "followed.tar", advice.group(1))
    with tarfile.open(tmp_path / "followed.tar") as archive:
        assert not any(m.islnk() for m in archive), "the advice still stored a hard link"
    with ImageFiles(tmp_path / "followed.tar", "Fix: supply another copy.", marker="train") as files:
        assert torch.equal(files.decode_one("train/ant/9.png"), files.decode_one("train/ant/0.png"))
        assert torch.equal(files.decode_one("train/ant/9.png"), torch.from_numpy(images()["train"]["ant"][0]))

# --- an ordinary archive: the same pixels and order as before -----------------------------------------------

def test_an_archive_of_8_bit_rgb_jpegs_and_pngs_reads_to_the_pixels_pil_gives_in_natural_order(tmp_path,
                                                                                              monkeypatch):
    """CIFAR-10's layout as a JPEG copy has it (train/<class>/0000.jpg ...; here 12 and 3 per class, some PNG),
    archived in the tar's own (lexical) order: every tensor is PIL's decoding of the file, class by class in sorted
    order, each class's images by their number; so a reader change cannot move a pixel or an image."""
    rng = np.random.default_rng(7)
    root = tmp_path / "cifar10-jpeg"
    expected = {"train": [], "test": []}
    for split, n in (("train", 12), ("test", 3)):
        for c in reversed(CIFAR10_NAMES):
            (root / split / c).mkdir(parents=True)
            for i in reversed(range(n)):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                name = f"{i:04d}.jpg" if i % 3 else f"{i}.png"          # padded JPEGs, unpadded PNGs
                Image.fromarray(pixels).save(root / split / c / name, **({"quality": 75} if i % 3 else {}))
        for k, c in enumerate(CIFAR10_NAMES):
            files = sorted((root / split / c).iterdir(), key=lambda f: int(f.stem))
            expected[split] += [(k, np.array(Image.open(f)).transpose(2, 0, 1)) for f in files]
    archive = tar_folder(root, tmp_path / "cifar10-jpeg.tar.gz")
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "cifar10", SourceShape(10, 12, 3, (3, 32, 32),
                                                                               NORMALIZATION["cifar10"]))
    data = read_folder(archive, like="cifar10")
    assert data["classes"] == CIFAR10_NAMES
    for split in ("train", "test"):
        assert data[f"{split}_y"].tolist() == [k for k, _ in expected[split]]
        assert torch.equal(data[f"{split}_x"], torch.from_numpy(np.stack([x for _, x in expected[split]])))


# --- like: the class names too ------------------------------------------------------------------------------

def _like_folder(tmp_path: Path, classes: list[str], per_class: int = 2) -> Path:
    """A folder of 8x8 images, `per_class` training and 1 test image per class."""
    rng = np.random.default_rng(8)
    make = lambda n: [rng.integers(0, 256, (3, 8, 8), dtype=np.uint8) for _ in range(n)]
    return write_image_folder(tmp_path / "copy", {"train": {c: make(per_class) for c in classes},
                                                  "test": {c: make(1) for c in classes}})


@pytest.fixture
def small_cifar10(monkeypatch):
    """CIFAR-10's shape cut to 2 / 1 images of 8x8 per class (its ten classes kept)."""
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "cifar10", SourceShape(10, 2, 1, (3, 8, 8),
                                                                               NORMALIZATION["cifar10"]))


def test_like_knows_each_datasets_class_names_in_label_order():
    assert set(folder_sources.LIKE_CLASSES) == set(random_sources.SOURCE_SHAPES)
    for like, names in folder_sources.LIKE_CLASSES.items():
        assert len(names) == len(set(names)) == random_sources.SOURCE_SHAPES[like].classes, like
        if like != "tinyimagenet":
            assert list(names) == sorted(names), like   # the order the folders sort in, which their sources give
    assert list(folder_sources.LIKE_CLASSES["cifar10"]) == CIFAR10_NAMES
    wnids = folder_sources.LIKE_CLASSES["tinyimagenet"]
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids) and {"n01443537", "n02124075", "n12267677"} <= set(wnids)
    # the order of the real wnids.txt (mammoth's seq-tinyimg: egyptian_cat, reel, volleyball, ... african_elephant)
    assert wnids[:5] == ("n02124075", "n04067472", "n04540053", "n04099969", "n07749582") and wnids[-1] == "n02504458"


def test_like_cifar10_refuses_class_folders_named_otherwise_naming_them(tmp_path, small_cifar10):
    """Folders named plane, car, ... hold CIFAR-10's counts and size, but sort into other labels (car 1, plane 7):
    the benchmark's task pairs would not be the paper's."""
    names = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    root = _like_folder(tmp_path, names)
    assert read_folder(root)["classes"][:2] == ["bird", "car"]           # without `like`: read as they are
    with pytest.raises(SourceError) as e:
        read_folder(root, like="cifar10")
    assert re.search(r"copy: the class folders car, plane of train/ are not cifar10's classes \(the source's "
                     r"`like`\), which has airplane, automobile instead: the labels would not be cifar10's\. Fix: "
                     r"rename the class folders \(in train/ and test/\) to cifar10's names \(airplane, automobile, "
                     r"bird, cat, deer, dog, frog, horse, ship, truck\), or remove `like` if the copy is not "
                     r"cifar10\.$", one_line(e))
    (root / "train" / "plane").rename(root / "train" / "airplane")
    (root / "test" / "plane").rename(root / "test" / "airplane")
    (root / "train" / "car").rename(root / "train" / "automobile")
    (root / "test" / "car").rename(root / "test" / "automobile")
    assert read_folder(root, like="cifar10")["classes"] == CIFAR10_NAMES


def test_like_refuses_classes_that_number_the_folders_otherwise(tmp_path, small_cifar10):
    root = _like_folder(tmp_path, CIFAR10_NAMES)
    swapped = ["automobile", "airplane", *CIFAR10_NAMES[2:]]
    with pytest.raises(SourceError) as e:
        read_folder(root, like="cifar10", classes=swapped)
    assert re.search(r"the source's `classes` numbers .*copy's classes otherwise than cifar10 does \(label 0 is "
                     r"automobile, where cifar10's is airplane\)\. Fix: remove `classes`", one_line(e))
    assert read_folder(root, like="cifar10", classes=CIFAR10_NAMES)["classes"] == CIFAR10_NAMES


def test_like_names_the_classes_a_copy_lacks(tmp_path, monkeypatch, small_cifar10):
    """A copy cut short by a class is refused at prepare as before, and now the class is named (the folders'
    classes are all the dataset's, so which are missing is known)."""
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "tinyimagenet",
                        SourceShape(200, 1, 1, (3, 8, 8), NORMALIZATION["tinyimagenet"]))
    wnids = folder_sources.LIKE_CLASSES["tinyimagenet"]
    root = _like_folder(tmp_path, [w for w in wnids if w != wnids[7]], per_class=1)
    with pytest.raises(SourceError) as e:
        read_folder(root, like="tinyimagenet")
    assert re.search(rf"copy is not shaped like tinyimagenet \(the source's `like`\): 199 classes, not 200 "
                     rf"\({wnids[7]} missing\)\. Fix: point `path` at a complete copy of tinyimagenet", one_line(e))
    shutil.rmtree(root)
    root = _like_folder(tmp_path, [c for c in CIFAR10_NAMES if c not in ("cat", "ship")])
    with pytest.raises(SourceError) as e:
        read_folder(root, like="cifar10")
    assert re.search(r"not shaped like cifar10 \(the source's `like`\): 8 classes, not 10 \(cat, ship missing\)\. Fix",
                     one_line(e))


def test_like_tinyimagenet_labels_the_images_as_the_tinyimagenet_source_does(tmp_path, monkeypatch):
    """The same images, read by the tinyimagenet source and as an image folder `like: tinyimagenet`, get the same
    labels: wnids.txt's order (n02124075 first), not the wnids sorted (n01443537 first), so the same tasks."""
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "tinyimagenet",
                        SourceShape(200, 2, 1, (3, 8, 8), NORMALIZATION["tinyimagenet"]))
    monkeypatch.setattr(tinyimagenet_sources, "TINY_TRAIN_PER_CLASS", 2)     # the canonical set, cut to 2 + 1
    monkeypatch.setattr(tinyimagenet_sources, "TINY_VAL_PER_CLASS", 1)
    first = ["n02124075", "n04067472", "n04540053"]      # the real wnids.txt's first lines; the rest as recorded
    wnids = [*first, *(w for w in TINY_WNIDS if w not in first)]
    tiny = write_tinyimagenet_folder(tmp_path / "tiny-imagenet-200", wnids, train_per_class=2)
    want = read_source("tinyimagenet", {"archive": str(tiny)}, tmp_path)
    got = read_folder(tinyimagenet_as_image_folder(tiny, tmp_path / "copy"), like="tinyimagenet")
    assert want["classes"] == wnids != sorted(wnids)
    assert same_data(got, want)                          # the same pixels in the same order, with the same labels
    assert got["train_y"][:2].tolist() == [0, 0] and got["classes"][:3] == first


def test_like_tinyimagenet_names_a_folder_that_is_not_one_of_its_wnids(tmp_path, monkeypatch):
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "tinyimagenet",
                        SourceShape(200, 1, 1, (3, 8, 8), NORMALIZATION["tinyimagenet"]))
    wnids = list(folder_sources.LIKE_CLASSES["tinyimagenet"])
    root = _like_folder(tmp_path, [*wnids[:-1], "n99999999"], per_class=1)
    with pytest.raises(SourceError) as e:
        read_folder(root, like="tinyimagenet")
    assert re.search(r"copy: the class folders n99999999 of train/ are not tinyimagenet's classes \(the source's "
                     r"`like`\), which has n02504458 instead: .* Fix: rename the class folders \(in train/ and "
                     r"test/\) to tinyimagenet's names \(n02124075, n04067472, .* and 190 more\)", one_line(e))
    for split in ("train", "test"):
        (root / split / "n99999999").rename(root / split / "n02504458")
    assert read_folder(root, like="tinyimagenet")["classes"] == wnids
