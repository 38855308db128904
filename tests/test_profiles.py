"""profiles/mnist-360.yaml is the paper profile's MNIST-360 part; profiles/cifar10-folder.yaml its seq-cifar10 part
on an image folder, whose benchmark is the cifar10 source's on the same images (every profile is validated in
test_config.py)."""
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10

from gcl.config import load_params, resolve_benchmark, resolve_source
from gcl.data import sequential
from gcl.data.benchmarks import build_benchmark, load_benchmark
from gcl.data.image_sources import NORMALIZATION
from gcl.data.sources import SourceError, read_source
from image_fixtures import CIFAR10_NAMES, cifar_checksums, class_images, tar_folder, write_cifar10, write_image_folder

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_the_mnist_360_profile_is_the_paper_profiles_mnist_360_part():
    part, paper = load_params(PROFILES / "mnist-360.yaml"), load_params(PROFILES / "paper.yaml")
    assert part["benchmarks"] == {"mnist-360": paper["benchmarks"]["mnist-360"]}
    assert part["sources"] == {"mnist": paper["sources"]["mnist"]}
    assert part["runs"] == {k: r for k, r in paper["runs"].items() if r["benchmark"] == "mnist-360"}
    used = {r["method"] for r in part["runs"].values()}
    assert set(part["methods"]) == used
    assert {m: part["methods"][m] for m in used} == {m: paper["methods"][m] for m in used}
    shown = {m: paper["report"]["methods"][m] for m in used if m in paper["report"]["methods"]}
    assert {m: part["report"]["methods"][m] for m in shown} == shown


def test_the_cifar10_folder_profile_is_the_paper_profiles_seq_cifar10_on_an_image_folder():
    part, paper = load_params(PROFILES / "cifar10-folder.yaml"), load_params(PROFILES / "paper.yaml")
    (name, source), = part["sources"].items()
    assert source["kind"] == "image-folder" and source["like"] == "cifar10"
    assert [source["mean"], source["std"]] == [list(v) for v in NORMALIZATION["cifar10"]]   # the paper profile's
    assert part["benchmarks"] == {"seq-cifar10": {**paper["benchmarks"]["seq-cifar10"], "source": name}}
    wanted = {k: r for k, r in paper["runs"].items() if r["benchmark"] == "seq-cifar10"
              and r["method"] in ("sgd", "joint", "er", "derpp", "coca")}
    assert part["runs"] == wanted and len(wanted) == 11
    assert {r["buffer"] for r in wanted.values()} == {"none", 200, 500, 5120}
    used = {r["method"] for r in part["runs"].values()}
    assert set(part["methods"]) == used and {m: part["methods"][m] for m in used} == {m: paper["methods"][m] for m in used}
    assert {m: part["report"]["methods"][m] for m in used} == {m: paper["report"]["methods"][m] for m in used}
    assert part["report"]["tables"] == paper["report"]["tables"][:2]            # Tables 1 and 2
    assert all(part[k] == paper[k] for k in ("seeds", "device", "workers", "mps", "threads"))


def test_the_folder_profiles_benchmark_is_the_cifar10_sources_on_the_same_images(tmp_path, monkeypatch):
    """The same pixels as CIFAR-10's pickles (read by the cifar10 source) and as a folder of PNGs in the real layout
    (read by the folder profile's source, its path pointed there): the seq-cifar10 benchmarks that benchmark@ builds
    from them hold the same classes, tensors and normalisation, and their streams are the same. The pickles' test
    images are in class order here, as a folder's are (CIFAR-10's own test batch mixes the classes: a folder copy
    evaluates the same images in another order, which no accuracy depends on)."""
    rng = np.random.default_rng(0)
    train_y = rng.permutation(np.repeat(np.arange(10), 7))       # class-mixed, as CIFAR-10's batches
    test_y = np.repeat(np.arange(10), 2)
    split = {"train_x": class_images(train_y, 32, rng), "train_y": train_y,
             "test_x": class_images(test_y, 32, rng), "test_y": test_y}
    write_cifar10(tmp_path / "pickles", split=split)
    cifar_checksums(monkeypatch, CIFAR10, tmp_path / "pickles" / "cifar-10-batches-py")
    as_files = {part: {c: list(split[f"{part}_x"][split[f"{part}_y"] == k]) for k, c in enumerate(CIFAR10_NAMES)}
                for part in ("train", "test")}
    folder = write_image_folder(tmp_path / "cifar10-images", as_files)
    archive = tar_folder(folder, tmp_path / "cifar10-images.tar.gz")

    part, paper = load_params(PROFILES / "cifar10-folder.yaml"), load_params(PROFILES / "paper.yaml")
    (name, block), = part["sources"].items()
    part["sources"][name] = {**block, "path": str(archive)}
    with pytest.raises(SourceError, match=r"is not shaped like cifar10 .*cifar10-images/train/airplane/ holds 7 "
                                          r"images, not 5,000"):
        read_source("image-folder", resolve_source(part, name))
    del part["sources"][name]["like"]                           # a few images per class, not CIFAR-10's 5,000
    from_folder = read_source("image-folder", resolve_source(part, name))
    from_pickles = read_source("cifar10", {"download": False}, tmp_path / "pickles")
    assert from_folder["classes"] == from_pickles["classes"] == CIFAR10_NAMES

    built = {}
    for label, params, source in (("folder", part, from_folder), ("pickles", paper, from_pickles)):
        data = resolve_benchmark(params, "seq-cifar10")["data"]
        built[label] = load_benchmark(build_benchmark(data, source, tmp_path / label), data)
    folder_bench, pickle_bench = built["folder"], built["pickles"]
    assert folder_bench.keys() == pickle_bench.keys()
    for key in folder_bench:
        if key == "config":      # the source's name differs, and nothing else
            assert {**folder_bench[key], "source": "cifar10"} == pickle_bench[key]
        elif isinstance(folder_bench[key], torch.Tensor):
            assert torch.equal(folder_bench[key], pickle_bench[key]), key
        else:
            assert folder_bench[key] == pickle_bench[key], key
    assert (tuple(folder_bench["mean"]), tuple(folder_bench["std"])) == NORMALIZATION["cifar10"]
    streams = [sequential.build_stream(b, 2, 32, torch.Generator().manual_seed(0)) for b in (folder_bench, pickle_bench)]
    assert torch.equal(streams[0].order, streams[1].order) and streams[0].bounds == streams[1].bounds
    assert torch.equal(streams[0].images[streams[0].order], streams[1].images[streams[1].order])
