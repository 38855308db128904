"""The report reads exactly the runs params.yaml lists, puts each beside the paper row its settings name,
writes its accuracies (tables.md) apart from its costs (costs.md), and writes all of its outputs or none.
Metrics files are fabricated in tmp_path."""
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from gcl.core.atomic import write_json
from gcl.report.common import ReportError
from gcl.report.write import OUTPUTS, write_report

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "reference").glob("*.csv"))
ABLATION = ["coca-off", "coca-ckd", "coca-pt", "coca-scl", "coca-pt-scl", "coca-ckd-pt", "coca-ckd-scl"]


ENV = {"torch": "2.14.1", "device": "Some CPU", "threads": 1, "precision": "fp32"}


def fake_run(benchmark, method, buffer, accs, task_il=None, acc_matrix=None, extra=None, env=ENV, run=None,
             steps=None):
    """A run's metrics.json; `steps`: each seed's SGD steps (with 4 samples a step), else none recorded."""
    seeds = {}
    for i, a in enumerate(accs):
        seeds[str(i)] = {"class_il": a, "task_il": task_il, "forgetting": 1.0, "train_seconds": 2.0,
                         "samples_per_second": 100.0, "curve": [a / 2, a], "acc_matrix": acc_matrix,
                         "confusion": [[3, 1], [0, 2]], "environment": env,
                         **({"steps": steps[i], "samples": 4 * steps[i]} if steps else {}),
                         **({"method_metrics": extra} if extra else {})}
    write_json(Path("runs", benchmark, method, str(buffer), "metrics.json"),
               {"benchmark": benchmark, "method": method, "buffer": buffer, "device": "cpu", "seeds": seeds,
                "config": {"run": run}})


def add(resolved, benchmark, method, buffer, accs, algorithm=None, settings=None, **kw):
    """A run of params.yaml (`settings`: its method settings besides lr) and its metrics.json."""
    run = {"benchmark": benchmark, "method": method, "buffer": buffer, "algorithm": algorithm or method, "lr": 0.1,
           **(settings or {})}
    resolved["runs"][f"{benchmark}-{method}-{buffer}"] = run
    resolved["methods"].setdefault(method, {"algorithm": algorithm or method})
    fake_run(benchmark, method, buffer, accs, run=run, **kw)


REPORT = {  # what a profile's report block says (here: the default profile's mappings, abridged)
    "figures": False,
    "benchmarks": {"mnist-360": {"label": "bundled digits"}, "seq-cifar10": {"label": "Seq-CIFAR-10"}},
    "methods": {"der": {"label": "DER", "paper_table": "der_paper",
                        "notes": [{"text": "plain DER as the DER paper reports it."}]},
                "derpp": {"label": "DER++", "paper_row": "der",
                          "notes": [{"text": "the CoCa paper's DER row = the DER paper's DER++.",
                                     "benchmarks": ["mnist-360", "seq-cifar10", "seq-tinyimg"]}]},
                "coca-off": {"label": "ER (all off)", "paper_row": "er"},
                "coca-ckd": {"label": "CKD", "paper_row": "coca[ckd]"},
                "coca-scl": {"label": "SCL", "paper_row": "coca[scl]"},
                "coca-ckd-scl": {"label": "CKD+SCL", "paper_row": "coca[ckd+scl]"}},
    "tables": [{"title": "Table 1: Class-IL", "paper_table": "table1_gcl", "exclude": ABLATION},
               {"title": "Table 2: Task-IL", "metric": "task_il", "paper_table": "table2_task_il", "exclude": ABLATION},
               {"title": "Table 3: ablation", "paper_table": "table3_ablation", "rows": ABLATION + ["coca"],
                "labels": {"coca": "CKD+PT+SCL (CoCa)"}, "stand_in": {"coca-off": "er"}}],
}


@pytest.fixture
def resolved(tmp_path, monkeypatch):
    """A resolved report (what check@runs writes to resolved/runs/report.json) and its runs on disk."""
    monkeypatch.chdir(tmp_path)
    r = {"seeds": [0, 1],
         "benchmarks": {"mnist-360": {"label": "bundled digits", "source": "mnist-bundled", "kind": "mnist-360",
                                      "has_tasks": False},
                        "seq-cifar10": {"label": "Seq-CIFAR-10", "source": "cifar10", "kind": "sequential",
                                        "has_tasks": True}},
         "methods": {}, "runs": {}, "report": json.loads(json.dumps(REPORT))}
    add(r, "mnist-360", "sgd", "none", [20.0, 22.0])
    add(r, "mnist-360", "er", 200, [50.0, 52.0])
    add(r, "mnist-360", "coca", 200, [60.0, 64.0])
    add(r, "mnist-360", "coca-ckd", 200, [55.0, 55.0], algorithm="coca")
    return r


def section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n") + len(heading) + 1
    ends = [i for i in (text.find("\n" + "#" * n + " ", start) for n in range(1, len(level) + 1)) if i >= 0]
    return text[start:min(ends) if ends else len(text)]


def table(text: str) -> dict[str, dict[str, str]]:
    """The first markdown table in `text`: {first cell: {column header: cell}}."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def tables_md() -> str:
    return Path("results/tables.md").read_text()


def costs_md() -> str:
    return Path("results/costs.md").read_text()


# ---------------------------------------------------------------------------- item 1: nothing hard-coded

def test_tables_put_our_mean_std_beside_the_paper(resolved):
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["er"]["B=200 ours"] == "51.00 ± 1.41" and t1["er"]["B=200 paper"] == "49.27"
    assert t1["sgd"]["no buffer ours"] == "21.00 ± 1.41" and t1["sgd"]["no buffer paper"] == "19.02"
    assert t1["coca"]["B=200 paper"] == "67.02"
    assert "coca-ckd" not in t1 and "CKD" not in t1                       # Table 3's configuration: excluded
    t3 = table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))
    assert list(t3) == ["er", "CKD", "CKD+PT+SCL (CoCa)"]    # ER, named as itself, stands in for the all-off row
    assert t3["er"]["B=200 ours"] == "51.00 ± 1.41" and t3["er"]["B=200 paper"] == "49.27"
    assert t3["CKD"]["B=200 ours"] == "55.00 ± 0.00" and t3["CKD"]["B=200 paper"] == "56.71"
    assert t3["CKD+PT+SCL (CoCa)"]["B=200 paper"] == "67.02"
    assert "## Table 2" not in tables_md()                               # no tasks: no Task-IL table, and a line why
    assert "- Table 2: Task-IL: no benchmark of this profile has tasks." in section(tables_md(), "## Data")
    assert "bundled digits" in tables_md()


def test_a_tables_buffers_keep_only_those_columns(resolved):
    add(resolved, "mnist-360", "er", 500, [60.0, 62.0])
    add(resolved, "mnist-360", "coca", 500, [70.0, 70.0])
    resolved["report"]["tables"][0]["buffers"] = [500, "none"]
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert list(t1["er"]) == ["method", "no buffer ours", "no buffer paper", "B=500 ours", "B=500 paper"]
    assert t1["er"]["B=500 ours"] == "61.00 ± 1.41" and t1["coca"]["B=500 ours"] == "70.00 ± 0.00"
    t3 = table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))
    assert "B=500 ours" in t3["er"] and "B=200 ours" in t3["er"]         # another table keeps every buffer


def test_rows_order_labels_and_paper_rows_come_from_the_report_block(resolved):
    """A profile the report has never seen: its own names, order and paper rows, defaults elsewhere."""
    add(resolved, "mnist-360", "mine", 200, [40.0, 40.0], algorithm="er")   # paper row defaults to its algorithm
    add(resolved, "mnist-360", "coca-ckd-scl", 200, [70.0, 72.0], algorithm="coca")
    resolved["report"]["order"] = ["coca", "mine", "er"]
    resolved["report"]["methods"]["mine"] = {"label": "My ER"}
    resolved["report"]["methods"]["sgd"] = {"paper_row": "-"}               # no paper row
    resolved["report"]["tables"][0]["exclude"] = []
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert list(t1)[:3] == ["coca", "My ER", "er"]                         # order, then the rest alphabetically
    assert t1["My ER"]["B=200 ours"] == "40.00 ± 0.00" and t1["My ER"]["B=200 paper"] == "49.27"
    assert t1["sgd"]["no buffer paper"] == "-"
    assert t1["CKD+SCL"]["B=200 paper"] == "-"                             # coca[ckd+scl] is a Table 3 row only
    t3 = table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))
    assert t3["CKD+SCL"]["B=200 ours"] == "71.00 ± 1.41" and t3["CKD+SCL"]["B=200 paper"] == "66.46"


def test_ablation_uses_the_all_off_configuration_where_it_ran(resolved):
    add(resolved, "mnist-360", "coca-off", 200, [47.0, 49.0], algorithm="coca")
    write_report(resolved, "results", PAPER)
    t3 = table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))
    assert t3["ER (all off)"]["B=200 ours"] == "48.00 ± 1.41 ≈" and t3["ER (all off)"]["B=200 paper"] == "49.27"


def test_a_method_the_report_does_not_name_shows_its_key_beside_its_algorithms_paper_row(resolved):
    add(resolved, "mnist-360", "er-again", 200, [57.0, 57.0], algorithm="er")
    add(resolved, "mnist-360", "er-ace", 200, [58.0, 58.0])
    resolved["report"]["methods"].pop("er-ace", None)
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["er-again"]["B=200 paper"] == "49.27"       # the paper's ER
    assert t1["er-ace"]["B=200 paper"] == "-"            # a row the paper's file lacks: no number


def test_a_method_sent_to_its_own_papers_table_is_read_there_despite_no_coca_paper_row(resolved):
    """ER-ACE has no CoCa-paper row; a profile that sends it to the ER-ACE paper's table (paper_table: erace_paper)
    must show that paper's number, not '-'."""
    resolved["benchmarks"]["online-cifar10"] = {"label": "online", "source": "cifar10", "kind": "sequential",
                                                "has_tasks": True}
    add(resolved, "online-cifar10", "er-ace", 1000, [46.0, 47.0], task_il=83.0)
    resolved["report"]["methods"]["er-ace"] = {"label": "ER-ACE", "paper_table": "erace_paper"}
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### online-cifar10"))
    assert t1["ER-ACE"]["B=1000 ER-ACE paper"] == "52.20"
    resolved["report"]["methods"]["er-ace"]["paper_row"] = "-"            # the block's own '-' still means none
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### online-cifar10"))
    assert "B=1000 ER-ACE paper" not in t1["ER-ACE"] or t1["ER-ACE"]["B=1000 ER-ACE paper"] == "-"


def test_each_column_of_the_erace_papers_table_reads_its_own_published_number(resolved):
    """The ER-ACE paper publishes ER-ACE without augmentation (52.2 at M = 100) and with it (53.7): the benchmark
    with augmentation must show its own column's number, not the other's."""
    for name in ("online-cifar10", "online-cifar10-aug"):
        resolved["benchmarks"][name] = {"label": name, "source": "cifar10", "kind": "sequential", "has_tasks": True}
        add(resolved, name, "er-ace", 1000, [46.0, 47.0], task_il=83.0)
    resolved["report"]["methods"]["er-ace"] = {"label": "ER-ACE", "paper_table": "erace_paper"}
    write_report(resolved, "results", PAPER)
    text = section(tables_md(), "## Table 1: Class-IL")
    assert table(section(text, "### online-cifar10"))["ER-ACE"]["B=1000 ER-ACE paper"] == "52.20"
    assert table(section(text, "### online-cifar10-aug"))["ER-ACE"]["B=1000 ER-ACE paper"] == "53.70"


# ---------------------------------------------------------------------------- item 2: defects

def test_der_rows_are_compared_with_the_right_paper_rows_and_task_il_has_no_class_il_number(resolved):
    for bench in ("mnist-360", "seq-cifar10"):
        add(resolved, bench, "der", 200, [56.0, 56.0], task_il=90.0 if bench == "seq-cifar10" else None)
        add(resolved, bench, "derpp", 200, [57.0, 57.0], task_il=91.0 if bench == "seq-cifar10" else None)
    write_report(resolved, "results", PAPER)
    text = tables_md()
    t1 = table(section(section(text, "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["DER"]["B=200 paper"] == "-" and t1["DER"]["B=200 DER paper"] == "55.22"   # the DER paper's plain DER
    assert t1["DER++"]["B=200 paper"] == "54.16"        # the CoCa paper's "DER" row = DER++
    t1c = table(section(section(text, "## Table 1: Class-IL"), "### seq-cifar10"))
    assert t1c["DER"]["B=200 DER paper"] == "61.93" and t1c["DER++"]["B=200 DER paper"] == "-"
    t2 = table(section(section(text, "## Table 2: Task-IL"), "### seq-cifar10"))
    assert t2["DER"]["B=200 ours"] == "90.00 ± 0.00"
    assert t2["DER"]["B=200 paper"] == "-" and "B=200 DER paper" not in t2["DER"]   # the DER paper: Class-IL only
    assert t2["DER++"]["B=200 paper"] == "91.92"


def test_a_note_is_written_only_where_it_is_true(resolved):
    resolved["benchmarks"]["seq-cifar100"] = {"label": "C100", "source": "cifar100", "kind": "sequential",
                                              "has_tasks": True}
    for bench in ("seq-cifar10", "seq-cifar100"):
        add(resolved, bench, "derpp", 200, [57.0, 57.0], task_il=80.0)
    write_report(resolved, "results", PAPER)
    t1 = section(tables_md(), "## Table 1: Class-IL")
    note = "DER++: the CoCa paper's DER row = the DER paper's DER++."
    assert note in section(t1, "### seq-cifar10")
    assert note not in section(t1, "### seq-cifar100")                   # the DER paper has no CIFAR-100
    assert table(section(t1, "### seq-cifar100"))["DER++"]["B=200 paper"] == "18.66"
    assert "plain DER" not in tables_md()                                # no DER row: no DER note


def test_paper_numbers_print_with_two_decimals(resolved):
    add(resolved, "mnist-360", "coca-scl", 500, [70.0, 70.0], algorithm="coca")
    add(resolved, "mnist-360", "coca-ckd", 500, [60.0, 60.0], algorithm="coca")
    write_report(resolved, "results", PAPER)
    t3 = table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))
    assert t3["SCL"]["B=500 paper"] == "66.90"                           # reference file: 66.9
    assert t3["SCL"]["B=500 ours"] == "70.00 ± 0.00"


def test_an_ablation_needs_min_rows_of_its_rows_and_says_which_profile_fills_it(resolved):
    t3 = resolved["report"]["tables"][2]
    t3.update(min_rows=2, filled_by="profiles/mnist-360.yaml")
    write_report(resolved, "results", PAPER)              # CKD and CoCa, two of its rows, ran on mnist-360
    assert table(section(section(tables_md(), "## Table 3: ablation"), "### mnist-360"))["CKD"]
    t3["min_rows"] = 3
    write_report(resolved, "results", PAPER)
    assert "## Table 3: ablation" not in tables_md()
    assert ("- Table 3: ablation: needs runs of 3 of its rows on one benchmark; profiles/mnist-360.yaml fills it."
            in tables_md())


def test_buffers_sort_numerically(resolved):
    for b in (5120, 1000, 500):
        add(resolved, "seq-cifar10", "er", b, [40.0, 40.0], task_il=80.0)
    add(resolved, "seq-cifar10", "er", 200, [30.0, 30.0], task_il=70.0)
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### seq-cifar10"))
    assert [k for k in t1["er"] if k.endswith("ours")] == ["B=200 ours", "B=500 ours", "B=1000 ours", "B=5120 ours"]
    assert t1["er"]["B=5120 paper"] == "82.47"
    cost = table(section(costs_md(), "## Forgetting and cost per run"))   # keyed by benchmark: last row wins
    lines = [ln for ln in section(costs_md(), "## Forgetting and cost per run").splitlines()
             if ln.startswith("| seq-cifar10")]
    assert [ln.split("|")[3].strip() for ln in lines] == ["200", "500", "1000", "5120"]
    assert cost


# ---------------------------------------------------------------------------- item 3: metrics.json

def test_metrics_hold_the_main_method_and_the_best_baseline_per_buffer(resolved):
    add(resolved, "mnist-360", "coca-g001", 200, [70.0, 70.0], algorithm="coca")   # a CoCa variant: no baseline
    add(resolved, "mnist-360", "joint", "none", [90.0, 90.0])
    add(resolved, "seq-cifar10", "coca", 500, [50.0, 52.0], task_il=90.0)
    add(resolved, "seq-cifar10", "er", 500, [45.0, 45.0], task_il=88.0)
    add(resolved, "seq-cifar10", "derpp", 500, [48.0, 48.0], task_il=89.5)
    write_report(resolved, "results", PAPER)
    metrics = json.loads(Path("results/metrics.json").read_text())
    assert metrics == {"mnist-360": {"200": {"coca": {"class_il": 62.0},
                                             "best_baseline": {"method": "er", "class_il": 51.0}}},
                       "seq-cifar10": {"500": {"coca": {"class_il": 51.0, "task_il": 90.0},
                                               "best_baseline": {"method": "derpp", "class_il": 48.0,
                                                                 "task_il": 89.5}}}}
    head = table(section(tables_md(), "## Headline: coca against the best baseline (Class-IL)"))
    # keyed by benchmark
    assert head["seq-cifar10"]["best baseline"] == "DER++" and head["seq-cifar10"]["baseline paper"] == "72.70"
    assert head["seq-cifar10"]["coca ours"] == "51.00 ± 1.41" and head["seq-cifar10"]["coca paper"] == "76.27"
    assert head["mnist-360"]["best baseline"] == "er" and head["mnist-360"]["baseline ours"] == "51.00 ± 1.41"
    assert "train_seconds" in Path("results/summary.csv").read_text().splitlines()[0]   # timings stay per run


def test_a_method_without_memory_competes_at_every_buffer(resolved):
    add(resolved, "seq-cifar10", "coca", 500, [50.0, 52.0], task_il=90.0)
    add(resolved, "seq-cifar10", "er", 500, [45.0, 45.0], task_il=88.0)
    add(resolved, "seq-cifar10", "lwf", "none", [47.0, 47.0], task_il=70.0)
    write_report(resolved, "results", PAPER)
    best = json.loads(Path("results/metrics.json").read_text())["seq-cifar10"]["500"]["best_baseline"]
    assert best == {"method": "lwf", "class_il": 47.0, "task_il": 70.0}
    head = table(section(tables_md(), "## Headline: coca against the best baseline (Class-IL)"))
    assert head["seq-cifar10"]["best baseline"] == "lwf (no buffer)"
    assert head["seq-cifar10"]["baseline paper"] == "19.61"             # the paper's LwF, no buffer


def test_headline_is_the_top_of_tables_md(resolved):
    write_report(resolved, "results", PAPER)
    headings = [ln for ln in tables_md().splitlines() if ln.startswith("## ")]
    assert headings[0] == "## Headline: coca against the best baseline (Class-IL)"


def test_headline_marks_ours_within_noise_and_gives_ours_minus_paper(resolved):
    """The headline's ≈ follows the rule of the other tables (the paper's number within one seed-std of our
    mean); ours − paper is our mean minus the paper's number, signed."""
    add(resolved, "mnist-360", "coca", 200, [66.0, 68.0])                # 67.00 ± 1.41 beside the paper's 67.02
    write_report(resolved, "results", PAPER)
    head = table(section(tables_md(), "## Headline: coca against the best baseline (Class-IL)"))["mnist-360"]
    assert head["coca ours"] == "67.00 ± 1.41 ≈" and head["coca paper"] == "67.02"
    assert head["coca ours − paper"] == "-0.02"
    assert head["baseline ours"] == "51.00 ± 1.41" and head["baseline paper"] == "49.27"   # 1.73 apart: no ≈
    assert head["baseline ours − paper"] == "+1.73"
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["coca"]["B=200 ours"] == head["coca ours"] and t1["er"]["B=200 ours"] == head["baseline ours"]
    assert "≈ marks our mean where the published number beside it lies within one seed-std of it" in tables_md().split("\n## ")[0]


def test_tables_md_holds_every_accuracy_and_costs_md_the_costs(resolved):
    """tables.md reads as a results section: accuracy tables only, no cost table before (or among) them; the
    cost of each run and the methods' own metrics are in costs.md, which tables.md links."""
    add(resolved, "mnist-360", "cndpm", "none", [30.0, 32.0], extra={"experts": 4})
    write_report(resolved, "results", PAPER)
    headings = [ln for ln in tables_md().splitlines() if ln.startswith("#")]
    assert headings == ["# Results: our numbers beside the paper's",
                        "## Headline: coca against the best baseline (Class-IL)", "## Data",
                        "## Table 1: Class-IL", "### mnist-360", "## Table 3: ablation", "### mnist-360"]
    assert "[costs.md](costs.md)" in tables_md() and "| forgetting" not in tables_md()
    assert [ln for ln in costs_md().splitlines() if ln.startswith("#")] == [
        "# Costs: forgetting, steps, time and the methods' own metrics", "## Forgetting and cost per run",
        "## Method-specific metrics"]
    assert "[tables.md](tables.md)" in costs_md()


def test_counts_print_as_whole_numbers(resolved):
    """Steps and stream samples are counts: whole numbers (a range where the seeds differ), in the tables and in
    summary.csv, not 910.00 or 910.0."""
    add(resolved, "mnist-360", "er", 200, [50.0, 52.0], steps=[910, 912])
    add(resolved, "mnist-360", "coca", 200, [60.0, 64.0], steps=[1000, 1000])
    write_report(resolved, "results", PAPER)
    cost = section(costs_md(), "## Forgetting and cost per run")
    header = [c.strip() for c in cost.strip().splitlines()[0].strip("|").split("|")]
    rows = {r[1]: dict(zip(header, r)) for r in ([c.strip() for c in ln.strip("|").split("|")]
                                                 for ln in cost.splitlines()[2:] if ln.startswith("|"))}
    assert rows["er"]["steps"] == "910–912" and rows["coca"]["steps"] == "1,000" and rows["sgd"]["steps"] == "-"
    assert rows["er"]["seeds"] == "2" and rows["er"]["train seconds"] == "2.00"
    assert "3,640–4,000 stream samples per seed" in section(tables_md(), "## Data")
    summary = Path("results/summary.csv").read_text().splitlines()
    assert any(",910,3640," in line for line in summary) and not any(",910.0," in line for line in summary)


def test_numbers_print_by_kind():
    """Accuracies with two decimals, ≈ by one rule everywhere, differences signed, counts whole."""
    from gcl.report.display import fmt_count, fmt_difference, fmt_ours
    assert fmt_count(200.0) == "200" and fmt_count(13510, 13516) == "13,510–13,516" and fmt_count(float("nan")) == "-"
    assert fmt_difference(63.69, 67.02) == "-3.33" and fmt_difference(78.14, 76.49) == "+1.65"
    assert fmt_difference(60.0, None) == "-"
    assert fmt_ours(67.0, 1.41, 67.02) == "67.00 ± 1.41 ≈" and fmt_ours(67.0, 1.41, 65.5) == "67.00 ± 1.41"
    assert fmt_ours(67.0, 0.0, 67.0) == "67.00 ± 0.00"                   # one seed (std 0): never ≈


# ---------------------------------------------------------------------------- item 4: plot data

def test_plot_data_curves_average_the_tasks_seen_so_far_and_confusions_list_each_image(resolved):
    add(resolved, "seq-cifar10", "er", 200, [70.0, 70.0], task_il=90.0,
        acc_matrix=[[90.0, 0.0, 0.0], [60.0, 80.0, 0.0], [50.0, 40.0, 90.0]])
    resolved["report"]["visualise"] = {"benchmark": "mnist-360", "cells": ["er/200", "sgd/none"]}
    write_report(resolved, "results", PAPER)
    rows = Path("results/plots/curves/seq-cifar10/er_200.csv").read_text().split()
    assert rows == ["evaluation,accuracy", "1,90.00", "2,70.00", "3,60.00"]   # not (90+0+0)/3 = 30
    mnist = Path("results/plots/curves/mnist-360/er_200.csv").read_text().split()
    assert mnist == ["evaluation,accuracy", "1,25.50", "2,51.00"]              # no tasks: the run's curve
    conf = Path("results/plots/confusion/mnist-360/er_200.csv").read_text().split()
    assert conf == ["actual,predicted", "0,0", "0,0", "0,0", "0,1", "1,1", "1,1"]   # [[3, 1], [0, 2]]
    assert sorted(p.name for p in Path("results/plots/confusion/mnist-360").iterdir()) == ["er_200.csv", "sgd_none.csv"]


def test_dvc_yaml_declares_the_plots_and_the_report_outputs():
    import yaml
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    outs = {next(iter(o)) if isinstance(o, dict) else o: o for o in dvc["stages"]["report"]["outs"]}
    assert outs["results/plots"] == {"results/plots": {"cache": False}}
    plots = {next(iter(p)): p[next(iter(p))] for p in dvc["plots"] if isinstance(p, dict)}
    assert plots["results/plots/curves"]["x"] == "evaluation" and plots["results/plots/curves"]["y"] == "accuracy"
    assert plots["results/plots/confusion"]["template"].startswith("confusion")
    assert "results/metrics.json" in [next(iter(m)) for m in dvc["stages"]["report"]["metrics"]]


def test_dvc_yaml_declares_every_output_of_the_report():
    """Each of write_report's OUTPUTS is an output (or the metrics) of dvc.yaml's report stage, uncached."""
    import yaml
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    declared = {k: v for o in stage["outs"] + stage["metrics"] for k, v in (o.items() if isinstance(o, dict) else [(o, {})])}
    assert {f"results/{name}" for name in OUTPUTS} <= set(declared)
    assert all(declared[f"results/{name}"] == {"cache": False} for name in OUTPUTS)


# ---------------------------------------------------------------------------- item 5: all or nothing

def test_outputs_are_written_only_when_all_succeed(resolved, monkeypatch):
    write_report(resolved, "results", PAPER)
    before = {p: p.read_bytes() for p in Path("results").rglob("*") if p.is_file()}
    fake_run("mnist-360", "er", 200, [10.0, 10.0])            # new numbers ...
    import gcl.report.write
    render_tables = gcl.report.write.render_tables
    monkeypatch.setattr(gcl.report.write, "render_tables", lambda *a, **k: 1 / 0)   # ... and the last output fails
    with pytest.raises(ZeroDivisionError):
        write_report(resolved, "results", PAPER)
    after = {p: p.read_bytes() for p in Path("results").rglob("*") if p.is_file()}
    assert after == before                                     # metrics.json, summary.csv, plots untouched
    assert sorted(os.listdir(".")) == ["results", "runs"]      # no temporary folder left
    assert sorted(os.listdir("results")) == ["costs.md", "figures", "metrics.json", "plots", "summary.csv", "tables.md"]
    Path("results/.report.x1.tmp").mkdir()                      # left by a killed report: removed by the next
    monkeypatch.setattr(gcl.report.write, "render_tables", render_tables)
    write_report(resolved, "results", PAPER)
    assert not Path("results/.report.x1.tmp").exists()


def test_stale_run_folders_are_named_and_ignored(resolved):
    fake_run("mnist-360", "er", 500, [99.0])                   # a run params.yaml no longer lists
    warnings = write_report(resolved, "results", PAPER)
    message = "stale: runs/mnist-360/er/500 is not a run of params.yaml; delete it"
    assert warnings == [message]
    assert f"- {message}" in section(tables_md(), "## Warnings")
    assert "99.00" not in tables_md()
    assert json.loads(Path("results/metrics.json").read_text())["mnist-360"].keys() == {"200"}


def test_a_report_of_part_of_a_grid_draws_what_has_run_and_says_what_has_not(resolved):
    """A workspace part way through a grid (`dvc repro -s report`): the runs without results are named before any
    table and are absent from every table, comparison and claim; the report of the rest is what a report of only
    those runs gives."""
    resolved["report"]["comparisons"] = [{"benchmark": "mnist-360", "against": ["er", "coca-ckd"]}]
    Path("runs/mnist-360/er/200/metrics.json").unlink()
    write_report(resolved, "results", PAPER)
    text = tables_md()
    assert ("**Part of the grid.** 3 of the 4 runs params.yaml lists have results; not run yet: mnist-360-er-200."
            in text)
    assert text.index("**Part of the grid.**") < text.index("## Table 1")
    assert "er" not in table(section(section(text, "## Table 1: Class-IL"), "### mnist-360"))
    assert "Not run yet, so left out: er at B=200." in text
    head = json.loads(Path("results/metrics.json").read_text())["mnist-360"]["200"]
    assert head["best_baseline"]["method"] == "sgd"
    # no run at all: nothing to report, one line
    for run in Path("runs").glob("*/*/*/metrics.json"):
        run.unlink()
    with pytest.raises(ReportError, match="no run has results yet: run `dvc repro`"):
        write_report(resolved, "results", PAPER)


# ---------------------------------------------------------------------------- CN-DPM and other methods' metrics

def test_method_metrics_and_protocol_label(resolved):
    add(resolved, "mnist-360", "cndpm", "none", [30.0, 32.0], extra={"experts": 4, "note": "text is ignored"})
    fake_run("mnist-360", "cndpm", "none", [30.0, 32.0], extra={"experts": 4, "kl": 0.25})
    runs = json.loads(Path("runs/mnist-360/cndpm/none/metrics.json").read_text())
    runs["seeds"]["1"]["method_metrics"].update(experts=6, kl=0.5)
    write_json(Path("runs/mnist-360/cndpm/none/metrics.json"), runs)
    add(resolved, "mnist-360", "icarl", 200, [40.0, 40.0], extra={"exemplars": 200})
    resolved["report"]["methods"]["cndpm"] = {"label": "CN-DPM (its own protocol: split benchmarks)"}
    write_report(resolved, "results", PAPER)
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["CN-DPM (its own protocol: split benchmarks)"]["no buffer ours"] == "31.00 ± 1.41"
    assert "Method-specific" not in tables_md()                          # with the costs, in costs.md
    extra = section(costs_md(), "## Method-specific metrics")
    rows = {ln.split("|")[2].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in extra.splitlines() if ln.startswith("| mnist-360")}
    header = [c.strip() for c in next(ln for ln in extra.splitlines() if ln.startswith("|")).strip("|").split("|")]
    cndpm, icarl = (dict(zip(header, rows[k])) for k in ("CN-DPM (its own protocol: split benchmarks)", "icarl"))
    legend = [ln for ln in extra.splitlines() if ln.startswith("- **")]     # every column defined above the table
    assert [ln.split("**")[1] for ln in legend] == header[3:]
    assert "- **experts**: CN-DPM: the experts it created over the stream." in legend
    assert "- **kl**: CN-DPM (its own protocol: split benchmarks): a number of its own (`method_metrics` in its runs' " \
           "metrics.json)." in legend                            # a metric no method documents: named by who reports it
    assert cndpm["experts"] == "4–6" and cndpm["kl"] == "0.38"     # a count's range over seeds; another number's mean
    assert icarl["exemplars"] == "200" and icarl["experts"] == "-"  # a count: a whole number, not 200.00
    summary = pd.read_csv("results/summary.csv")
    assert "method_metrics.experts" in summary.columns
    line = Path("results/summary.csv").read_text().splitlines()[1 + summary.index[summary.method == "icarl"][0]]
    assert ",200," in line + "," and "200.0" not in line                 # summary.csv: counts as integers too


# ---------------------------------------------------------------------------- figures

def test_sensitivity_figure_reads_the_swept_value_from_each_run(resolved):
    for name, omega, accs in (("coca-w05", 0.5, [61.0, 63.0]), ("coca-w09", 0.9, [58.0, 60.0])):
        add(resolved, "mnist-360", name, 200, accs, algorithm="coca", settings={"omega": omega})
    sweep = {"parameter": "omega", "methods": ["coca-w05", "coca-w09"]}
    resolved["report"].update(figures=True, sensitivity={"benchmark": "mnist-360", "buffer": 200, "sweeps": [sweep]})
    write_report(resolved, "results", PAPER)
    assert Path("results/figures/sensitivity.png").stat().st_size > 1000
    sweep["methods"].append("coca-w01")
    with pytest.raises(ReportError, match=r"sweeps\[0\]: no run mnist-360/coca-w01/200"):
        write_report(resolved, "results", PAPER)
    sweep["methods"].pop()
    sweep["parameter"] = "zeta"
    with pytest.raises(ReportError, match=r"sweeps\[0\].parameter: 'coca-w05' has no setting 'zeta'"):
        write_report(resolved, "results", PAPER)


def test_each_seed_says_where_it_was_computed_and_mixed_environments_are_flagged(resolved):
    write_report(resolved, "results", PAPER)
    summary = pd.read_csv("results/summary.csv")
    assert set(summary.env_torch.astype(str)) == {"2.14.1"} and set(summary.env_device) == {"Some CPU"}
    assert "Computed on: torch 2.14.1, Some CPU, 1 thread(s), fp32 (8 seeds)." in tables_md()
    assert "mix environments" not in tables_md()
    add(resolved, "mnist-360", "derpp", 200, [51.0, 53.0], env={**ENV, "torch": "2.11.0", "device": "Other CPU"})
    write_report(resolved, "results", PAPER)
    assert "**These results mix environments**" in tables_md()
    t1 = section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360")
    assert "its cells come from 2 environments: torch 2.14.1, Some CPU, 1 thread(s), fp32 (8 seeds); " \
           "torch 2.11.0, Other CPU, 1 thread(s), fp32 (2 seeds)" in t1
    # a compiled backbone rounds differently: its seeds are another environment (those without the key were eager)
    add(resolved, "mnist-360", "derpp", 200, [51.0, 53.0], env={**ENV, "compiled": "reduce-overhead"})
    write_report(resolved, "results", PAPER)
    t1 = section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360")
    assert "torch 2.14.1, Some CPU, 1 thread(s), fp32 (8 seeds); " \
           "torch 2.14.1, Some CPU, 1 thread(s), fp32, compiled (reduce-overhead) (2 seeds)" in t1
    assert set(pd.read_csv("results/summary.csv").env_compiled.fillna("-")) == {"-", "reduce-overhead"}
    # so do stacked seeds (whatever the size of their stack): one environment more, however many stacks
    add(resolved, "mnist-360", "er", 500, [61.0, 62.0, 63.0], env={**ENV, "stacked": 3})
    add(resolved, "mnist-360", "er", 1000, [71.0, 72.0], env={**ENV, "stacked": 2})
    write_report(resolved, "results", PAPER)
    t1 = section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360")
    assert "torch 2.14.1, Some CPU, 1 thread(s), fp32, seeds stacked (5 seeds)" in t1 and "3 environments" in t1


def test_seeds_from_two_cpu_capabilities_are_two_environments(resolved):
    """One CPU model name covers machines whose kernels dispatch to other instruction sets (AVX2, AVX-512), which
    round float32 otherwise: the report names each capability and says the cells mix them."""
    for buffer, capability in ((500, "AVX512"), (1000, "AVX2")):
        add(resolved, "mnist-360", "er", buffer, [61.0, 62.0], env={**ENV, "cpu_capability": capability})
    write_report(resolved, "results", PAPER)
    assert "**These results mix environments**" in tables_md()
    t1 = section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360")
    assert "torch 2.14.1, Some CPU (AVX512), 1 thread(s), fp32 (2 seeds)" in t1
    assert "torch 2.14.1, Some CPU (AVX2), 1 thread(s), fp32 (2 seeds)" in t1
    assert set(pd.read_csv("results/summary.csv").env_cpu_capability.dropna()) == {"AVX512", "AVX2"}


def test_a_summary_read_back_with_gpu_seeds_and_no_cpu_capability_names_its_environment(tmp_path):
    """A committed reproduction's summary.csv trained on a GPU has an empty env_cpu_capability column, which pandas
    reads back as floats: the environment is still told in words ('-' for the GPU seeds' capability)."""
    from gcl.report.reproductions import read_summary
    from gcl.report.summary import environments, mixes_environments
    frame = pd.DataFrame({"benchmark": ["b", "b"], "method": ["er", "er"], "buffer": ["200", "200"], "seed": [0, 1],
                          "device": ["cuda", "cuda"], "env_torch": ["2.14.1", "2.14.1"], "env_device": ["H200", "H200"],
                          "env_cpu_capability": [None, None], "env_threads": [1, 1], "env_precision": ["fp32", "fp32"]})
    (tmp_path / "results").mkdir()
    frame.to_csv(tmp_path / "results" / "summary.csv", index=False)
    read = read_summary(tmp_path)
    assert read.env_cpu_capability.dtype == float                     # how pandas reads the empty column
    assert environments(read) == ["torch 2.14.1, H200, 1 thread(s), fp32 (2 seeds)"] and not mixes_environments(read)


def test_a_full_disk_writing_the_report_is_one_line_naming_results_and_keeps_the_old_ones(resolved, monkeypatch):
    """pandas' write to an open file carries no file name; the line names results/, which is left as it was."""
    import errno

    from gcl.core.errors import error_line

    def full(*_, **__):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    write_report(resolved, "results", PAPER)
    before = tables_md()
    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(OSError) as failed:
        write_report(resolved, "results", PAPER)
    assert error_line(failed.value).startswith("cannot use results: No space left on device. Fix: free disk space")
    assert tables_md() == before and sorted(os.listdir("results")) == sorted(OUTPUTS)


def test_the_seeds_line_names_the_runs_that_train_other_seeds(resolved):
    """A 10-seed cell must not read as one of the profile's seeds: the line under the title names every run
    whose own `seeds` differ, by method, with the buffers where only some of its runs differ."""
    write_report(resolved, "results", PAPER)
    assert "\nSeeds [0, 1].\n" in tables_md()
    add(resolved, "mnist-360", "er", 500, [60.0, 61.0, 62.0, 63.0])                    # er at B=500 only
    add(resolved, "mnist-360", "coca", 200, [60.0, 61.0, 62.0, 63.0])                  # coca's only run
    write_report(resolved, "results", PAPER)
    assert "\nSeeds [0, 1] except 4 seeds (0-3) for coca, er at B=500.\n" in tables_md()   # params.yaml's order
    add(resolved, "seq-cifar10", "er", 500, [40.0, 41.0], task_il=80.0)   # the same cell on another benchmark
    write_report(resolved, "results", PAPER)
    assert "\nSeeds [0, 1] except 4 seeds (0-3) for coca, er at mnist-360 B=500.\n" in tables_md()
