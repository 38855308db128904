"""tools/dryrun.py: the dry profile keeps each run's stream structure while cutting its cost, and a CI-size dry run
of the paper profile (one run per method on each kind of benchmark) trains and reports through `dvc repro`."""
import os
import sys
from pathlib import Path

import pytest
import torch

from gcl.config import load_params, resolve_run
from gcl.data import sequential
from gcl.data.mnist360 import chunk_bounds
from gcl.data.random_sources import SOURCE_SHAPES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import dryrun  # noqa: E402

PAPER = ROOT / "profiles" / "paper.yaml"


@pytest.fixture(scope="module")
def paper():
    params = load_params(PAPER)
    args = dryrun.parse_args([str(PAPER)])
    keys = dryrun.selected_runs(params, ["*"])
    return params, dryrun.dry_profile(params, keys, args)


def short_batches(counts: list[int], data: dict, batch: int, epochs: int) -> list[int]:
    """The sizes of the batches shorter than `batch` (each pass's last), in stream order, on a sequential stream
    of these class counts (built from labels alone: no images needed)."""
    classes = data.n_tasks * data.classes_per_task
    labels = torch.arange(classes).repeat_interleave(torch.tensor(counts[:classes]))
    bench = {"train_task": labels // data.classes_per_task, "n_tasks": data.n_tasks, "train_x": labels,
             "train_y": labels, "classes_per_task": data.classes_per_task}
    stream = sequential.build_stream(bench, epochs, batch, torch.Generator().manual_seed(0))
    sizes = [stream.bounds[i + 1] - stream.bounds[i] for i in range(stream.steps)]
    return [n for n in sizes if n != batch]


def test_every_pass_ends_with_a_batch_of_its_real_size(paper):
    """Each sequential run's batches take the same sizes on the cut stream as on the real one (the short last
    batch of a pass included), and every MNIST-360 chunk keeps its remainder modulo the run's batch."""
    params, dry = paper
    for key, run in dry["runs"].items():
        spec = resolve_run(params, key)
        source = spec.data.source
        real, cut = SOURCE_SHAPES[source].counts("train"), dry["sources"][f"random-{source}"]["train_per_class"]
        batch, epochs = spec.run.batch, min(spec.benchmark.epochs, 2)
        if spec.data.kind == "sequential":
            assert short_batches(cut, spec.data, batch, epochs) == short_batches(real, spec.data, batch, epochs), key
        else:
            for n_real, n_cut in zip(real[:9], cut[:9]):
                lengths = [[end - start for start, end in chunk_bounds(n)] for n in (n_real, n_cut)]
                assert [n % batch for n in lengths[0]] == [n % batch for n in lengths[1]], key


def test_the_dry_profile_keeps_each_runs_settings_and_cuts_the_rest(paper):
    params, dry = paper
    assert dry["seeds"] == params["seeds"][:1] and dry["device"] == "cpu"
    for key, run in dry["runs"].items():
        original = params["runs"][key]
        assert {k: v for k, v in run.items() if k not in ("epochs", "seeds", "e_lambda")} == \
            {k: v for k, v in original.items() if k not in ("epochs", "seeds", "e_lambda")}
        assert len(run.get("seeds", [0])) == 1
        # oEWC's penalty, unstable on a narrow network at its published weight, runs weighted 0
        assert run.get("e_lambda", original.get("e_lambda")) == (0.0 if run["method"] == "oewc" else original.get("e_lambda"))
    for name, block in dry["benchmarks"].items():
        real = params["benchmarks"][name]
        assert block["epochs"] == min(real["epochs"], 2) and block["source"] == f"random-{real['source']}"
        assert (block.get("width"), block.get("input_size")) == ((2, 9) if real["backbone"] == "resnet18" else
                                                                 (None, None))
    # every buffer fills before its stream ends
    for key, run in dry["runs"].items():
        counts = dry["sources"][dry["benchmarks"][run["benchmark"]]["source"]]["train_per_class"]
        assert dryrun.stream_length(params, params["runs"][key], counts, 2) >= dryrun.buffer_of(run), key
    cut = sum(sum(s["train_per_class"]) for s in dry["sources"].values())
    assert cut < 0.2 * sum(sum(SOURCE_SHAPES[s.removeprefix("random-")].counts("train")) for s in dry["sources"])


def test_a_run_sees_the_same_stream_in_a_dry_run_of_a_few_runs(paper):
    """The cut depends on the whole profile, not on the selection: the iCaRL run that crashed on its short pooled
    step must meet the same stream alone as in the whole grid."""
    params, whole = paper
    keys = dryrun.selected_runs(params, ["seq-cifar10-icarl-200"])
    alone = dryrun.dry_profile(params, keys, dryrun.parse_args([str(PAPER)]))
    assert alone["sources"] == {"random-cifar10": whole["sources"]["random-cifar10"]}
    assert "sensitivity" not in alone["report"] and "sensitivity" in whole["report"]


def test_one_run_per_method_and_benchmark_takes_the_smallest_buffer():
    params = load_params(PAPER)
    keys = dryrun.selected_runs(params, ["seq-cifar10-*"], one_per_method=True)
    assert "seq-cifar10-icarl-200" in keys and "seq-cifar10-icarl-5120" not in keys
    assert "seq-cifar10-coca-200" in keys and "seq-cifar10-coca-g001-200" not in keys   # one CoCa implementation
    with pytest.raises(SystemExit, match="no run of the profile matches"):
        dryrun.selected_runs(params, ["seq-nothing-*"])


@pytest.mark.e2e
def test_a_comparison_is_kept_only_where_every_method_it_names_ran():
    runs = {f"{m}-{b}": {"benchmark": "mnist-360", "method": m, "buffer": b}
            for m, b in [("coca", 200), ("coca", 500), ("er", 200), ("er", 500), ("clser", 200)]}
    both = {"benchmark": "mnist-360", "method": "coca", "against": ["er"]}
    partial = {"benchmark": "mnist-360", "method": "coca", "against": ["er", "clser"]}   # clser lacks buffer 500
    report = dryrun.dry_report({"comparisons": [both, partial]}, runs, ["mnist-360"])
    assert report["comparisons"] == [both]


def test_the_stages_import_the_workspace_copy_first_and_keep_the_callers_packages(tmp_path, monkeypatch):
    # a caller whose DVC and pydantic live on PYTHONPATH (a --target install) must still run the stages
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/work/src"]))
    assert dryrun.environment(tmp_path)["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "src"), "/opt/site", "/work/src"]
    monkeypatch.delenv("PYTHONPATH")
    assert dryrun.environment(tmp_path)["PYTHONPATH"] == str(tmp_path / "src")


def test_a_ci_size_dry_run_of_the_paper_profile_trains_and_reports(tmp_path, capsys):
    """One run per method on each kind of benchmark of the paper profile (MNIST-360; sequential 32x32x3 and
    64x64x3 images; CN-DPM's split protocol), 2 epochs, every pass ending in a short batch, through `dvc repro`."""
    status = dryrun.main([str(PAPER), "--runs", "mnist-360-*", "seq-cifar10-*", "seq-tinyimg-*", "split-cifar10-*",
                          "--one-per-method", "--scale", "0.01", "--workspace", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert status == 0, out
    ok = [line for line in out.splitlines() if line.startswith("ok  ")]
    assert len(ok) == 41 and "ok      report:" in out     # 40 runs and the report
    assert (tmp_path / "dry" / "results" / "tables.md").exists()
