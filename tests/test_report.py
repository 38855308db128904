"""The report reads exactly the cells params.yaml lists and puts each beside the right paper row."""
import json
from pathlib import Path

import pytest

from gcl.atomic import write_json
from gcl.report import ReportError, write_report

ROOT = Path(__file__).resolve().parents[1]
PAPER = [ROOT / "reference/paper_results.csv", ROOT / "reference/der_paper_results.csv"]


def fake_cell(benchmark, method, buffer, accs, task_il=None):
    seeds = {str(i): {"class_il": a, "task_il": task_il, "forgetting": 1.0, "train_seconds": 2.0,
                      "samples_per_second": 100.0, "curve": [a / 2, a], "confusion": [[1, 0], [0, 1]]}
             for i, a in enumerate(accs)}
    write_json(Path("runs", benchmark, method, str(buffer), "metrics.json"),
               {"benchmark": benchmark, "method": method, "buffer": buffer, "device": "cpu", "seeds": seeds})


@pytest.fixture
def params(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = {"seeds": [0, 1], "device": "cpu", "sources": {"mnist-bundled": {}},
         "benchmarks": {"mnist-360": {"kind": "mnist-360", "source": "mnist-bundled", "backbone": "mlp",
                                      "epochs": 1, "label": "bundled digits"}},
         "methods": {"er": {}, "sgd": {}, "coca": {"base": "er"}, "coca-ckd": {"base": "er"}},
         "runs": {}, "report": {"figures": False}}
    for method, buffer, accs in (("sgd", "none", [20.0, 22.0]), ("er", 200, [50.0, 52.0]),
                                 ("coca", 200, [60.0, 64.0]), ("coca-ckd", 200, [55.0, 55.0])):
        extra = {"replay_batch": 8} if buffer != "none" else {}
        p["runs"][f"{method}-{buffer}"] = {"benchmark": "mnist-360", "method": method, "buffer": buffer,
                                           "lr": 0.1, "batch": 4, **extra}
        fake_cell("mnist-360", method, buffer, accs)
    return p


def test_tables_put_our_mean_std_beside_the_paper(params):
    write_report(params, "results", PAPER)
    tables = Path("results/tables.md").read_text()
    er_row = next(line for line in tables.splitlines() if line.startswith("| er "))
    assert "51.00 ± 1.41" in er_row and "49.27" in er_row            # ours beside the paper's ER-200
    assert "bundled digits" in tables
    table1, ablation = tables.split("## Table 1")[1].split("## Table 3")
    assert "| coca " in table1 and "coca-ckd" not in table1          # partial configurations: Table 3 only
    assert "| CKD " in ablation and "56.71" in ablation and "55.00 ± 0.00" in ablation
    assert "| CKD+PT+SCL (CoCa) " in ablation and "67.02" in ablation and "62.00 ± 2.83" in ablation
    assert "Table 2" not in tables                                    # no tasks: no Task-IL table


def test_ablation_baseline_is_coca_with_every_switch_off_where_it_ran(params):
    """Table 3's first row: the all-off configuration at CoCa's own settings when it was run (ER's
    published settings can differ), ER's row otherwise; either way beside the paper's ER."""
    params["methods"]["coca-off"] = {"base": "er"}
    params["runs"]["coca-off-200"] = {"benchmark": "mnist-360", "method": "coca-off", "buffer": 200,
                                      "lr": 0.1, "batch": 4, "replay_batch": 8}
    fake_cell("mnist-360", "coca-off", 200, [47.0, 49.0])
    write_report(params, "results", PAPER)
    table1, ablation = Path("results/tables.md").read_text().split("## Table 1")[1].split("## Table 3")
    first = next(line for line in ablation.splitlines() if line.startswith("| ER"))
    assert first.startswith("| ER (all off)") and "48.00 ± 1.41" in first and "49.27" in first
    assert "coca-off" not in table1


def test_summary_and_headline(params):
    write_report(params, "results", PAPER)
    rows = Path("results/summary.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4 * 2
    headline = json.loads(Path("results/metrics.json").read_text())
    assert headline["class_il"]["mnist-360"]["coca"]["200"] == 62.0
    assert headline["train_seconds_total"] == 16.0


def test_stale_cells_on_disk_are_ignored(params):
    fake_cell("mnist-360", "er", 500, [99.0])        # a cell no longer in params.yaml
    write_report(params, "results", PAPER)
    assert "99.00" not in Path("results/tables.md").read_text()


def test_der_rows_are_compared_with_the_right_paper_rows(params):
    params["methods"].update({"der": {"base": "er"}, "derpp": {"base": "er"}})
    for m, accs in (("der", [56.0, 56.0]), ("derpp", [57.0, 57.0])):
        params["runs"][m] = {"benchmark": "mnist-360", "method": m, "buffer": 200, "lr": 0.1, "batch": 4,
                             "replay_batch": 8}
        fake_cell("mnist-360", m, 200, accs)
    write_report(params, "results", PAPER)
    tables = Path("results/tables.md").read_text()
    der = next(line for line in tables.splitlines() if line.startswith("| der "))
    derpp = next(line for line in tables.splitlines() if line.startswith("| derpp "))
    assert "55.22" in der            # the DER paper's plain DER
    assert "54.16" in derpp          # the CoCa paper's "DER" row = DER++
    assert "DER++ numbers" in tables


def test_missing_cell_is_a_clear_error(params):
    Path("runs/mnist-360/er/200/metrics.json").unlink()
    with pytest.raises(ReportError, match="runs/mnist-360/er/200/metrics.json.*dvc repro"):
        write_report(params, "results", PAPER)


def test_sensitivity_figure_reads_the_swept_value_from_each_cell(params):
    for name, omega, accs in (("coca-w05", 0.5, [61.0, 63.0]), ("coca-w09", 0.9, [58.0, 60.0])):
        params["methods"][name] = {"base": "er"}
        params["runs"][name] = {"benchmark": "mnist-360", "method": name, "buffer": 200, "lr": 0.1, "batch": 4,
                                "replay_batch": 8}
        fake_cell("mnist-360", name, 200, accs)
        cell = json.loads(Path(f"runs/mnist-360/{name}/200/metrics.json").read_text())
        cell["config"] = {"run": {"omega": omega}}
        write_json(Path(f"runs/mnist-360/{name}/200/metrics.json"), cell)
    params["report"] = {"figures": True, "sensitivity": {"benchmark": "mnist-360", "buffer": 200,
                                                         "omega": ["coca-w05", "coca-w09"]}}
    write_report(params, "results", PAPER)
    assert Path("results/figures/sensitivity.png").stat().st_size > 1000
    params["report"]["sensitivity"]["omega"].append("coca-w01")
    with pytest.raises(ReportError, match="coca-w01"):
        write_report(params, "results", PAPER)
