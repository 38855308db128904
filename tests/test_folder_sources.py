"""The image-folder source (gcl.data.folder_sources): class folders read from a folder, a zip or a tar, its
settings, its one-line errors on bad input, a source's `kind`, and `like` for the tools; and the real CIFAR-10 JPEG
copy where this machine has it (GCL_CIFAR10_JPEG)."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from gcl.config import ParamsError, check_data, resolve_source, source_kind
from gcl.core.settings import ParamsError as SettingsError
from gcl.data import folder_sources, image_files, random_sources
from gcl.data.folder_sources import channel_stats
from gcl.data.image_sources import NORMALIZATION
from gcl.data.random_sources import SourceShape, shape_name
from gcl.data.sources import SourceError
from image_fixtures import CIFAR10_NAMES, one_line, read_folder, tar_folder, write_image_folder, zip_folder

ROOT = Path(__file__).resolve().parents[1]
# the real copy (not part of the project: a machine that has one says where; the test is skipped elsewhere)
CIFAR10_JPEG = Path(os.environ.get("GCL_CIFAR10_JPEG", "/work/shared/data/cifar10-jpeg/cifar10-jpeg.tar.gz"))
CLASSES = ["dog", "ant", "cat"]     # written unsorted: the labels follow the sorted names


def images(per_class=12, test_per_class=3, size=8, seed=0, classes=CLASSES) -> dict:
    rng = np.random.default_rng(seed)
    make = lambda n: [rng.integers(0, 256, (3, size, size), dtype=np.uint8) for _ in range(n)]
    return {"train": {c: make(per_class) for c in classes}, "test": {c: make(test_per_class) for c in classes}}


def folder(tmp_path, **kw) -> tuple[Path, dict]:
    imgs = images(**kw)
    return write_image_folder(tmp_path / "copy", imgs), imgs


def test_class_folders_become_labels_in_sorted_order_and_images_in_natural_order(tmp_path):
    root, imgs = folder(tmp_path)
    data = read_folder(root)
    order = sorted(CLASSES)
    assert data["classes"] == order == ["ant", "cat", "dog"]
    assert data["train_y"].tolist() == [k for k in range(3) for _ in range(12)]
    # 0.png, 1.png, ..., 10.png, 11.png (names: 10.png sorts before 2.png)
    expected = np.stack([img for c in order for img in imgs["train"][c]])
    assert torch.equal(data["train_x"], torch.from_numpy(expected)) and data["train_x"].dtype == torch.uint8
    assert torch.equal(data["test_x"], torch.from_numpy(np.stack([img for c in order for img in imgs["test"][c]])))
    assert data["test_y"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # mean and std per channel over every training pixel, in [0, 1] units
    pixels = expected.astype(np.float64) / 255
    assert np.allclose(data["mean"], pixels.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(data["std"], pixels.std(axis=(0, 2, 3)), atol=1e-12)
    assert channel_stats(data["train_x"]) == (data["mean"], data["std"])


def test_a_zip_or_a_tar_of_the_folder_reads_the_same_with_or_without_a_top_folder(tmp_path):
    root, _ = folder(tmp_path)
    (root / "README.txt").write_text("a note beside the splits")
    (root / "train" / "ant" / ".DS_Store").write_bytes(b"\0")        # hidden files are skipped
    want = read_folder(root)
    archives = [tar_folder(root, tmp_path / "copy.tar.gz"), zip_folder(root, tmp_path / "top.zip"),
                zip_folder(root, tmp_path / "flat.zip", top=False)]
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:      # ./train/...: a tar made inside the folder
        tar.add(root, arcname=".")
    archives.append(tmp_path / "plain.tar")
    for archive in archives:
        got = read_folder(archive)
        assert got["classes"] == want["classes"], archive
        for key in ("train_x", "train_y", "test_x", "test_y"):
            assert torch.equal(got[key], want[key]), (archive, key)


def test_the_classes_setting_orders_the_labels_and_must_name_the_folders(tmp_path):
    root, imgs = folder(tmp_path)
    data = read_folder(root, classes=CLASSES)
    assert data["classes"] == CLASSES and torch.equal(data["train_x"][:12], torch.from_numpy(np.stack(imgs["train"]["dog"])))
    with pytest.raises(SourceError) as e:
        read_folder(root, classes=["dog", "ant", "bee"])
    assert re.search(r"`classes` names bee, which .*copy has no folder for and leaves out its class folders cat\. "
                     r"Fix: list exactly the class folders of train/", one_line(e))


def test_given_mean_and_std_are_recorded_and_checked():
    assert resolve_source({"sources": {"f": {"kind": "image-folder", "path": "x", "mean": [0.5] * 3,
                                             "std": [0.25] * 3}}}, "f").std == [0.25] * 3
    for bad, message in [({"mean": [0.5] * 3}, "give mean and std together"),
                         ({"mean": [0.5] * 2, "std": [0.2] * 2}, "mean needs 3 values"),
                         ({"mean": [0.5] * 3, "std": [0.0] * 3}, r"std in \(0, 1\]"),
                         ({"like": "mnist"}, "mnist has 1 channel"),
                         ({"like": "cifar10", "image_size": 64}, "image_size 64 is not cifar10's 32x32"),
                         ({"like": "cifar11"}, "sources.f.like"),
                         ({"image_size": 0}, "sources.f.image_size"),
                         ({"classes": ["a", "a"]}, "repeats a class")]:
        with pytest.raises(SettingsError, match=message):
            resolve_source({"sources": {"f": {"kind": "image-folder", "path": "x", **bad}}}, "f")


def test_given_statistics_replace_the_computed_ones(tmp_path):
    root, _ = folder(tmp_path)
    data = read_folder(root, mean=[0.4914, 0.4822, 0.4465], std=[0.2470, 0.2435, 0.2615])
    assert (tuple(data["mean"]), tuple(data["std"])) == NORMALIZATION["cifar10"]


def test_a_source_names_its_reader_with_kind_and_several_folders_can_be_sources():
    params = {"seeds": [0], "benchmarks": {}, "methods": {}, "runs": {},
              "sources": {"mnist-bundled": {}, "copy-a": {"kind": "image-folder", "path": "/data/a"},
                          "copy-b": {"kind": "image-folder", "path": "/data/b.zip", "like": "cifar10"},
                          "c10": {"kind": "cifar10", "download": False}}}
    resolved = check_data(params)["sources"]
    assert resolved["mnist-bundled"]["kind"] == "mnist-bundled" and resolved["c10"]["kind"] == "cifar10"
    assert resolved["copy-a"]["kind"] == resolved["copy-b"]["kind"] == "image-folder"
    assert resolved["copy-b"]["like"] == "cifar10" and source_kind(params, "c10") == "cifar10"
    params["sources"]["copy-a"]["kind"] = "imagefolder"
    with pytest.raises(ParamsError) as e:
        check_data(params)
    assert one_line(e).startswith("sources.copy-a.kind: unknown source kind 'imagefolder'; known kinds: [")
    assert "'image-folder'" in str(e.value) and "'mnist-bundled'" in str(e.value)
    del params["sources"]["copy-a"]["kind"]
    with pytest.raises(ParamsError, match=r"sources\.copy-a: unknown data source; known sources: .*`kind:`"):
        check_data(params)
    params["sources"]["copy-a"] = {"kind": "cifar10", "path": "/data/a"}     # the settings are the kind's
    with pytest.raises(ParamsError, match=r"sources\.copy-a"):
        check_data(params)


def test_like_gives_the_tools_the_folders_shape_and_without_it_they_say_to_set_it():
    params = {"sources": {"mine": {"kind": "image-folder", "path": "x", "like": "cifar10"},
                          "bare": {"kind": "image-folder", "path": "x"}, "c10": {"kind": "cifar10"}, "cifar100": {}}}
    assert shape_name(params, "mine") == "cifar10" and random_sources.shape_of(params, "mine").image == (3, 32, 32)
    assert shape_name(params, "c10") == "cifar10" and shape_name(params, "cifar100") == "cifar100"
    with pytest.raises(SystemExit, match=r"source 'bare' is an image folder of no known shape: set "
                                         r"sources\.bare\.like to the published dataset"):
        shape_name(params, "bare")


def test_like_checks_the_class_count_images_per_class_and_image_size(tmp_path, monkeypatch):
    root, _ = folder(tmp_path)
    with pytest.raises(SourceError) as e:
        read_folder(root, like="cifar10")
    assert re.search(r"copy is not shaped like cifar10 \(the source's `like`\): 3 classes, not 10\. Fix: point "
                     r"`path` at a complete copy of cifar10", one_line(e))
    monkeypatch.setitem(folder_sources.LIKE_CLASSES, "cifar10", tuple(sorted(CLASSES)))
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "cifar10", SourceShape(3, 12, (3, 3, 2), (3, 32, 32),
                                                                               NORMALIZATION["cifar10"]))
    with pytest.raises(SourceError) as e:          # the counts: checked before any image is decoded
        read_folder(root, like="cifar10")
    assert re.search(r"not shaped like cifar10 \(the source's `like`\): test/dog/ holds 3 images, not 2\. Fix",
                     one_line(e))
    monkeypatch.setitem(random_sources.SOURCE_SHAPES, "cifar10", SourceShape(3, 12, 3, (3, 32, 32),
                                                                               NORMALIZATION["cifar10"]))
    with pytest.raises(SourceError) as e:
        read_folder(root, like="cifar10")
    assert re.search(r"train/ant/0\.png is 8x8 pixels \(width x height\), not cifar10's 32x32 \(the source's `like`\)\. Fix: set "
                     r"image_size: 32 to resize it", one_line(e))
    assert read_folder(root, like="cifar10", image_size=32)["train_x"].shape == (36, 3, 32, 32)


def test_image_size_resizes_with_pil_bilinear_or_refuses_when_resize_is_off(tmp_path):
    root, imgs = folder(tmp_path)
    odd = np.random.default_rng(1).integers(0, 256, (3, 10, 12), dtype=np.uint8)
    Image.fromarray(odd.transpose(1, 2, 0)).save(root / "train" / "cat" / "5.png")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/cat/5\.png is 12x10 pixels \(width x height\), not the 8x8 of the first training "
                     r"image\. Fix: set image_size to resize every image to one size, or replace it\.", one_line(e))
    with pytest.raises(SourceError) as e:
        read_folder(root, image_size=8, resize=False)
    assert re.search(r"train/cat/5\.png is 12x10 pixels \(width x height\), not the 8x8 that image_size sets "
                     r"\(resize is false\)\. Fix: set resize: true", one_line(e))
    data = read_folder(root, image_size=8)
    resized = np.array(Image.fromarray(odd.transpose(1, 2, 0)).resize((8, 8), Image.BILINEAR)).transpose(2, 0, 1)
    assert torch.equal(data["train_x"][12 + 5], torch.from_numpy(resized))
    assert torch.equal(data["train_x"][0], torch.from_numpy(imgs["train"]["ant"][0]))    # 8x8 ones as they are
    assert read_folder(root, image_size=4)["test_x"].shape == (9, 3, 4, 4)


def test_grey_scale_palette_and_rgba_images_are_converted_to_rgb(tmp_path):
    root, _ = folder(tmp_path)
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8)
    rgba = np.random.default_rng(2).integers(0, 256, (8, 8, 4), dtype=np.uint8)
    Image.fromarray(grey, mode="L").save(root / "train" / "ant" / "0.png")
    Image.fromarray(rgba, mode="RGBA").save(root / "train" / "ant" / "1.png")
    Image.fromarray(rgba[:, :, :3]).convert("P").save(root / "train" / "ant" / "2.png")
    data = read_folder(root)
    assert torch.equal(data["train_x"][0], torch.from_numpy(np.stack([grey] * 3)))
    assert torch.equal(data["train_x"][1], torch.from_numpy(rgba[:, :, :3].transpose(2, 0, 1)))   # alpha dropped
    palette = np.array(Image.open(root / "train" / "ant" / "2.png").convert("RGB")).transpose(2, 0, 1)
    assert torch.equal(data["train_x"][2], torch.from_numpy(palette))
    single = read_folder(root, channels=1)
    assert single["train_x"].shape == (36, 1, 8, 8) and torch.equal(single["train_x"][0, 0], torch.from_numpy(grey))
    assert len(single["mean"]) == 1


def test_a_missing_path_or_split_folder_is_named_with_the_fix(tmp_path):
    with pytest.raises(SourceError) as e:
        read_folder(tmp_path / "nowhere.tar.gz")
    assert re.search(r"nowhere\.tar\.gz does not exist\. Fix: point the source's `path` at a folder, or a "
                     r"\.tar/\.tar\.gz/\.tgz/\.zip of one, holding train/<class>/ and test/<class>/ images", one_line(e))
    root, _ = folder(tmp_path)
    for part in (root / "test").rglob("*.png"):
        part.unlink()
    for part in sorted((root / "test").iterdir()):
        part.rmdir()
    (root / "test").rmdir()
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy has no test/ folder \(it holds train/\): an image folder holds train/<class>/ and "
                     r"test/<class>/ images\. Fix: ", one_line(e))
    archive = tar_folder(root, tmp_path / "copy.tgz")
    with pytest.raises(SourceError, match=r"copy\.tgz has no copy/test/ folder \(it holds train/\)"):
        read_folder(archive)


def test_an_empty_class_folder_or_classes_that_differ_between_splits_are_refused(tmp_path):
    root, _ = folder(tmp_path)
    (root / "train" / "emu").mkdir()
    (root / "test" / "emu").mkdir()
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/emu/ holds no images\. Fix: add its images, or remove the class's folder",
                     one_line(e))
    archive = zip_with_folder_entries(root, tmp_path / "empty.zip")    # an empty folder: an entry of its own
    with pytest.raises(SourceError, match=r"empty\.zip: copy/train/emu/ holds no images"):
        read_folder(archive)
    (root / "train" / "emu").rmdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "test" / "emu" / "0.png")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"the class folders of train/ and test/ differ \(only in train/: none; only in test/: emu\)\. "
                     r"Fix: give both the same class folders\.", one_line(e))


def zip_with_folder_entries(root: Path, archive: Path) -> Path:
    """A zip of folder `root` under its name, with an entry for each folder too (as zip tools write them)."""
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(root.rglob("*")):
            z.write(path, path.relative_to(root.parent).as_posix() + ("/" if path.is_dir() else ""))
    return archive


def test_a_file_that_is_not_an_image_or_is_cut_short_is_named(tmp_path):
    root, _ = folder(tmp_path)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/cat/notes\.txt is not an image file \(accepted: \.jpg, \.jpeg, \.png, .*\)\. Fix: "
                     r"remove it from the class folder, or convert it\.", one_line(e))
    (root / "train" / "cat" / "notes.txt").unlink()
    (root / "train" / "dog" / "3.png").write_bytes(b"not a png at all")
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/dog/3\.png is not a readable image \(cannot identify image file .*\)\. Fix: "
                     r"replace the file with an intact copy of the image, or remove it\.$", one_line(e))
    victim = root / "train" / "dog" / "3.png"
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="PNG")
    victim.write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])          # a PNG cut short
    with pytest.raises(SourceError) as e:
        read_folder(root)
    assert re.search(r"copy: train/dog/3\.png is not a readable image \(.*\)\. Fix: ", one_line(e))
    jpeg = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(jpeg, format="JPEG")
    victim.unlink()
    (root / "train" / "dog" / "3.jpg").write_bytes(jpeg.getvalue()[:-40])   # a JPEG cut short
    with pytest.raises(SourceError, match=r"train/dog/3\.jpg is not a readable image \((Truncated File Read|image "
                                          r"file is truncated.*)\)\. Fix: replace the file"):
        read_folder(root)
    (root / "train" / "dog" / "3.jpg").unlink()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "train" / "stray.png")
    with pytest.raises(SourceError, match=r"copy: train/stray\.png is in no class folder\. Fix: move it"):
        read_folder(root)


def test_a_damaged_archive_is_named_with_the_fix(tmp_path):
    root, _ = folder(tmp_path)
    archive = tar_folder(root, tmp_path / "copy.tar.gz")
    data = archive.read_bytes()
    archive.write_bytes(data[:len(data) // 2])
    with pytest.raises(SourceError) as e:
        read_folder(archive)
    assert re.search(r"copy\.tar\.gz cannot be read as a tar archive \(EOFError: .*\): it is truncated or damaged\. "
                     r"Supply a complete copy\. Fix: point the source's `path`", one_line(e))
    archive.write_bytes(b"\x1f\x8b" + data[2:200])      # gzip's magic, then garbage
    with pytest.raises(SourceError, match=r"copy\.tar\.gz cannot be read as a tar archive"):
        read_folder(archive)
    zipped = zip_folder(root, tmp_path / "copy.zip")
    whole = zipped.read_bytes()
    zipped.write_bytes(whole[:len(whole) - 100])                 # its central directory cut off
    with pytest.raises(SourceError) as e:
        read_folder(zipped)
    assert re.search(r"copy\.zip is not a zip archive \(.*\): it is truncated, damaged or another kind of file\. Fix:",
                     one_line(e))
    other = tmp_path / "copy.bin"
    other.write_bytes(b"neither")
    with pytest.raises(SourceError, match=r"copy\.bin is neither a folder nor a zip or tar archive"):
        read_folder(other)
    zipped.write_bytes(whole)                                       # a bad CRC in one member
    from test_image_sources import _flip_member_byte
    _flip_member_byte(zipped, "copy/train/cat/4.png")
    with pytest.raises(SourceError, match=r"copy\.zip: copy/train/cat/4\.png cannot be read \((BadZipFile|error): .*\): "
                                          r"the archive is corrupt\. Delete .* and supply a fresh copy"):
        read_folder(zipped)


def test_a_long_decode_reports_its_progress(tmp_path, monkeypatch, capsys):
    root, _ = folder(tmp_path, per_class=10)
    monkeypatch.setattr(image_files, "PROGRESS_IMAGES", 20)
    read_folder(root)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("copy: 3 of 30 train images decoded (10%, ") and len(lines) == 10
    assert lines[-1].startswith("copy: 30 of 30 train images decoded (100%")   # the 9 test images: too few to report


@pytest.mark.slow
def test_a_failed_prepare_stage_prints_one_line_and_leaves_no_data_file(tmp_path):
    """prepare@ of a folder with a damaged image, through the stage launcher as dvc.yaml runs it: one line
    `error: ...`, a non-zero status, and nothing under data/raw/<source>/ (the file is written only when complete)."""
    root, _ = folder(tmp_path)
    (root / "test" / "dog" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n cut")
    project = tmp_path / "project"
    project.mkdir()
    params = {"seeds": [0], "sources": {"mine": {"kind": "image-folder", "path": str(root)}},
              "benchmarks": {"seq": {"kind": "sequential", "source": "mine", "backbone": "resnet18", "epochs": 1,
                                     "n_tasks": 3, "classes_per_task": 1}},
              "methods": {}, "runs": {}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "GCL_WARM": "0"}
    stage = lambda *args: subprocess.run([sys.executable, "-m", "gcl.warm", *args], cwd=project, env=env,
                                         capture_output=True, text=True)
    assert stage(str(ROOT / "stages" / "check.py"), "data").returncode == 0
    done = stage(str(ROOT / "stages" / "prepare.py"), "mine")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert re.match(r"error: .*copy: test/dog/2\.png is not a readable image \(.*\)\. Fix: replace", done.stderr)
    assert not (project / "data" / "raw" / "mine" / "data.pt").exists()
    assert not (project / "data").exists() or not [p for p in (project / "data").rglob("*") if p.is_file()]
    (root / "test" / "dog" / "2.png").unlink()            # mended: the stage writes the source
    done = stage(str(ROOT / "stages" / "prepare.py"), "mine")
    assert done.returncode == 0, done.stderr
    assert torch.load(project / "data" / "raw" / "mine" / "data.pt", weights_only=True)["test_y"].tolist() == \
        [0, 0, 0, 1, 1, 1, 2, 2]


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR10_JPEG.is_file(), reason=f"no CIFAR-10 JPEG copy at {CIFAR10_JPEG} (GCL_CIFAR10_JPEG)")
def test_the_cifar10_jpeg_copy_reads_as_cifar10(capsys):
    """The real archive (all 60,000 CIFAR-10 images as JPEG q75 in class folders; GCL_CIFAR10_JPEG names it) through
    the folder reader: CIFAR-10's classes in its label order (batches.meta's label_names, which the cifar10 source
    reads), 5,000 / 1,000 images per class, and the computed normalisation within 0.01 of CIFAR-10's published one
    (the re-encoding moves it by less than 0.002). About 25 s on the 2-core development machine."""
    started = time.perf_counter()
    data = read_folder(CIFAR10_JPEG, like="cifar10")
    seconds = time.perf_counter() - started
    assert data["classes"] == CIFAR10_NAMES
    assert data["train_x"].shape == (50000, 3, 32, 32) and data["test_x"].shape == (10000, 3, 32, 32)
    assert torch.bincount(data["train_y"]).tolist() == [5000] * 10
    assert torch.bincount(data["test_y"]).tolist() == [1000] * 10
    mean, std = NORMALIZATION["cifar10"]
    assert np.allclose(data["mean"], mean, atol=0.01) and np.allclose(data["std"], std, atol=0.01)
    assert "50,000 of 50,000 train images decoded (100%" in capsys.readouterr().err
    print(f"decoded {CIFAR10_JPEG.name} in {seconds:.1f} s")
