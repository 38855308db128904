"""params.yaml validation: every bad value stops with a message naming the key, the value and what is accepted.

The cases are built on a small params dict written here, not on the live params.yaml, so renaming a
run of the default profile cannot break them.
"""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from gcl.config import ParamsError, check_data, check_runs, resolve_report, resolve_run, resolve_runtime
from gcl.methods.base import METHODS, Method, register

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "seeds": [0, 1],
    "device": "cpu",
    "workers": 2,
    "sources": {"mnist-bundled": {"train_per_class": 400, "test_per_class": 100}},
    "benchmarks": {
        "mnist-360": {"kind": "mnist-360", "source": "mnist-bundled", "backbone": "mlp", "epochs": 1},
        "seq": {"kind": "sequential", "source": "mnist-bundled", "backbone": "mlp", "epochs": 1,
                "n_tasks": 5, "classes_per_task": 2, "augment": False},
    },
    "methods": {"sgd": {}, "er": {}, "coca": {"lambda1": 0.5}},
    "runs": {
        "m-sgd": {"benchmark": "mnist-360", "method": "sgd", "buffer": "none", "lr": 0.1, "batch": 4},
        "m-er-200": {"benchmark": "mnist-360", "method": "er", "buffer": 200, "lr": 0.2, "batch": 1, "replay_batch": 16},
        "s-coca-200": {"benchmark": "seq", "method": "coca", "buffer": 200, "lr": 0.1, "batch": 10, "replay_batch": 10},
    },
    "report": {"figures": False},
}


def params(**changes):
    """BASE with `a__b__c=value` changes (value None deletes the key)."""
    p = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = p
        for k in parents:
            node = node[k]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return p


def check_all(p):
    check_data(p)
    check_runs(p)


def test_the_base_params_are_valid():
    check_all(params())


@pytest.mark.parametrize("change, words", [
    ({"runs__m-er-200__method": "err"}, ["runs.m-er-200.method", "'err'"]),
    ({"runs__m-er-200__benchmark": "mnist-361"}, ["runs.m-er-200.benchmark", "mnist-361"]),
    ({"runs__m-er-200__buffer": None}, ["runs.m-er-200 lacks the key 'buffer'"]),
    ({"runs__m-er-200__buffer": -5}, ["runs.m-er-200.buffer = -5", "greater than 0", "int > 0", "method 'er'"]),
    ({"runs__m-er-200__buffer": True}, ["runs.m-er-200.buffer = True", "int > 0"]),
    ({"runs__m-er-200__buffer": "none"}, ["runs.m-er-200.buffer = 'none'", "int > 0"]),
    ({"runs__m-sgd__buffer": 200}, ["runs.m-sgd.buffer = 200", "'none'", "keeps no buffer", "method 'sgd'"]),
    ({"runs__m-er-200__replay_batch": None}, ["runs.m-er-200 lacks the key 'replay_batch'", "buffer samples replayed"]),
    ({"runs__m-er-200__lr": "0.1x"}, ["runs.m-er-200.lr = '0.1x' is not accepted", "float"]),
    ({"runs__m-er-200__lr": float("nan")}, ["runs.m-er-200.lr = nan is not accepted", "finite"]),
    ({"runs__m-er-200__lr": float("inf")}, ["runs.m-er-200.lr = inf is not accepted", "finite"]),
    ({"runs__m-er-200__batch": 1.5}, ["runs.m-er-200.batch = 1.5", "int"]),
    ({"runs__m-er-200__batch": True}, ["runs.m-er-200.batch = True", "int"]),
    ({"runs__m-er-200__lr": -0.1}, ["runs.m-er-200.lr = -0.1", "greater than 0", "float > 0"]),
    ({"runs__m-er-200__replay_bach": 16}, ["unknown key 'replay_bach'", "accepted keys"]),
    ({"runs__m-er-200__epochs": 0}, ["runs.m-er-200.epochs = 0", "greater than 0", "int > 0 or None",
                                     "overriding its benchmark's epochs"]),
    ({"runs__m-er-200__width": "wide"}, ["runs.m-er-200.width = 'wide'", "int > 0 or None",
                                         "overriding its benchmark's width"]),
    ({"runs__m-er-200__seeds": [1, 1]}, ["runs.m-er-200.seeds = [1, 1]", "seeds must be distinct"]),
    ({"runs__m-er-200__algorithm": "er"}, ["runs.m-er-200 has an unknown key 'algorithm'"]),
    ({"runs__s-coca-200__omega": 1.5}, ["runs.s-coca-200.omega = 1.5", "less than or equal to 1"]),
    ({"runs__s-coca-200__gamma": -0.1}, ["runs.s-coca-200.gamma = -0.1", "greater than or equal to 0"]),
    ({"methods__coca__lambda2": "x"}, ["lambda2"]),
    ({"methods__coca__lambda3": 1.0}, ["methods.coca has unknown key(s) ['lambda3']"]),
    ({"methods__er-x": {"algorithm": "err"}}, ["methods.er-x.algorithm", "known methods"]),
    ({"report__figures": "yes"}, ["report.figures = 'yes'"]),
    ({"report__visualise": {"benchmark": "mnist-360", "cells": ["er/500"]}}, ["report.visualise.cells", "er/500"]),
    ({"report__colour": "blue"}, ["report has an unknown key 'colour'"]),
])
def test_bad_run_settings_name_the_key(change, words):
    with pytest.raises(ParamsError) as err:
        check_runs(params(**change))
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("change, words", [
    ({"benchmarks__mnist-360__kind": "mnist-720"}, ["benchmarks.mnist-360.kind", "known kinds"]),
    ({"benchmarks__mnist-360__source": "emnist"}, ["benchmarks.mnist-360.source", "emnist"]),
    ({"benchmarks__mnist-360__epochs": 0}, ["benchmarks.mnist-360.epochs = 0", "greater than 0"]),
    ({"benchmarks__mnist-360__backbone": "vit"}, ["benchmarks.mnist-360.backbone = 'vit'", "'mlp' or 'resnet18'"]),
    ({"benchmarks__mnist-360__validation_fraction": 1.0}, ["validation_fraction = 1.0", "less than 1"]),
    ({"benchmarks__mnist-360__compile": "yes"}, ["benchmarks.mnist-360.compile = 'yes' is not accepted (bool or 'auto'"]),
    ({"benchmarks__seq__n_tasks": None}, ["benchmarks.seq lacks the key 'n_tasks'"]),
    ({"benchmarks__seq__draw": "with-replacement"}, ["benchmarks.seq has an unknown key 'draw'"]),
    ({"sources__kmnist": {}}, ["sources.kmnist", "known sources"]),
    ({"sources__mnist-bundled__train_per_class": -3}, ["sources.mnist-bundled.train_per_class = -3",
                                                       "greater than or equal to 1"]),
    ({"sources__mnist-bundled__train_per_clas": 300}, ["unknown key 'train_per_clas'"]),
    ({"sources__mnist-bundled__train_per_class": 450}, ["exceeds the 500 images per digit"]),
    ({"seeds": [0, -1]}, ["seeds"]),
    ({"seeds": []}, ["seeds"]),
    ({"seeds": [0, 0]}, ["seeds must be distinct"]),
    ({"device": "tpu"}, ["params.yaml.device = 'tpu'"]),
    ({"workers": 0}, ["params.yaml.workers = 0", "greater than or equal to 1"]),
    ({"workers": "many"}, ["params.yaml.workers = 'many'", "(int or 'auto': processes"]),
    ({"wokers": 2}, ["params.yaml has an unknown key 'wokers'"]),
])
def test_bad_data_and_top_level_settings_name_the_key(change, words):
    with pytest.raises(ParamsError) as err:
        check_data(params(**change))
    for w in words:
        assert w in str(err.value)


def test_a_bad_run_does_not_stop_data_preparation():
    p = params(**{"runs__m-er-200__lr": "fast"})
    check_data(p)                                 # sources and benchmarks resolve
    with pytest.raises(ParamsError, match="runs.m-er-200.lr"):
        check_runs(p)


def test_two_runs_writing_one_folder_are_refused():
    p = params()
    p["runs"]["copy"] = dict(p["runs"]["m-er-200"])
    with pytest.raises(ParamsError, match="both write runs/mnist-360/er/200"):
        check_runs(p)


def test_boundary_methods_are_refused_on_general_continual_benchmarks(monkeypatch):
    @register
    class NeedsBoundaries(Method):
        name = "test-needs-boundaries"
        needs_boundaries = True

    try:
        p = params()
        p["methods"]["test-needs-boundaries"] = {}
        p["runs"]["x"] = {"benchmark": "mnist-360", "method": "test-needs-boundaries", "buffer": "none",
                          "lr": 0.1, "batch": 4}
        with pytest.raises(ParamsError, match="needs task boundaries, and benchmark 'mnist-360' has none"):
            check_runs(p)
        p["runs"]["x"]["benchmark"] = "seq"
        check_runs(p)
    finally:
        del METHODS["test-needs-boundaries"]


def test_resolve_merges_defaults_method_block_and_run():
    p = params()
    p["methods"]["er-slow"] = {"algorithm": "er", "lr": 0.01}
    p["runs"]["slow"] = {"benchmark": "mnist-360", "method": "er-slow", "buffer": 500, "batch": 1, "replay_batch": 8}
    spec = resolve_run(p, "slow")
    run = spec.run
    assert run.algorithm == "er" and run.method == "er-slow" and run.lr == 0.01 and run.buffer == 500
    assert type(run) is METHODS["er"].Run and list(run.model_dump())[:4] == ["benchmark", "method", "buffer", "algorithm"]
    coca = resolve_run(p, "s-coca-200").run
    assert coca.lambda1 == 0.5 and coca.omega == 0.1 and coca.ckd is True   # block, then defaults
    assert spec.seeds == [0, 1] and spec.device == "cpu"


def test_a_resolved_run_reads_back_from_its_json_as_the_same_typed_settings(tmp_path):
    """resolved/runs/<run>.json is the wire format: written as JSON, read back with model_validate, typed again."""
    from gcl.core.atomic import write_json
    from gcl.training.spec import ResolvedRun
    spec = resolve_run(params(**{"runs__s-coca-200__epochs": 2}), "s-coca-200")
    path = tmp_path / "s-coca-200.json"
    write_json(path, {**spec.to_json(), "code": "abc"})
    back = ResolvedRun.model_validate(json.loads(path.read_text()))
    assert back == spec.model_copy(update={"code": "abc"}) and back.code == "abc" and "code" not in back.to_json()
    assert type(back.run) is METHODS["coca"].Run and back.run.lambda1 == 0.5
    assert back.benchmark.epochs == 2 and back.benchmark.augment is False and back.data.n_tasks == 5


def test_a_method_block_holds_its_settings_and_algorithm_only():
    with pytest.raises(ParamsError, match=r"methods.er has unknown key\(s\) \['buffer'\]"):
        resolve_run(params(**{"methods__er": {"buffer": 200}}), "m-er-200")


def test_benchmark_settings_are_split_by_what_they_change():
    data = check_data(params())["benchmarks"]["mnist-360"]
    assert data["data"] == {"kind": "mnist-360", "source": "mnist-bundled", "validation_fraction": 0.0}
    assert set(data) == {"data", "training"}
    spec = resolve_run(params(), "m-er-200")
    assert spec.benchmark.epochs == 1 and spec.benchmark.draw == "without-replacement"


def test_every_benchmark_setting_declares_its_group():
    """A kind's fields are data (the benchmark file is built from them) or training settings, each declared so:
    a field without a group stops the registration, instead of landing silently in one of them."""
    from typing import Literal

    from gcl.data.benchmark_registry import BenchmarkSettings, data_setting, register_kind

    class Ungrouped(BenchmarkSettings):
        kind: Literal["test-ungrouped"] = data_setting()
        shape: int = 3

    with pytest.raises(TypeError, match=r"\['shape'\] declare no group"):
        register_kind(Ungrouped)
    seq = check_data(params())["benchmarks"]["seq"]
    assert list(seq["data"]) == ["kind", "source", "validation_fraction", "n_tasks", "classes_per_task", "normalize",
                                 "class_order"]
    assert list(seq["training"]) == ["backbone", "epochs", "width", "input_size", "bf16", "channels_last", "stack",
                                     "compile", "augment", "kind"]


@pytest.mark.parametrize("key, home", [("label", "report.benchmarks.mnist-360.label"), ("threads", "top-level `threads`")])
def test_a_setting_that_left_the_benchmark_block_says_where_it_went(key, home):
    """A train stage depends on its benchmark's whole block, so what changes no result lives elsewhere."""
    p = params()
    p["benchmarks"]["mnist-360"][key] = 1 if key == "threads" else "a caption"
    with pytest.raises(ParamsError, match=f"benchmarks.mnist-360.{key}: this setting has moved to .*{re.escape(home)}"):
        check_data(p)


def test_the_caption_and_threads_come_from_their_own_blocks():
    p = params()
    p["report"] = {"benchmarks": {"mnist-360": {"label": "rotating digits"}}}
    p["threads"] = 2
    assert resolve_report(p)["benchmarks"]["mnist-360"]["label"] == "rotating digits"
    assert resolve_report(p)["benchmarks"]["seq"]["label"] == ""
    assert resolve_runtime(p)["threads"] == 2


def test_a_run_may_override_its_benchmarks_epochs_and_width():
    p = params(**{"runs__s-coca-200__epochs": 3, "runs__s-coca-200__width": 16})
    spec = resolve_run(p, "s-coca-200")
    assert (spec.key, spec.benchmark.epochs, spec.benchmark.width) == ("s-coca-200", 3, 16)
    assert resolve_run(p, "m-er-200").benchmark.epochs == 1
    assert resolve_run(params(**{"runs__s-coca-200__seeds": [7]}), "s-coca-200").seeds == [7]


PROFILE_FILES = ["params.yaml", *sorted(f"profiles/{p.name}" for p in (ROOT / "profiles").glob("*.yaml"))]


@pytest.mark.parametrize("profile", PROFILE_FILES)
def test_every_profile_is_valid(profile):
    p = yaml.safe_load((ROOT / profile).read_text())
    check_all(p)


@pytest.mark.parametrize("option", ["bf16", "channels_last"])
def test_precision_and_layout_are_training_settings_not_data(option):
    """Toggling bf16 or channels_last re-runs the benchmark's train stages, never its benchmark@ stage: the
    benchmark file is built from the data group alone."""
    plain = check_data(params())["benchmarks"]["seq"]
    toggled = check_data(params(**{f"benchmarks__seq__{option}": True}))["benchmarks"]["seq"]
    assert toggled["data"] == plain["data"] and option not in toggled["data"]
    assert toggled["training"][option] is True and plain["training"][option] is False
    assert getattr(resolve_run(params(**{f"benchmarks__seq__{option}": True}), "s-coca-200").benchmark, option) is True


@pytest.mark.parametrize("profile", PROFILE_FILES)
def test_params_files_read_the_same_with_libyaml_as_in_pure_python(profile):
    from gcl.config import load_params
    assert load_params(ROOT / profile) == yaml.safe_load((ROOT / profile).read_text())


def test_a_params_file_that_is_not_yaml_is_named(tmp_path):
    from gcl.config import load_params
    bad = tmp_path / "params.yaml"
    bad.write_text("seeds: [0, 1\nworkers: 2\n")
    with pytest.raises(ParamsError, match="params.yaml is not valid YAML"):
        load_params(bad)


def test_a_stage_refuses_a_resolved_file_that_params_yaml_has_moved_past(tmp_path):
    """`dvc repro -s train@<run>` after an edit skips check@runs: the stage compares the file check@runs wrote
    with params.yaml now, and refuses naming what changed and the fix, instead of training the old settings."""
    from gcl.config import read_current
    from gcl.core.atomic import write_json
    p = params()
    path = tmp_path / "resolved" / "runs" / "m-er-200.json"
    write_json(path, {**resolve_run(p, "m-er-200").to_json(), "code": "abc"})
    read = read_current(path, resolve_run(p, "m-er-200"), "runs.m-er-200", "train@m-er-200")
    assert read.code == "abc" and read.run.lr == 0.2 and type(read.run) is METHODS["er"].Run
    p["runs"]["m-er-200"]["lr"] = 0.05
    p["device"] = "cuda:7"
    with pytest.raises(ParamsError, match=r"runs.m-er-200: device, lr changed in params.yaml since check@runs .*"
                                          r"`dvc repro train@m-er-200` \(without -s"):
        read_current(path, resolve_run(p, "m-er-200"), "runs.m-er-200", "train@m-er-200")


def test_the_data_stages_read_their_resolved_settings_back(tmp_path):
    """prepare@ reads its source's settings back typed; benchmark@ its benchmark's data settings (as JSON, which
    build_benchmark validates as the kind's Data); either refuses a file params.yaml has moved past."""
    from gcl.config import read_current, resolve_benchmark, resolve_source
    from gcl.core.atomic import write_json
    from gcl.data.benchmarks import data_settings
    from gcl.data.sources import SOURCES
    p = params()
    resolved = check_data(p)
    path = tmp_path / "resolved" / "data" / "sources" / "mnist-bundled.json"
    write_json(path, resolved["sources"]["mnist-bundled"])
    source = read_current(path, resolve_source(p, "mnist-bundled"), "sources.mnist-bundled", "prepare@mnist-bundled")
    assert type(source) is SOURCES["mnist-bundled"].Settings and source.train_per_class == 400
    path = tmp_path / "resolved" / "data" / "benchmarks" / "seq.json"
    write_json(path, {"data": resolved["benchmarks"]["seq"]["data"]})
    data = read_current(path, {"data": resolve_benchmark(p, "seq")["data"]}, "benchmarks.seq", "benchmark@seq")["data"]
    assert data_settings(data) == resolve_benchmark(p, "seq")["data"] and data_settings(data).n_tasks == 5
    p["benchmarks"]["seq"]["normalize"] = False
    with pytest.raises(ParamsError, match=r"benchmarks.seq: data.normalize changed in params.yaml since check@data"):
        read_current(path, {"data": resolve_benchmark(p, "seq")["data"]}, "benchmarks.seq", "benchmark@seq")
