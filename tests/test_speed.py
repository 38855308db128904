"""python -m gcl.bench steps (gcl.bench.steps, gcl.bench.whole_seeds): every method's step beside the bare loop, the one-cell
timer and stacked seeds against alone (shrunken shapes)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from gcl.bench import steps as steps_module
from gcl.bench.common import overrides
from gcl.config import resolve_benchmark
from gcl.data.benchmarks import build_benchmark
from gcl.data.random_sources import SOURCE_SHAPES
from image_fixtures import SEQ_BENCHMARK, write_er_params
from image_fixtures import labelled_source as source

RUNS = {   # what the profile would say; small values, only the code path matters
    "er": {"replay_batch": 4}, "derpp": {"replay_batch": 4, "alpha": 0.3, "beta": 0.5},
    "gss": {"replay_batch": 4, "gss_minibatch": 4}, "lwf": {"alpha": 1.0}, "coca": {"replay_batch": 4},
}


@pytest.fixture
def steps(monkeypatch):
    monkeypatch.setattr(steps_module, "PER_CLASS", 8)
    # the real ResNet shapes cost seconds per CPU step; the code path is the same on 8x8 images
    monkeypatch.setitem(SOURCE_SHAPES, "cifar10", dataclasses.replace(SOURCE_SHAPES["cifar10"], image=(3, 8, 8)))
    return steps_module


def profile(tmp_path: Path, backbone: str) -> Path:
    bench = {**SEQ_BENCHMARK, "backbone": backbone, "augment": backbone != "mlp"}
    runs = {f"b-{m}": {"benchmark": "b", "method": m, "buffer": "none" if m == "lwf" else 20, "lr": 0.05,
                       "batch": 4, **extra} for m, extra in RUNS.items()}
    params = {"seeds": [0], "sources": {"mnist-bundled": {}}, "benchmarks": {"b": bench},
              "methods": {m: {} for m in RUNS}, "runs": runs}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_every_method_beside_the_bare_loop_on_the_mlp(steps, tmp_path, capsys):
    rows = steps.main(["--profile", str(profile(tmp_path, "mlp")), "--benchmark", "b", "--buffer", "20",
                       "--methods", "er,derpp,gss,lwf,coca,no-such-method,hal", "--steps", "2", "--rounds", "2"])
    assert {r["method"] for r in rows} == {"er", "derpp", "gss", "lwf", "coca"}
    assert all(r["seconds"] > 0 and r["vs_bare"] > 0 and r["batch"] == 4 and r["run"] == f"b-{r['method']}"
               for r in rows)
    assert all(r["ms_per_sample"] == pytest.approx(1e3 * r["seconds"] / 4) for r in rows)
    out = capsys.readouterr()
    assert "no-such-method" in out.err and "[skip] hal: no run of it" in out.err
    assert "vs bare" in out.out and "b-gss" in out.out


def test_a_plug_in_without_a_run_is_timed_at_its_base_methods_run_with_set_overrides(steps, tmp_path):
    """STAR's methods have no run in the profile: each is timed at its base's (er's, derpp's); --set reaches the
    methods that declare the setting (lam: the STAR ones only)."""
    assert (steps.base_method("er-star"), steps.base_method("derpp-star")) == ("er", "derpp")
    assert steps.base_method("derpp") is None and steps.base_method("er") is None   # derpp's beta has no default
    args = ["--profile", str(profile(tmp_path, "mlp")), "--benchmark", "b", "--buffer", "20", "--steps", "2",
            "--rounds", "1", "--methods", "er,er-star,derpp-star", "--set", "star_samples=all", "--set", "lam=0.2"]
    rows = steps.main(args)
    assert {r["method"]: r["run"] for r in rows} == {"er": "b-er", "er-star": "b-er as er-star",
                                                      "derpp-star": "b-derpp as derpp-star"}
    assert overrides(["lam=0.2", "star_samples=all"]) == {"lam": 0.2, "star_samples": "all"}
    with pytest.raises(ValueError, match="lam"):
        steps.main([*args[:-1], "lam=-1.0"])


@pytest.mark.slow
def test_gss_and_coca_under_bf16_and_channels_last_on_the_resnet(steps, tmp_path):
    rows = steps.main(["--backbone", "resnet18", "--profile", str(profile(tmp_path, "resnet18")), "--benchmark", "b",
                       "--methods", "er,gss,coca", "--steps", "1", "--rounds", "1", "--bf16", "--channels-last"])
    assert {(r["method"], r["precision"], r["layout"]) for r in rows} == {
        (m, "bf16", "channels_last") for m in ("er", "gss", "coca")}


def test_time_one_cell_of_a_params_file(steps, tmp_path, monkeypatch, capsys):
    params = write_er_params(tmp_path)
    data = resolve_benchmark(params, "seq")["data"]
    build_benchmark(data, source(per_class=8), tmp_path / "data" / "benchmarks" / "seq")
    monkeypatch.chdir(tmp_path)
    assert steps.main(["--cell", "seq-er-50"]) is None
    out = capsys.readouterr().out
    assert "seq-er-50 seed 0 on cpu" in out and "samples/s" in out and "task-il" in out
    assert not (tmp_path / "runs").exists()   # timing only: nothing written
    torch.set_num_threads(1)


def test_the_stacked_table_times_resnet_seeds_stacked_and_alone(steps, capsys):
    """The paper profile's seq-CIFAR-10 ER run, its seeds stacked and alone (8x8 images at width 2 here)."""
    rows = steps.main(["--stacked", "2", "--backbone", "resnet18", "--width", "2", "--per-class", "4", "--methods", "er",
                 "--threads", "1"])
    assert [r["method"] for r in rows] == ["er"] and rows[0]["run"].startswith("seq-cifar10-er")
    assert rows[0]["seeds"] == 2 and rows[0]["steps"] > 0 and rows[0]["alone_ms"] > 0 and rows[0]["stacked_ms"] > 0
    assert "resnet18 width 2" in capsys.readouterr().out


def test_set_reaches_the_stacked_table(steps, capsys):
    """--set changes the settings both sides of the stacked table train with (ER's separate replay pass here),
    validated as a run's are."""
    args = ["--stacked", "2", "--per-class", "60", "--methods", "er", "--threads", "1", "--set", "replay_pass=separate"]
    rows = steps.main(args)
    assert [r["method"] for r in rows] == ["er"] and "replay_pass=separate: ms of training" in capsys.readouterr().out
    with pytest.raises(ValueError, match="replay_pass"):
        steps.main([*args[:-1], "replay_pass=sideways"])
