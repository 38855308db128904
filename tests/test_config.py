"""params.yaml validation: every bad value stops with a message naming the key and the fix."""
import copy

import pytest
import yaml

from gcl.config import ParamsError, resolve_run, validate
from gcl.methods.base import METHODS, Method, register

with open("params.yaml") as f:
    DEFAULT = yaml.safe_load(f)


def params(**changes):
    p = copy.deepcopy(DEFAULT)
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


def test_default_profile_is_valid():
    validate(params())


@pytest.mark.parametrize("change, words", [
    ({"runs__mnist-360-er-200__method": "err"}, ["runs.mnist-360-er-200.method", "'err'"]),
    ({"runs__mnist-360-er-200__benchmark": "mnist-361"}, ["runs.mnist-360-er-200.benchmark", "mnist-361"]),
    ({"runs__mnist-360-er-200__buffer": -5}, ["runs.mnist-360-er-200.buffer", "positive integer"]),
    ({"runs__mnist-360-sgd-none__buffer": 200}, ["runs.mnist-360-sgd-none.buffer", "'none'"]),
    ({"runs__mnist-360-er-200__replay_batch": None}, ["replay_batch", "er"]),
    ({"runs__mnist-360-er-200__lr": "0.1x"}, ["runs.mnist-360-er-200.lr", "float"]),
    ({"runs__mnist-360-er-200__batch": 1.5}, ["runs.mnist-360-er-200.batch", "int"]),
    ({"runs__mnist-360-er-200__lr": -0.1}, ["runs.mnist-360-er-200.lr", "greater than 0"]),
    ({"runs__mnist-360-er-200__replay_bach": 16}, ["replay_bach", "accepted keys"]),
    ({"benchmarks__mnist-360__kind": "mnist-720"}, ["benchmarks.mnist-360.kind", "known kinds"]),
    ({"benchmarks__mnist-360__source": "emnist"}, ["benchmarks.mnist-360.source", "emnist"]),
    ({"benchmarks__mnist-360__epochs": 0}, ["benchmarks.mnist-360.epochs", "positive"]),
    ({"sources__kmnist": {}}, ["sources.kmnist", "known sources"]),
    ({"seeds": [0, -1]}, ["seeds"]),
    ({"seeds": []}, ["seeds"]),
    ({"device": "tpu"}, ["device"]),
    ({"methods__er": None}, ["er", "methods"]),
    ({"methods__er-x": {"base": "err"}}, ["methods.er-x.base", "known methods"]),
])
def test_bad_values_name_the_key(change, words):
    with pytest.raises(ParamsError) as err:
        validate(params(**change))
    for w in words:
        assert w in str(err.value)


def test_two_runs_writing_one_cell_are_refused():
    p = params()
    p["runs"]["copy"] = dict(p["runs"]["mnist-360-er-200"])
    with pytest.raises(ParamsError, match="both write runs/mnist-360/er/200"):
        validate(p)


def test_boundary_methods_are_refused_on_general_continual_benchmarks():
    @register
    class NeedsBoundaries(Method):
        name = "test-needs-boundaries"
        needs_boundaries = True

    try:
        p = params()
        p["methods"]["test-needs-boundaries"] = {}
        p["runs"]["x"] = {"benchmark": "mnist-360", "method": "test-needs-boundaries", "buffer": "none",
                          "lr": 0.1, "batch": 4}
        with pytest.raises(ParamsError, match="needs task boundaries"):
            validate(p)
    finally:
        del METHODS["test-needs-boundaries"]


def test_resolve_merges_method_block_and_variant_base():
    p = params()
    p["methods"]["er-slow"] = {"base": "er", "lr": 0.01}
    p["runs"]["slow"] = {"benchmark": "mnist-360", "method": "er-slow", "buffer": 200, "batch": 1, "replay_batch": 8}
    run = resolve_run(p, "slow")
    assert run["algorithm"] == "er" and run["method"] == "er-slow" and run["lr"] == 0.01
    assert "base" not in run


def test_variant_must_carry_its_base_settings_through_a_merge_key():
    """A train stage depends only on its own method's block: a variant that silently inherited its
    base's settings would not re-run when they change, so it must merge them in (YAML `<<`)."""
    p = params()
    p["methods"]["er"] = {"lr": 0.05}
    p["methods"]["er-x"] = {"base": "er", "replay_batch": 4}
    with pytest.raises(ParamsError, match=r"methods.er-x: a variant of 'er' must carry 'er'.s settings \['lr'\]"):
        validate(p)
    merged = yaml.safe_load("methods: {er: &er {lr: 0.05}, er-x: {<<: *er, base: er, replay_batch: 4}}")["methods"]
    assert merged["er-x"] == {"lr": 0.05, "base": "er", "replay_batch": 4}
    p["methods"] = {**p["methods"], **merged}
    validate(p)


@pytest.mark.parametrize("profile", ["profiles/paper.yaml", "profiles/ci.yaml"])
def test_every_profile_is_valid(profile):
    with open(profile) as f:
        validate(yaml.safe_load(f))
