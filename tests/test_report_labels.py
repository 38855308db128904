"""Only true labels: a published number stands under its own source's name (never under "paper" unless it is the
CoCa paper's), the environment note is one plain line where seeds differ only in stacking, a table the profile
cannot fill says which profile fills it, and every column of costs.md is defined."""
import re

import pandas as pd
import pytest

from gcl.report.common import ReportError
from gcl.report.paper import PAPER as PAPER_SOURCE
from gcl.report.write import write_report
from test_report import ENV, PAPER, ROOT, add, costs_md, resolved, section, table, tables_md  # noqa: F401  (a fixture)

SEQ_MNIST = {"label": "Seq-MNIST (not in the paper)", "source": "mnist-bundled", "kind": "sequential", "has_tasks": True}


def coca_paper_numbers() -> set[str]:
    paper = pd.read_csv(ROOT / "reference/paper_results.csv")
    return {f"{v:.2f}" for v in paper.accuracy}


def paper_column_numbers(text: str) -> list[str]:
    """Every number of every markdown table in `text` under a heading that names the CoCa paper ('B=200 paper',
    'CoCa paper', 'baseline paper'), not another paper ('B=200 DER paper') nor a difference ('ours − paper')."""
    others = {s for s in pd.concat(pd.read_csv(f) for f in PAPER).source if s != PAPER_SOURCE}
    numbers = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        if len(lines) < 3:
            continue
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        papers = [i for i, h in enumerate(header) if h.endswith(f" {PAPER_SOURCE}") and "−" not in h
                  and not any(h.endswith(f" {o}") for o in others)]
        for ln in lines[2:]:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            numbers += [cells[i] for i in papers if cells[i] != "-"]
    return numbers


@pytest.fixture
def with_other_papers(resolved):
    """The fixture's profile with seq-mnist (CLS-ER's authors report it; the CoCa paper does not) and DER beside
    the DER paper on MNIST-360."""
    resolved["benchmarks"]["seq-mnist"] = SEQ_MNIST
    resolved["report"]["methods"]["clser"] = {"label": "CLS-ER", "paper_table": "clser_paper"}
    add(resolved, "seq-mnist", "coca", 200, [81.0, 82.0], task_il=97.0)
    add(resolved, "seq-mnist", "clser", 200, [85.0, 86.0], task_il=98.0)
    add(resolved, "mnist-360", "der", 200, [56.0, 56.0])
    resolved["report"]["tables"][0]["exclude"] = []
    return resolved


def test_no_number_under_a_paper_heading_is_not_the_coca_papers(with_other_papers):
    write_report(with_other_papers, "results", PAPER)
    numbers = paper_column_numbers(tables_md())
    assert numbers and set(numbers) <= coca_paper_numbers()
    head = table(section(tables_md(), "## Headline: coca against the best baseline (Class-IL)"))["seq-mnist"]
    assert head["best baseline"] == "CLS-ER" and head["baseline paper"] == "-"
    assert head["baseline CLS-ER paper"] == "89.54" and head["baseline ours − CLS-ER paper"] == "-4.04"
    t1 = table(section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360"))
    assert t1["DER"]["B=200 DER paper"] == "55.22" and t1["DER"]["B=200 paper"] == "-"
    assert t1["er"]["B=200 paper"] == "49.27" and t1["er"]["B=200 DER paper"] == "-"


def test_the_committed_tables_hold_no_other_papers_number_under_paper():
    numbers = paper_column_numbers((ROOT / "results/tables.md").read_text())
    assert numbers and set(numbers) <= coca_paper_numbers()


def test_a_reference_file_must_say_whose_numbers_it_holds(resolved, tmp_path):
    unnamed = tmp_path / "other_paper_results.csv"
    unnamed.write_text("table,setting,benchmark,method,buffer,accuracy\nother,class-il,mnist-360,er,200,50.0\n")
    with pytest.raises(ReportError, match=r"other_paper_results.csv: every row needs a `source` column"):
        write_report(resolved, "results", [*PAPER, unnamed])


def test_a_profile_names_another_papers_column_by_its_source(resolved, tmp_path):
    """A profile whose table sits beside another paper's (the ER-ACE paper's, say) heads its column so."""
    other = tmp_path / "erace_like_results.csv"
    other.write_text("table,setting,benchmark,method,buffer,accuracy,source\n"
                     "erace_t1,class-il,mnist-360,er,200,26.70,ER-ACE paper\n")
    resolved["report"]["tables"] = [{"title": "Online", "paper_table": "erace_t1"}]
    write_report(resolved, "results", [*PAPER, other])
    t = table(section(section(tables_md(), "## Online"), "### mnist-360"))
    assert t["er"]["B=200 ER-ACE paper"] == "26.70" and "B=200 paper" not in t["er"]


def test_seeds_differing_only_in_stacking_get_one_plain_line(resolved):
    add(resolved, "mnist-360", "er", 500, [61.0, 62.0], env={**ENV, "stacked": 2})
    write_report(resolved, "results", PAPER)
    data = section(tables_md(), "## Data")
    assert "Computed on: torch 2.14.1, Some CPU, 1 thread(s), fp32 (10 seeds, 2 of them trained stacked). " in data
    assert "**" not in data.split("Computed on")[1] and "its cells come from" not in tables_md()


def test_another_cpu_keeps_the_warning(resolved):
    add(resolved, "mnist-360", "er", 500, [61.0, 62.0], env={**ENV, "device": "Other CPU", "stacked": 2})
    write_report(resolved, "results", PAPER)
    assert "**These results mix environments**" in section(tables_md(), "## Data")
    assert "its cells come from 2 environments" in section(section(tables_md(), "## Table 1: Class-IL"), "### mnist-360")


def test_a_table_the_profile_cannot_fill_says_which_profile_does(resolved):
    resolved["report"]["tables"].append({"title": "Table 4: CIFAR-100", "paper_table": "table4_num_tasks",
                                         "benchmarks": ["seq-cifar100-10t", "seq-cifar100"],
                                         "filled_by": "profiles/paper.yaml"})
    write_report(resolved, "results", PAPER)
    assert "## Table 4" not in tables_md()
    lines = section(tables_md(), "## Data")
    assert "- Table 4: CIFAR-100: needs runs on seq-cifar100-10t and seq-cifar100; profiles/paper.yaml fills it." in lines


def test_every_column_of_costs_md_is_defined(resolved):
    add(resolved, "mnist-360", "icarl", 200, [40.0, 40.0], extra={"exemplars": 200})
    write_report(resolved, "results", PAPER)
    text = costs_md()
    defined = set(re.findall(r"^- \*\*(.+?)\*\*: ", text, flags=re.M))
    headers = {c.strip() for ln in text.splitlines() if ln.startswith("| benchmark")
               for c in ln.strip("|").split("|")}
    assert headers - {"benchmark", "method", "buffer"} <= defined
    assert "exemplars" in defined and "samples/s" in defined and "device" in defined
