"""gcl.dryrun: the dry profile keeps each run's stream structure while cutting its cost, and a CI-size dry run
of the paper profile (one run per method on each kind of benchmark) trains and reports through `dvc repro`."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from gcl import dryrun
from gcl.config import benchmark_settings, load_params, resolve_run
from gcl.data.random_sources import SOURCE_SHAPES, random_source

ROOT = Path(__file__).resolve().parents[1]

PAPER = ROOT / "profiles" / "paper.yaml"


@pytest.fixture(scope="module")
def paper():
    params = load_params(PAPER)
    args = dryrun.parse_args([str(PAPER)])
    keys = dryrun.selected_runs(params, ["*"])
    return params, dryrun.dry_profile(params, keys, args)


def real_stream_batches(params: dict, benchmark: str, batch: int, epochs: int, counts: list[int]) -> list[int]:
    """The size of every batch of the stream a run really trains on, on a source with these training images per
    class: the benchmark built and its stream drawn by the pipeline's own code (tiny blank images: the structure
    does not depend on pixels), independent of the kinds' batch_sizes that the dry run computes with."""
    settings = benchmark_settings(params, benchmark)
    labels = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))
    source = {"train_x": torch.zeros(len(labels), 1, 4, 4, dtype=torch.uint8), "train_y": labels,
              "test_x": torch.zeros(len(counts), 1, 4, 4, dtype=torch.uint8), "test_y": torch.arange(len(counts)),
              "classes": [str(c) for c in range(len(counts))]}
    bench = type(settings).build(source, settings.data())
    stream = type(settings).stream(bench, settings.training(), epochs, batch, torch.Generator().manual_seed(0))
    return [stream.bounds[i + 1] - stream.bounds[i] for i in range(stream.steps)]


def dry_profiles(scale: float) -> tuple[dict, dict]:
    params = load_params(PAPER)
    args = dryrun.parse_args([str(PAPER), "--scale", str(scale)])
    return params, dryrun.dry_profile(params, dryrun.selected_runs(params, ["*"]), args)


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.1, 0.01])     # the default, and the CI-size dry run's
def test_every_short_batch_of_every_run_is_the_real_streams(scale):
    """Every run of the paper profile meets, on the cut stream, the short batches of its real stream in the same
    order (each pass's last over a task; each MNIST-360 segment's last), compared on streams drawn by the pipeline
    itself; and its stream is longer than its buffer."""
    params, dry = dry_profiles(scale)
    seen = {}
    for key, run in dry["runs"].items():
        spec = resolve_run(params, key)
        real = list(SOURCE_SHAPES[spec.data.source].counts("train"))
        cut = dry["sources"][f"random-{spec.data.source}"]["train_per_class"]
        shape = (run["benchmark"], spec.run.batch, min(spec.benchmark.epochs, 2))
        if shape not in seen:
            streams = [real_stream_batches(params, *shape, counts) for counts in (real, cut)]
            seen[shape] = [[n for n in sizes if n != spec.run.batch] for sizes in streams], sum(streams[1])
        (real_short, cut_short), cut_length = seen[shape]
        assert cut_short == real_short, (key, scale)
        assert cut_length > dryrun.buffer_of(run), key
    assert len(seen) >= 10          # the distinct streams (benchmark, batch, epochs) of the profile


@pytest.mark.parametrize("block", [
    {"kind": "mnist-360", "validation_fraction": 0.1},
    {"kind": "sequential", "n_tasks": 4, "classes_per_task": 2, "validation_fraction": 0.15},
    {"kind": "sequential", "n_tasks": 2, "classes_per_task": 3, "class_order": "cifar100-superclass"},
])
def test_a_kinds_batch_sizes_are_those_of_its_stream(block):
    """The arithmetic the dry run cuts by (a kind's batch_sizes) against the stream itself, with a validation part
    and a class order (which change each class's and task's count)."""
    n_classes = 100 if block.get("class_order") else 10
    params = {"sources": {"s": {}}, "benchmarks": {"b": {"source": "s", "backbone": "mlp", "epochs": 2, **block}}}
    counts = [37 + 5 * c + (c % 3) for c in range(n_classes)]
    for batch in (1, 4, 7, 32):
        assert dryrun.stream_batches(params, "b", batch, 2, counts) == real_stream_batches(params, "b", batch, 2, counts)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SOURCE_SHAPES))
def test_random_pixels_have_the_real_pixels_mean_and_spread(name):
    """The random stand-in's pixels copy the real ones' mean and std per channel, so a run's learning rate takes
    the step it takes on the real data (patterns twice as bright made CLS-ER at lr 0.2 diverge)."""
    shape = SOURCE_SHAPES[name]
    source = random_source(shape, 20 if shape.classes > 10 else 200, test_per_class=1, seed=3)
    x = source["train_x"].double().div(255).transpose(0, 1).flatten(1)
    mean, std = (torch.tensor(v, dtype=torch.float64) for v in shape.pixels)
    assert torch.allclose(x.mean(1), mean, atol=0.01) and torch.allclose(x.std(1), std, atol=0.01)
    # each class is still its own pattern: an image is nearer its class's mean image than any other class's
    y = source["train_y"]
    centres = torch.stack([source["train_x"][y == c].double().mean(0) for c in range(shape.classes)])
    first = source["train_x"][[int((y == c).nonzero()[0]) for c in range(shape.classes)]].double()
    assert torch.equal(torch.cdist(first.flatten(1), centres.flatten(1)).argmin(1), torch.arange(shape.classes))


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
    cut = sum(sum(s["train_per_class"]) for s in dry["sources"].values())
    assert cut < 0.2 * sum(sum(SOURCE_SHAPES[s.removeprefix("random-")].counts("train")) for s in dry["sources"])


def test_the_dry_profile_keeps_as_many_seeds_as_asked(paper):
    params, _ = paper
    dry = dryrun.dry_profile(params, list(params["runs"]), dryrun.parse_args([str(PAPER), "--seeds", "3"]))
    assert dry["seeds"] == params["seeds"][:3] and dry["workers"] == 1
    assert all(run.get("seeds", dry["seeds"]) == (run.get("seeds") or params["seeds"])[:3] for run in dry["runs"].values())
    with pytest.raises(SystemExit):
        dryrun.parse_args([str(PAPER), "--seeds", "0"])


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


def test_a_comparison_is_kept_only_where_every_method_it_names_ran():
    runs = {f"{m}-{b}": {"benchmark": "mnist-360", "method": m, "buffer": b}
            for m, b in [("coca", 200), ("coca", 500), ("er", 200), ("er", 500), ("clser", 200)]}
    both = {"benchmark": "mnist-360", "method": "coca", "against": ["er"]}
    partial = {"benchmark": "mnist-360", "method": "coca", "against": ["er", "clser"]}   # clser lacks buffer 500
    report = dryrun.dry_report({"comparisons": [both, partial]}, runs, ["mnist-360"])
    assert report["comparisons"] == [both]


def test_an_ablation_keeps_only_the_buffers_at_which_every_configuration_ran():
    runs = {f"{m}-{b}": {"benchmark": "online-cifar10", "method": m, "buffer": b}
            for m, b in [("coca", 200), ("coca", 1000), ("coca-base", 1000), ("coca-base", 500), ("coca", 500)]}
    spec = {"benchmark": "online-cifar10", "buffers": [200, 500, 1000], "configurations": {"coca-base": [],
                                                                                          "coca": ["CKD"]}}
    kept = dryrun.dry_report({"ablation": [spec]}, runs, ["online-cifar10"])["ablation"]
    assert kept == [{**spec, "buffers": [500, 1000]}]                           # coca-base never ran at 200
    only_200 = {k: r for k, r in runs.items() if r["buffer"] == 200}
    assert "ablation" not in dryrun.dry_report({"ablation": [spec]}, only_200, ["online-cifar10"])


def test_the_stages_import_the_workspace_copy_first_and_keep_the_callers_packages(tmp_path, monkeypatch):
    # a caller whose DVC and pydantic live on PYTHONPATH (a --target install) must still run the stages
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/work/src"]))
    assert dryrun.environment(tmp_path)["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "src"), "/opt/site", "/work/src"]
    monkeypatch.delenv("PYTHONPATH")
    assert dryrun.environment(tmp_path)["PYTHONPATH"] == str(tmp_path / "src")


def test_one_run_per_method_keeps_the_runs_a_comparison_needs():
    params = load_params(PAPER)
    keys = dryrun.selected_runs(params, ["mnist-360-*"], one_per_method=True)
    assert "mnist-360-clser-working-200" in keys            # the same algorithm as clser, yet compared with
    assert "mnist-360-clser-working-500" not in keys and "mnist-360-coca-500" not in keys


@pytest.mark.e2e
def test_a_ci_size_dry_run_of_the_paper_profile_trains_and_reports(tmp_path, capsys):
    """One run per method on each kind of benchmark of the paper profile (MNIST-360; sequential 32x32x3 and
    64x64x3 images; CN-DPM's split protocol), 2 epochs, every pass ending in a short batch, through `dvc repro`;
    the report with its comparison (one seed a side: the difference without an interval)."""
    status = dryrun.main([str(PAPER), "--runs", "mnist-360-*", "seq-cifar10-*", "seq-tinyimg-*", "split-cifar10-*",
                          "--one-per-method", "--scale", "0.01", "--root", str(ROOT), "--workspace", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert status == 0, out
    ok = [line for line in out.splitlines() if line.startswith("ok  ")]
    # 44 runs (clser-working for the comparison; ER-STAR, DER++-STAR and ESMER on MNIST-360) and the report
    assert len(ok) == 45 and "ok      report:" in out
    assert all("cut: 1 of " in line for line in ok[:-1] if "report:" not in line)
    assert "e_lambda 0 (real 10)" in next(line for line in ok if "seq-cifar10-oewc" in line)
    assert "not proven by this dry run" in out and "spawn on a GPU" in out and "random pixels" in out
    tables = (tmp_path / "dry" / "results" / "tables.md").read_text()
    assert "CoCa against the best of" in tables and "an interval needs at least 2 seeds on each side" in tables


@pytest.mark.e2e
def test_a_dry_run_of_two_seeds_trains_a_stackable_run_stacked(tmp_path, capsys):
    """With --seeds 2 the seeds of a run that stacks (MNIST-360's ER, on the MLP) train as one stacked group,
    as in the real run, and the closing lines no longer claim that stacked seeds went unproven."""
    status = dryrun.main([str(PAPER), "--runs", "mnist-360-er-200", "--scale", "0.01", "--seeds", "2",
                          "--root", str(ROOT), "--workspace", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "cut: 2 of 10 seeds" in out and "at most 2 seeds per run, stacked where the run stacks" in out
    metrics = json.loads((tmp_path / "dry" / "runs" / "mnist-360" / "er" / "200" / "metrics.json").read_text())
    assert [seed["environment"]["stacked"] for seed in metrics["seeds"].values()] == [2, 2]


def test_a_dry_run_outside_the_project_says_where_to_run_it(tmp_path):
    """The pipeline copied is the current folder's (or --root's): a folder without dvc.yaml is refused in one line."""
    with pytest.raises(SystemExit, match="holds no dvc.yaml: run from the project's root folder, or name it with --root"):
        dryrun.main([str(PAPER), "--root", str(tmp_path), "--workspace", str(tmp_path / "dry")])
    assert not (tmp_path / "dry").exists()


def test_a_train_stage_refused_the_repositorys_lock_is_started_again(tmp_path, monkeypatch):
    """Runs trained side by side share one workspace; a stage that finds DVC's lock held is retried (a bounded number
    of times), any other failure is reported at once."""
    calls = []

    def fake(workspace, *args, log=None):
        calls.append(args)
        refused = len(calls) < 3
        err = "ERROR: Unable to acquire lock." if refused else "error: train: the stage's own error"
        return subprocess.CompletedProcess(args, 1, "", err)

    monkeypatch.setattr(dryrun, "dvc", fake)
    monkeypatch.setattr(dryrun.time, "sleep", lambda s: None)
    result = dryrun.train(tmp_path, "k", {}, "cut")
    assert len(calls) == 3 and not result["ok"] and "the stage's own error" in result["error"]
    calls.clear()
    monkeypatch.setattr(dryrun, "dvc", lambda w, *a, log=None: (calls.append(a),
                        subprocess.CompletedProcess(a, 1, "", "ERROR: Unable to acquire lock."))[1])
    assert not dryrun.train(tmp_path, "k", {}, "cut")["ok"] and len(calls) == dryrun.LOCK_ATTEMPTS
