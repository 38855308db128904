"""CIFAR-10, CIFAR-100 (gcl.data.cifar_sources) and Tiny ImageNet (gcl.data.tinyimagenet_sources), run offline on
tiny files in the real on-disk formats."""
from __future__ import annotations

import re
import shutil
import zipfile

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10, CIFAR100

from gcl.data import tinyimagenet_sources
from gcl.data.image_sources import NORMALIZATION
from gcl.data.sources import (
    SOURCES,
    SourceError,
    load_source,
    prepare_source,
    read_source,
)
from gcl.data.tinyimagenet_sources import TINY_MD5, TINY_WNIDS
from image_fixtures import (
    CIFAR10_NAMES,
    WNIDS,
    cifar_checksums,
    md5,
    rewrite_zip,
    serve_folder,
    tar_folder,
    write_cifar10,
    write_cifar100,
    write_tinyimagenet_folder,
    write_tinyimagenet_zip,
)


def test_image_sources_are_registered():
    assert {"cifar10", "cifar100", "tinyimagenet"} <= set(SOURCES)


def test_cifar10_pickles_become_nchw_uint8_in_file_order(tmp_path, monkeypatch):
    truth = write_cifar10(tmp_path)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    out = prepare_source("cifar10", {"download": False, "download_dir": str(tmp_path)}, tmp_path / "raw")
    data = load_source(out)
    assert data["train_x"].dtype == torch.uint8 and data["train_x"].shape == (100, 3, 32, 32)
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))   # batches 1..5 in order, CHW kept
    assert torch.equal(data["train_y"], torch.from_numpy(truth["train_y"]).long())
    assert torch.equal(data["test_x"], torch.from_numpy(truth["test_x"]))
    assert data["classes"] == CIFAR10_NAMES
    assert (tuple(data["mean"]), tuple(data["std"])) == NORMALIZATION["cifar10"]


def test_cifar100_uses_the_fine_labels(tmp_path, monkeypatch):
    truth = write_cifar100(tmp_path)
    cifar_checksums(monkeypatch, CIFAR100, tmp_path / "cifar-100-python")
    data = read_source("cifar100", {"download": False}, tmp_path)
    assert torch.equal(data["train_y"], torch.from_numpy(truth["train_y"]).long())
    assert torch.equal(data["test_x"], torch.from_numpy(truth["test_x"]))
    assert data["classes"][:2] == ["fine0", "fine1"] and len(data["classes"]) == 100


def test_a_file_that_fails_the_real_checksum_is_named(tmp_path):
    write_cifar10(tmp_path)    # tiny files: torchvision's published MD5s cannot match
    with pytest.raises(SourceError, match=r"data_batch_1 does not match its published MD5.*sources\.cifar10\.archive"):
        read_source("cifar10", {"download": False}, tmp_path)


def test_a_missing_file_is_named_with_the_fix(tmp_path, monkeypatch):
    write_cifar10(tmp_path)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(SourceError, match=r"test_batch is missing.*download is false.*cifar-10-python\.tar\.gz"):
        read_source("cifar10", {"download": False}, tmp_path)


def test_cifar_from_a_local_archive_and_from_a_mirror_url(tmp_path, monkeypatch):
    made = tmp_path / "made"
    truth = write_cifar10(made)
    archive = tar_folder(made / "cifar-10-batches-py", tmp_path / "cifar-10-python.tar.gz")
    cifar_checksums(monkeypatch, CIFAR10, made / "cifar-10-batches-py", archive)
    data = read_source("cifar10", {"archive": str(archive)}, tmp_path / "a")
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))
    # a mirror: torchvision's downloader fetches the archive, checks its MD5 and extracts it
    with serve_folder(tmp_path) as mirror:
        data = read_source("cifar10", {"url": f"{mirror}/cifar-10-python.tar.gz"}, tmp_path / "b")
    assert torch.equal(data["test_y"], torch.from_numpy(truth["test_y"]).long())
    assert (tmp_path / "b" / "cifar-10-python.tar.gz").exists()


def test_a_failed_download_says_how_to_supply_the_archive(tmp_path):
    with serve_folder(tmp_path) as mirror, \
            pytest.raises(SourceError, match=r"could not download .*Fix: .*sources\.cifar10\.archive"):
        read_source("cifar10", {"url": f"{mirror}/nowhere.tar.gz"}, tmp_path / "dl")


def test_a_wrong_archive_is_refused(tmp_path):
    bad = tmp_path / "cifar-10-python.tar.gz"
    bad.write_bytes(b"not an archive")
    with pytest.raises(SourceError, match=r"is not the original cifar-10-python\.tar\.gz"):
        read_source("cifar10", {"archive": str(bad)}, tmp_path / "d")


def _tiny(tmp_path):
    archive = tmp_path / "tiny-imagenet-200.zip"
    return archive, write_tinyimagenet_zip(archive)


def test_tinyimagenet_zip_in_wnids_order_with_val_as_test(tmp_path):
    archive, truth = _tiny(tmp_path)
    data = read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)
    assert data["train_x"].shape == (36, 3, 64, 64) and data["test_x"].shape == (6, 3, 64, 64)
    assert data["train_y"].tolist() == [k for k in range(3) for _ in range(12)]      # wnids.txt order
    colours = data["train_x"].float().mean(dim=(2, 3))
    assert torch.allclose(colours, torch.from_numpy(np.stack(truth["train"])).float(), atol=3)  # _0 .. _11 in order
    assert data["test_y"].tolist() == [k for k, _ in truth["val"]]
    grey = data["test_x"][0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert data["classes"] == ["name0", "name1", "name2"]
    assert (tuple(data["mean"]), tuple(data["std"])) == NORMALIZATION["tinyimagenet"]


def test_tinyimagenet_from_an_extracted_folder(tmp_path):
    import zipfile
    archive, _ = _tiny(tmp_path)
    zipfile.ZipFile(archive).extractall(tmp_path / "x")
    from_zip = read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)
    # 3 classes: a folder, which has no checksum, says by `md5` that it is deliberately not the canonical 200
    from_dir = read_source("tinyimagenet", {"archive": str(tmp_path / "x" / "tiny-imagenet-200"), "md5": md5(archive)},
                           tmp_path)
    assert torch.equal(from_zip["train_x"], from_dir["train_x"]) and torch.equal(from_zip["test_y"], from_dir["test_y"])


def test_tinyimagenet_checks_the_canonical_md5_and_explains_the_fix(tmp_path):
    archive, _ = _tiny(tmp_path)
    with pytest.raises(SourceError, match=rf"does not match the MD5 {TINY_MD5}.*248,100,043 bytes"):
        read_source("tinyimagenet", {"archive": str(archive)}, tmp_path)
    with pytest.raises(SourceError, match=r"tiny-imagenet-200\.zip is missing, and sources\.tinyimagenet\.download is false"):
        read_source("tinyimagenet", {"download": False}, tmp_path / "empty")
    with serve_folder(tmp_path) as mirror, \
            pytest.raises(SourceError, match=r"could not download .*sources\.tinyimagenet\.archive"):
        read_source("tinyimagenet", {"url": f"{mirror}/gone.zip"}, tmp_path / "empty")


def test_tinyimagenet_download_from_a_mirror(tmp_path):
    archive, _ = _tiny(tmp_path)
    with serve_folder(tmp_path) as mirror:
        data = read_source("tinyimagenet", {"url": f"{mirror}/{archive.name}", "md5": md5(archive)}, tmp_path / "dl")
    assert (tmp_path / "dl" / "tiny-imagenet-200.zip").exists() and len(data["train_y"]) == 36


def test_tinyimagenet_incomplete_archive_names_the_missing_file(tmp_path):
    import zipfile
    archive = tmp_path / "broken.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "\n".join(WNIDS))
    with pytest.raises(SourceError, match=r"no training images under tiny-imagenet-200/train/n02124075/images/"):
        read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)


# ---------------------------------------------------------------- damaged or partial copies (issue fixes)

CIFARS = [("cifar10", CIFAR10, write_cifar10), ("cifar100", CIFAR100, write_cifar100)]


def _cifar_with_archive(tmp_path, monkeypatch, cls, write):
    """The original files made under made/, their archive at dl/<filename>, torchvision expecting both's MD5s."""
    truth = write(tmp_path / "made")
    folder = tmp_path / "made" / cls.base_folder
    (tmp_path / "dl").mkdir()
    archive = tar_folder(folder, tmp_path / "dl" / cls.filename)
    cifar_checksums(monkeypatch, cls, folder, archive)
    return tmp_path / "dl", archive, truth


@pytest.mark.parametrize("name, cls, write", CIFARS)
def test_cifar_intact_archive_in_place_is_used_without_download(tmp_path, monkeypatch, name, cls, write):
    root, archive, truth = _cifar_with_archive(tmp_path, monkeypatch, cls, write)
    data = read_source(name, {"download": False}, root)      # nothing extracted yet: the archive is
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))
    victim = root / cls.base_folder / cls.test_list[0][0]    # a damaged extracted file: extracted again
    victim.write_bytes(victim.read_bytes()[:100])
    data = read_source(name, {"download": False}, root)
    assert torch.equal(data["test_x"], torch.from_numpy(truth["test_x"])) and md5(victim) == cls.test_list[0][1]
    victim.unlink()                                          # a damaged archive in place: both named, with the fix
    archive.write_bytes(archive.read_bytes()[:-50])
    with pytest.raises(SourceError, match=rf"{re.escape(str(victim))} is missing; {re.escape(str(archive))} is "
                                          rf"there but does not match its published MD5 {cls.tgz_md5} \(truncated.*"
                                          rf"sources\.{name}\.download is false\. Fix: .*sources\.{name}\.archive"):
        read_source(name, {"download": False}, root)


def test_cifar_archive_setting_repairs_bad_extracted_files_without_download(tmp_path, monkeypatch):
    root, archive, truth = _cifar_with_archive(tmp_path, monkeypatch, CIFAR10, write_cifar10)
    moved = archive.rename(tmp_path / "elsewhere.tar.gz")
    write_cifar10(root, seed=1)      # other pixels: every extracted file fails its MD5
    data = read_source("cifar10", {"download": False, "archive": str(moved)}, root)
    assert torch.equal(data["train_x"], torch.from_numpy(truth["train_x"]))


def test_cifar_truncated_archive_that_passes_its_md5_is_reported_not_raised(tmp_path, monkeypatch):
    root, archive, _ = _cifar_with_archive(tmp_path, monkeypatch, CIFAR10, write_cifar10)
    archive.write_bytes(archive.read_bytes()[:archive.stat().st_size // 2])
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5(archive))   # only a checksum of the cut file lets it reach tarfile
    with pytest.raises(SourceError, match=rf"could not extract {re.escape(str(archive))} \(\w+: .*\): the archive "
                                          r"is truncated or damaged.*Fix: "):
        read_source("cifar10", {"download": False}, root)


def test_cifar_truncated_pickle_batch_is_named(tmp_path, monkeypatch):
    write_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    batch = folder / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:500])
    cifar_checksums(monkeypatch, CIFAR10, folder)            # as if its MD5 matched: the parser must still not leak
    with pytest.raises(SourceError, match=rf"{re.escape(str(batch))} is not a readable pickled batch "
                                          rf"\(UnpicklingError: pickle data was truncated\): it is truncated or "
                                          rf"damaged; delete {re.escape(str(folder))}\. Fix: "):
        read_source("cifar10", {"download": False}, tmp_path)


def _tiny_folder(tmp_path):
    archive, truth = _tiny(tmp_path)
    zipfile.ZipFile(archive).extractall(tmp_path / "x")
    return tmp_path / "x" / "tiny-imagenet-200", archive


def test_tinyimagenet_missing_training_images_are_named(tmp_path):
    folder, archive = _tiny_folder(tmp_path)
    w = WNIDS[1]
    gone = [f"train/{w}/images/{w}_{i}.JPEG" for i in range(3, 10)]    # 29 of the 36 images left
    for n in gone:
        (folder / n).unlink()
    message = (rf"training images are missing: the classes of wnids\.txt have 12 images each except {w} \(5\); "
               rf"missing (tiny-imagenet-200/)?train/{w}/images/{w}_3\.JPEG, .*{w}_7\.JPEG and 2 more\. The copy is "
               r"incomplete.*Fix: download tiny-imagenet-200\.zip")
    with pytest.raises(SourceError, match=message):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
    partial = rewrite_zip(archive, tmp_path / "partial.zip", drop={f"tiny-imagenet-200/{n}" for n in gone})
    with pytest.raises(SourceError, match=message):         # the same in a zip the user vouched for by its MD5
        read_source("tinyimagenet", {"archive": str(partial), "md5": md5(partial)}, tmp_path)


def test_tinyimagenet_boxes_file_names_an_image_lost_from_every_class(tmp_path):
    folder, _ = _tiny_folder(tmp_path)
    w = WNIDS[0]
    (folder / f"train/{w}/{w}_boxes.txt").write_text("".join(f"{w}_{i}.JPEG\t0\t0\t63\t63\n" for i in range(12)))
    for v in WNIDS:                                          # equal counts (11 each), but the boxes list 12
        (folder / f"train/{v}/images/{v}_11.JPEG").unlink()
    with pytest.raises(SourceError, match=rf"{w}_boxes\.txt lists 1 training images that are missing: "
                                          rf"(tiny-imagenet-200/)?train/{w}/images/{w}_11\.JPEG\. The copy is incomplete"):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)


def test_tinyimagenet_validation_images_must_match_their_annotations(tmp_path):
    folder, _ = _tiny_folder(tmp_path)
    annotations, image = folder / "val" / "val_annotations.txt", folder / "val/images/val_3.JPEG"
    lines, pixels = annotations.read_text().splitlines(), image.read_bytes()
    image.unlink()                                           # an annotated image is missing
    with pytest.raises(SourceError, match=r"val/val_annotations\.txt names 1 of its 6 images that are missing: "
                                          r"(tiny-imagenet-200/)?val/images/val_3\.JPEG\. The copy is incomplete"):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
    annotations.write_text("\n".join(line for line in lines if not line.startswith("val_3.")) + "\n")
    with pytest.raises(SourceError, match=rf"val_annotations\.txt gives the classes 2 images each except "
                                          rf"{WNIDS[0]} \(1\)\. The copy is incomplete"):   # image and line both gone
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
    image.write_bytes(pixels)                                # the annotation file is cut short
    with pytest.raises(SourceError, match=r"1 images under val/images/ have no line in "
                                          r"val/val_annotations\.txt \(val/images/val_3\.JPEG\): "
                                          r"the annotation file is cut short"):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)


def test_tinyimagenet_canonical_archive_must_hold_500_and_50_per_class(tmp_path, monkeypatch):
    archive, _ = _tiny(tmp_path)
    monkeypatch.setattr(tinyimagenet_sources, "TINY_MD5", md5(archive))   # as if the fixture were the published zip
    with pytest.raises(SourceError, match=r"holds 3 classes with 12 training and 2 validation images each; the "
                                          r"canonical tiny-imagenet-200\.zip holds 200 classes with 500 and 50"):
        read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)


def test_tinyimagenet_folder_with_the_200_classes_must_hold_500_and_50_per_class(tmp_path):
    folder = tmp_path / "tiny-imagenet-200"                  # counts are checked before any image is decoded
    wnids = [f"n{k:08d}" for k in range(200)]
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids))
    for w in wnids:
        (folder / "train" / w / "images").mkdir(parents=True)
        (folder / "train" / w / "images" / f"{w}_0.JPEG").write_bytes(b"")
        (folder / "val" / "images" / f"val_{w}.JPEG").write_bytes(b"")
    (folder / "val" / "val_annotations.txt").write_text("".join(f"val_{w}.JPEG\t{w}\n" for w in wnids))
    with pytest.raises(SourceError, match=r"holds 200 classes with 1 training and 1 validation images each"):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)


@pytest.fixture
def one_per_class(monkeypatch):
    """The canonical set cut to 1 training and 1 validation image per class (its 200 classes kept)."""
    monkeypatch.setattr(tinyimagenet_sources, "TINY_TRAIN_PER_CLASS", 1)
    monkeypatch.setattr(tinyimagenet_sources, "TINY_VAL_PER_CLASS", 1)


def test_tinyimagenet_folder_missing_a_class_everywhere_is_refused_naming_it(tmp_path, one_per_class):
    """A copy without one class (its train/ folder, its wnids.txt line, its validation images and lines) is
    consistent in itself, but every class after it would take a shifted label: refused at prepare, naming it."""
    folder = write_tinyimagenet_folder(tmp_path / "tiny-imagenet-200", TINY_WNIDS)
    data = read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
    assert data["classes"] == list(TINY_WNIDS) and data["train_y"].tolist() == list(range(200))
    gone = TINY_WNIDS[1]
    shutil.rmtree(folder / "train" / gone)
    (folder / "wnids.txt").write_text("".join(f"{w}\n" for w in TINY_WNIDS if w != gone))
    annotations = folder / "val" / "val_annotations.txt"
    lines = annotations.read_text().splitlines()
    (folder / "val" / "images" / next(line for line in lines if gone in line).split("\t")[0]).unlink()
    annotations.write_text("".join(f"{line}\n" for line in lines if gone not in line))
    with pytest.raises(SourceError) as e:
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
    assert re.search(rf"tiny-imagenet-200 holds 199 classes with 1 training and 1 validation images each; the "
                     rf"canonical tiny-imagenet-200\.zip holds 200 classes with 1 and 1; missing: {gone} \(no line in "
                     rf"wnids\.txt: the classes after it would take shifted labels\)\. The copy is incomplete .* If the "
                     rf"folder is deliberately not the canonical set, say so: set sources\.tinyimagenet\.md5 to another "
                     rf"MD5 \(such as its archive's\)\. Fix: download tiny-imagenet-200\.zip", str(e.value))
    declared = read_source("tinyimagenet", {"archive": str(folder), "md5": "0" * 32}, tmp_path)   # said so: read
    assert declared["classes"] == [w for w in TINY_WNIDS if w != gone]


@pytest.mark.parametrize("name", ["tinyimagenet", "cifar10"])
def test_a_damaged_archive_in_place_that_no_download_replaces_is_named_with_the_fix(tmp_path, monkeypatch, name):
    """download: true and no way to download: the archive already in place failed its checksum, and the error says
    so (not `could not download`, whose advice is to put a file where this one already is)."""
    if name == "tinyimagenet":
        good = _tiny(tmp_path)[0]
        root, filename, settings = tmp_path / "dl", good.name, {"md5": md5(good)}
    else:
        root, good, _ = _cifar_with_archive(tmp_path, monkeypatch, CIFAR10, write_cifar10)
        filename, settings = CIFAR10.filename, {}
    archive, intact, digest = root / filename, good.read_bytes(), md5(good)
    root.mkdir(exist_ok=True)
    archive.write_bytes(intact[:len(intact) // 2])                      # an interrupted download, say
    (tmp_path / "mirror").mkdir()
    with serve_folder(tmp_path / "mirror") as mirror:                   # the archive is nowhere to be had
        with pytest.raises(SourceError) as e:
            read_source(name, {**settings, "url": f"{mirror}/{filename}"}, root)
        message = str(e.value)
        assert re.search(rf"{re.escape(str(archive))} is in place but is not the original file: its checksum does "
                         rf"not match the MD5 {digest} \({len(intact) // 2:,} bytes; truncated, damaged or another "
                         rf"file\), and no fresh copy could be downloaded from {mirror}/{re.escape(filename)} \(.+\): "
                         rf"delete {re.escape(str(archive))}, or replace it with the original {re.escape(filename)}\. "
                         rf"Fix: ", message), message
        assert "could not download" not in message
        (tmp_path / "mirror" / filename).write_bytes(intact)           # a mirror that has it: the copy is replaced
        data = read_source(name, {**settings, "url": f"{mirror}/{filename}"}, root)
    assert archive.read_bytes() == intact and len(data["train_y"]) == (36 if name == "tinyimagenet" else 100)


def _flip_member_byte(archive, member: str, at: float = 0.5) -> None:
    """Corrupt one byte in the middle of `member`'s stored (possibly compressed) data, leaving the headers intact."""
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo(member)
    raw = bytearray(archive.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    pos = info.header_offset + 30 + name_len + extra_len + int(info.compress_size * at)
    raw[pos] ^= 0x5A
    archive.write_bytes(bytes(raw))


def test_tinyimagenet_bad_crc_member_is_reported(tmp_path):
    archive, _ = _tiny(tmp_path)
    _flip_member_byte(archive, "tiny-imagenet-200/wnids.txt", at=0.0)
    with pytest.raises(SourceError, match=rf"{re.escape(str(archive))}: tiny-imagenet-200/wnids\.txt cannot be read "
                                          r"\(BadZipFile: Bad CRC-32.*\): the archive is corrupt\. Delete .* and "
                                          r"supply a fresh copy\. Fix: download tiny-imagenet-200\.zip"):
        read_source("tinyimagenet", {"archive": str(archive), "md5": md5(archive)}, tmp_path)


def test_tinyimagenet_damaged_deflated_image_is_reported(tmp_path):
    archive, _ = _tiny(tmp_path)                             # the real zip is deflated: zlib or CRC errors
    deflated = rewrite_zip(archive, tmp_path / "deflated.zip", compression=zipfile.ZIP_DEFLATED)
    member = f"tiny-imagenet-200/train/{WNIDS[2]}/images/{WNIDS[2]}_4.JPEG"
    _flip_member_byte(deflated, member)
    with pytest.raises(SourceError, match=rf"{re.escape(member)} cannot be read \((error|BadZipFile): .*\): the "
                                          r"archive is corrupt"):
        read_source("tinyimagenet", {"archive": str(deflated), "md5": md5(deflated)}, tmp_path)


def test_tinyimagenet_non_utf8_wnids_is_reported_and_odd_words_are_tolerated(tmp_path):
    folder, archive = _tiny_folder(tmp_path)
    words = folder / "words.txt"
    words.write_bytes(words.read_bytes().replace(b"name1", b"caf\xe9"))   # latin-1 in a display name: kept
    assert read_source("tinyimagenet", {"archive": str(folder), "md5": md5(archive)}, tmp_path)["classes"][1] == "caf\ufffd"
    (folder / "wnids.txt").write_bytes("\n".join(WNIDS).encode("utf-16"))
    with pytest.raises(SourceError, match=r"tiny-imagenet-200: wnids\.txt is not the UTF-8 \(ASCII\) text file of "
                                          r"Tiny ImageNet \('utf-8' codec can't decode.*\): the file is damaged or "
                                          r"was replaced\. Delete .*tiny-imagenet-200 and supply a fresh copy"):
        read_source("tinyimagenet", {"archive": str(folder)}, tmp_path)
