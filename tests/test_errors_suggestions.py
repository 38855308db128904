"""A mistyped name in params.yaml (a method, benchmark, run, source, kind or setting) is told the closest known
name, and following that advice gives settings that pass; no line of an error says nothing."""
import pytest

from gcl.config import ParamsError, check_data, check_runs, did_you_mean, resolve_run
from test_config import params


def refusal(check, p) -> str:
    with pytest.raises(ParamsError) as err:
        check(p)
    return str(err.value)


# each: (check, the typo as params() changes, the name it must suggest); the suggestion is BASE's own name, so
# following it gives BASE back, which passes
TYPOS = {
    "run's method": (check_runs, {"runs__m-er-200__method": "err"}, "er"),
    "run's benchmark": (check_runs, {"runs__m-er-200__benchmark": "mnist360"}, "mnist-360"),
    "run's setting": (check_runs, {"runs__m-er-200__lr": None, "runs__m-er-200__lrr": 0.2}, "lr"),
    "method block's setting": (check_runs, {"methods__coca__lambda1": None, "methods__coca__lamda1": 0.5}, "lambda1"),
    "top-level key": (check_data, {"workers": None, "wokers": 2}, "workers"),
    "benchmark's source": (check_data, {"benchmarks__seq__source": "mnist-bundle"}, "mnist-bundled"),
    "benchmark's kind": (check_data, {"benchmarks__mnist-360__kind": "mnist360"}, "mnist-360"),
    "benchmark's setting": (check_data, {"benchmarks__seq__epochs": None, "benchmarks__seq__epoch": 1}, "epochs"),
    "source's setting": (check_data, {"sources__mnist-bundled__train_per_class": None,
                                      "sources__mnist-bundled__train_per_clas": 400}, "train_per_class"),
    "report's key": (check_runs, {"report__figures": None, "report__figurs": False}, "figures"),
}


@pytest.mark.parametrize("name", TYPOS)
def test_a_typo_is_told_the_closest_name_and_the_advice_works(name):
    check, typo, suggested = TYPOS[name]
    assert f"did you mean {suggested!r}?" in refusal(check, params(**typo)).splitlines()[0]
    check(params())                                 # the name suggested is the one that passes


def test_a_mistyped_method_is_one_line_naming_er():
    message = refusal(check_runs, params(**{"runs__m-er-200__method": "err"}))
    assert message == "runs.m-er-200.method: 'err' has no block under methods; did you mean 'er'?"


def test_a_registered_method_without_a_block_is_told_the_block_to_add_and_that_works():
    p = params(**{"runs__m-er-200__method": "der", "runs__m-er-200__alpha": 0.5, "runs__m-er-200__batch": 16})
    message = refusal(check_runs, p)
    assert message == ("runs.m-er-200.method: 'der' has no block under methods; the registered method 'der' needs "
                       "one: add `methods.der: {}`")
    p["methods"]["der"] = {}
    check_runs(p)


def test_a_name_close_to_nothing_lists_the_known_ones():
    message = refusal(check_runs, params(**{"runs__m-er-200__method": "xyzzy"}))
    assert "did you mean" not in message and "defined: ['coca', 'er', 'sgd']" in message
    assert "`algorithm:` names a registered one" in message


def test_a_nested_report_key_is_named_where_it_is():
    message = refusal(check_runs, params(report__methods={"er": {"labl": "ER"}}))
    assert message.startswith("report.methods.er has an unknown key 'labl'; accepted keys: [")
    assert message.endswith("did you mean 'label'?")
    tables = [{"title": "T", "paper_tabel": "table1_gcl"}]
    assert "report.tables.0 has an unknown key 'paper_tabel'" in refusal(check_runs, params(report__tables=tables))


def test_an_unknown_run_or_visualised_cell_is_told_the_closest():
    with pytest.raises(ParamsError, match=r"^runs.m-er-20 does not exist; did you mean 'm-er-200'\?$"):
        resolve_run(params(), "m-er-20")
    visualise = {"benchmark": "mnist-360", "cells": ["er/20"]}
    assert refusal(check_runs, params(report__visualise=visualise)).endswith("did you mean 'er/200'?")


def test_a_bad_value_says_which_method_and_where_its_settings_are_listed():
    lines = refusal(check_runs, params(**{"runs__m-er-200__buffer": -5})).splitlines()
    assert lines[1] == "(method 'er': `python -m gcl.describe er` lists its settings)"   # never "'er' is 'er'"
    p = params(**{"methods__coca-x": {"algorithm": "coca"}, "runs__s-coca-200__method": "coca-x",
                  "runs__s-coca-200__omega": 2.0})
    assert refusal(check_runs, p).splitlines()[1] == ("(method 'coca-x' configures 'coca': `python -m gcl.describe "
                                                      "coca` lists its settings)")


def test_did_you_mean():
    assert did_you_mean("err", ["er", "der", "sgd"]) == "; did you mean 'er'?"
    assert did_you_mean("qqq", ["er", "der"]) == ""
    several = did_you_mean(["lamda1", "bta"], ["lambda1", "beta", "tau"])
    assert several == "; did you mean 'lambda1' for 'lamda1', 'beta' for 'bta'?"
