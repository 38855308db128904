"""tools/speed.py: every method's step beside the bare loop, and the one-cell timer (shrunken shapes)."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import yaml

from gcl.config import resolve_benchmark
from gcl.data.benchmarks import build_benchmark
from image_fixtures import SEQ_BENCHMARK, write_er_params
from image_fixtures import labelled_source as source

SPEED = Path(__file__).resolve().parents[1] / "tools" / "speed.py"
RUNS = {   # what the profile would say; small values, only the code path matters
    "er": {"replay_batch": 4}, "derpp": {"replay_batch": 4, "alpha": 0.3, "beta": 0.5},
    "gss": {"replay_batch": 4, "gss_minibatch": 4}, "lwf": {"alpha": 1.0}, "coca": {"replay_batch": 4},
}


@pytest.fixture
def speed(monkeypatch):
    spec = importlib.util.spec_from_file_location("speed_under_test", SPEED)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)   # dataclasses look their module up there
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "PER_CLASS", 8)
    # the real ResNet shapes cost seconds per CPU step; the code path is the same on 8x8 images
    monkeypatch.setitem(module.SOURCE_SHAPES, "cifar10", dataclasses.replace(module.SOURCE_SHAPES["cifar10"], image=(3, 8, 8)))
    return module


def profile(tmp_path: Path, backbone: str) -> Path:
    bench = {**SEQ_BENCHMARK, "backbone": backbone, "augment": backbone != "mlp"}
    runs = {f"b-{m}": {"benchmark": "b", "method": m, "buffer": "none" if m == "lwf" else 20, "lr": 0.05,
                       "batch": 4, **extra} for m, extra in RUNS.items()}
    params = {"seeds": [0], "sources": {"mnist-bundled": {}}, "benchmarks": {"b": bench},
              "methods": {m: {} for m in RUNS}, "runs": runs}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_every_method_beside_the_bare_loop_on_the_mlp(speed, tmp_path, capsys):
    rows = speed.main(["--profile", str(profile(tmp_path, "mlp")), "--benchmark", "b", "--buffer", "20",
                       "--methods", "er,derpp,gss,lwf,coca,no-such-method,hal", "--steps", "2", "--rounds", "2"])
    assert {r["method"] for r in rows} == {"er", "derpp", "gss", "lwf", "coca"}
    assert all(r["seconds"] > 0 and r["vs_bare"] > 0 and r["batch"] == 4 and r["run"] == f"b-{r['method']}"
               for r in rows)
    assert all(r["ms_per_sample"] == pytest.approx(1e3 * r["seconds"] / 4) for r in rows)
    out = capsys.readouterr()
    assert "no-such-method" in out.err and "[skip] hal: no run of it" in out.err
    assert "vs bare" in out.out and "b-gss" in out.out


def test_a_plug_in_without_a_run_is_timed_at_its_base_methods_run_with_set_overrides(speed, tmp_path):
    """STAR's methods have no run in the profile: each is timed at its base's (er's, derpp's); --set reaches the
    methods that declare the setting (lam: the STAR ones only)."""
    assert (speed.base_method("er-star"), speed.base_method("derpp-star")) == ("er", "derpp")
    assert speed.base_method("derpp") is None and speed.base_method("er") is None   # derpp's beta has no default
    args = ["--profile", str(profile(tmp_path, "mlp")), "--benchmark", "b", "--buffer", "20", "--steps", "2",
            "--rounds", "1", "--methods", "er,er-star,derpp-star", "--set", "star_samples=all", "--set", "lam=0.2"]
    rows = speed.main(args)
    assert {r["method"]: r["run"] for r in rows} == {"er": "b-er", "er-star": "b-er as er-star",
                                                      "derpp-star": "b-derpp as derpp-star"}
    assert speed.overrides(["lam=0.2", "star_samples=all"]) == {"lam": 0.2, "star_samples": "all"}
    with pytest.raises(ValueError, match="lam"):
        speed.main([*args[:-1], "lam=-1.0"])


@pytest.mark.slow
def test_gss_and_coca_under_bf16_and_channels_last_on_the_resnet(speed, tmp_path):
    rows = speed.main(["--backbone", "resnet18", "--profile", str(profile(tmp_path, "resnet18")), "--benchmark", "b",
                       "--methods", "er,gss,coca", "--steps", "1", "--rounds", "1", "--bf16", "--channels-last"])
    assert {(r["method"], r["precision"], r["layout"]) for r in rows} == {
        (m, "bf16", "channels_last") for m in ("er", "gss", "coca")}


def test_time_one_cell_of_a_params_file(speed, tmp_path, monkeypatch, capsys):
    params = write_er_params(tmp_path)
    data = resolve_benchmark(params, "seq")["data"]
    build_benchmark(data, source(per_class=8), tmp_path / "data" / "benchmarks" / "seq")
    monkeypatch.chdir(tmp_path)
    assert speed.main(["--cell", "seq-er-50"]) is None
    out = capsys.readouterr().out
    assert "seq-er-50 seed 0 on cpu" in out and "samples/s" in out and "task-il" in out
    assert not (tmp_path / "runs").exists()   # timing only: nothing written
    torch.set_num_threads(1)


def test_the_stacked_table_times_resnet_seeds_stacked_and_alone(speed, capsys):
    """The paper profile's seq-CIFAR-10 ER run, its seeds stacked and alone (8x8 images at width 2 here)."""
    rows = speed.main(["--stacked", "2", "--backbone", "resnet18", "--width", "2", "--per-class", "4", "--methods", "er",
                 "--threads", "1"])
    assert [r["method"] for r in rows] == ["er"] and rows[0]["run"].startswith("seq-cifar10-er")
    assert rows[0]["seeds"] == 2 and rows[0]["steps"] > 0 and rows[0]["alone_ms"] > 0 and rows[0]["stacked_ms"] > 0
    assert "resnet18 width 2" in capsys.readouterr().out
