"""A committed reproduction (report.reproductions) is verified against its own dvc.lock before the report reads a
number of it: an edited number, row or setting is refused in one line naming the folder's file, and the check
runs in a stage of its own (check@reproductions), so a refusal leaves results/ as it was."""
import hashlib
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gcl.config import resolve_profile
from gcl.core.atomic import write_json
from gcl.report.common import ReportError
from gcl.report.reproductions import VERIFIED, md5, verify
from gcl.report.write import write_report
from test_report import ENV, PAPER, ROOT, costs_md, resolved, section, table, tables_md  # noqa: F401  (resolved: a fixture)

FOLDER = Path("reproductions/full")


def reproduction(folder: Path = FOLDER, drop_seed: int | None = None) -> Path:
    """A committed reproduction: profiles/ci.yaml (MNIST-360: SGD, JOINT, ER/200, seeds 0 and 1) relabelled,
    with a results/summary.csv holding every seed of its runs (ER at 70 and 72), sealed by its dvc.lock."""
    params = yaml.safe_load((ROOT / "profiles/ci.yaml").read_text())
    params["report"]["benchmarks"]["mnist-360"]["label"] = "MNIST-360 on full MNIST"
    (folder / "results").mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    acc = {"sgd": [19.0, 21.0], "joint": [80.0, 84.0], "er": [70.0, 72.0]}
    rows = [{"benchmark": "mnist-360", "method": r["method"], "buffer": str(r["buffer"]), "seed": seed,
             "class_il": acc[r["method"]][seed], "task_il": None, "forgetting": 3.0, "steps": 13510, "samples": 54040,
             "train_seconds": 60.0, "samples_per_second": 900.0, "device": "cpu",
             **{f"env_{k}": v for k, v in ENV.items()}}
            for r in params["runs"].values() for seed in params["seeds"] if seed != drop_seed or r["method"] != "er"]
    pd.DataFrame(rows).to_csv(folder / "results" / "summary.csv", index=False)
    (folder / "results" / "metrics.json").write_text('{"mnist-360": {}}\n')
    return seal(folder)


def seal(folder: Path) -> Path:
    """The folder's dvc.lock as `dvc repro` writes it: the check stages' digest of params.yaml, the report's of
    its outputs."""
    def entry(name):
        data = (folder / name).read_bytes()
        return {"path": name, "hash": "md5", "md5": hashlib.md5(data).hexdigest(), "size": len(data)}

    lock = {"schema": "2.0", "stages": {
        "check@data": {"cmd": "python stages/check.py data", "deps": [entry("params.yaml")]},
        "check@runs": {"cmd": "python stages/check.py runs", "deps": [entry("params.yaml")]},
        "report": {"cmd": "python stages/report.py", "deps": [{"path": "runs", "hash": "md5", "md5": "0" * 32 + ".dir"}],
                   "outs": [entry("results/metrics.json"), entry("results/summary.csv")]}}}
    (folder / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return folder


def check(folder: Path = FOLDER) -> None:
    """What stage check@reproductions does for one folder."""
    write_json(VERIFIED, {folder.as_posix(): verify(folder, resolve_profile)})


def refusal(folder: Path = FOLDER) -> str:
    with pytest.raises(ReportError) as refused:
        check(folder)
    line = str(refused.value)
    assert "\n" not in line and str(folder) in line
    return line


def edit_summary(change) -> None:
    """Edit the folder's summary.csv as a spreadsheet would: `change` edits the frame in place."""
    path = FOLDER / "results/summary.csv"
    summary = pd.read_csv(path, dtype={"buffer": str})
    change(summary)
    summary.to_csv(path, index=False)


def edit_a_number():
    edit_summary(lambda s: s.__setitem__("class_il", s.class_il.where(s.index != 4, 76.67)))   # ER seed 0


def duplicate_a_row():
    edit_summary(lambda s: s.loc.__setitem__(len(s), s.loc[5]))                               # ER seed 1


def empty_a_value():
    edit_summary(lambda s: s.__setitem__("class_il", s.class_il.where(s.index != 5, None)))   # ER seed 1


def edit_a_setting():
    params = FOLDER / "params.yaml"
    params.write_text(params.read_text().replace("lr: 0.2", "lr: 0.3"))


EDITS = {"a number": edit_a_number, "a duplicated row": duplicate_a_row, "an emptied value": empty_a_value,
         "a setting": edit_a_setting}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_the_committed_reproduction_is_the_one_its_dvc_lock_records():
    """Our MD5 is DVC's: the committed folder's files match the digests its dvc.lock holds."""
    folder = ROOT / "reproductions" / "mnist-360"
    record = verify(folder, resolve_profile)
    assert record["summary_md5"] == md5(folder / "results/summary.csv")
    assert sum(map(len, record["resolved"]["run_seeds"].values())) == len(pd.read_csv(folder / "results/summary.csv"))


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_reproduction_is_refused_naming_the_file(workspace, edit):
    reproduction()
    EDITS[edit]()
    file = "params.yaml" if edit == "a setting" else "results/summary.csv"
    assert refusal().startswith(f"{FOLDER / file} is not the file {FOLDER / 'dvc.lock'} records (md5 ")


@pytest.mark.parametrize("edit, says", [("a duplicated row", "repeats the row of mnist-360 er 200 seed 1 (line 8)"),
                                        ("an emptied value", "has an empty class_il in the row of mnist-360 er 200 seed 1")])
def test_a_bad_row_is_refused_even_with_a_matching_dvc_lock(workspace, edit, says):
    """A summary whose dvc.lock was made to match it: each seed of a run once, and no value emptied."""
    seal(reproduction())
    EDITS[edit]()
    seal(FOLDER)
    assert refusal().startswith(f"{FOLDER / 'results/summary.csv'} {says}")


def test_a_run_with_stacked_and_lone_seeds_is_no_edit(workspace):
    """3 seeds in 2 processes: seeds 0 and 1 stacked (env_stacked 2), the last alone (no stack): as the report writes it."""
    reproduction()
    edit_summary(lambda s: s.__setitem__("env_stacked", [2.0 if seed == 0 else None for seed in s.seed]))
    seal(FOLDER)
    check()


def test_a_value_empty_for_every_seed_of_a_run_is_no_edit(workspace):
    """Task-IL on a benchmark without tasks, forgetting of JOINT: empty for the whole run, as the report writes it."""
    reproduction()
    edit_summary(lambda s: s.__setitem__("forgetting", s.forgetting.where(s.method != "joint", None)))
    seal(FOLDER)
    check()


def test_a_half_copied_reproduction_is_refused(workspace):
    reproduction(drop_seed=1)
    assert "results/summary.csv does not hold the runs reproductions/full/params.yaml lists (1 seed(s) missing" \
        in refusal()
    shutil.rmtree(FOLDER)
    reproduction()
    (FOLDER / "dvc.lock").unlink()
    assert refusal().startswith(f"{FOLDER / 'dvc.lock'} is missing (report.reproductions lists {FOLDER})")


def test_a_run_with_seeds_of_its_own_is_checked_against_them(workspace):
    """A run that lists its own `seeds` (a 10-seed cell of a 3-seed profile) must hold exactly those rows."""
    reproduction()
    params = yaml.safe_load((FOLDER / "params.yaml").read_text())
    er = next(k for k, r in params["runs"].items() if r["method"] == "er")
    params["runs"][er]["seeds"] = [0, 1, 2]
    (FOLDER / "params.yaml").write_text(yaml.safe_dump(params))
    seal(FOLDER)
    assert "(1 seed(s) missing, e.g. [('mnist-360', 'er', '200', 2)]" in refusal()   # seeds 0 and 1 only so far

    def add_er_seed_2(summary):
        summary.loc[len(summary)] = {**summary[summary.method == "er"].iloc[0].to_dict(), "seed": 2}

    edit_summary(add_er_seed_2)
    seal(FOLDER)
    check()


def test_a_params_yaml_this_code_refuses_names_the_folder(workspace):
    reproduction()
    params = yaml.safe_load((FOLDER / "params.yaml").read_text())
    del params["seeds"]
    params["runs"]["mnist-360-er-200"]["buffer"] = 0
    (FOLDER / "params.yaml").write_text(yaml.safe_dump(params))
    seal(FOLDER)
    assert refusal().startswith(f"{FOLDER / 'params.yaml'} (report.reproductions lists {FOLDER}) is refused: ")


def test_a_committed_reproduction_comes_first_with_its_own_tables(resolved):
    reproduction()
    check()
    resolved["report"]["reproductions"] = ["reproductions/full"]
    write_report(resolved, "results", PAPER)
    text = tables_md()
    assert text.index("## Reproduction: MNIST-360 on full MNIST") < text.index("## This profile (params.yaml)")
    rep = section(text, "## Reproduction: MNIST-360 on full MNIST")
    assert "`reproductions/full`" in rep and "54,040 stream samples per seed" in rep
    t1 = table(section(section(rep, "### Table 1: Class-IL / general continual accuracy"), "#### mnist-360"))
    assert t1["ER"]["B=200 ours"] == "71.00 ± 1.41" and t1["ER"]["B=200 paper"] == "49.27"
    assert t1["JOINT"]["no buffer ours"] == "82.00 ± 2.83 ≈" and t1["JOINT"]["no buffer paper"] == "82.98"
    own = section(text, "## This profile (params.yaml)")
    assert table(section(section(own, "### Table 1: Class-IL"), "#### mnist-360"))["er"]["B=200 ours"] == "51.00 ± 1.41"


def test_every_accuracy_table_comes_before_any_cost(resolved):
    """tables.md: the reproduction's accuracies, then this profile's, and no cost table anywhere; costs.md: each
    profile's costs in the same order. The reproduction's headline carries ≈ and ours − paper too."""
    reproduction()
    check()
    resolved["report"]["reproductions"] = ["reproductions/full"]
    write_report(resolved, "results", PAPER)
    text = tables_md()
    headings = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert headings == ["## Reproduction: MNIST-360 on full MNIST", "## This profile (params.yaml)"]
    subsections = [ln for ln in text.splitlines() if ln.startswith("### ")]
    assert subsections == ["### Headline: ER against the best baseline (Class-IL)", "### Data",
                           "### Table 1: Class-IL / general continual accuracy",
                           "### Headline: coca against the best baseline (Class-IL)", "### Data",
                           "### Table 1: Class-IL", "### Table 3: ablation"]
    assert "cost" not in " ".join(headings + subsections).lower() and "[costs.md](costs.md)" in text
    head = table(section(section(text, "## Reproduction: MNIST-360 on full MNIST"),
                         "### Headline: ER against the best baseline (Class-IL)"))["mnist-360"]
    assert head["ER ours"] == "71.00 ± 1.41" and head["ER paper"] == "49.27" and head["ER ours − paper"] == "+21.73"
    assert head["best baseline"] == "SGD (no buffer)" and head["baseline ours"] == "20.00 ± 1.41 ≈"   # the paper's 19.02
    assert head["baseline ours − paper"] == "+0.98"
    costs = costs_md()
    assert [ln for ln in costs.splitlines() if ln.startswith("## ")] == headings
    assert costs.index("`reproductions/full`") < costs.index("## This profile (params.yaml)")
    rep_costs = section(section(costs, "## Reproduction: MNIST-360 on full MNIST"), "### Forgetting and cost per run")
    assert "| 13,510  " in rep_costs and "13510.00" not in rep_costs                       # steps: a count


def test_the_report_refuses_a_reproduction_edited_since_its_check(resolved):
    """`dvc repro -s report` skips check@reproductions: the report takes only the summary that was verified."""
    reproduction()
    resolved["report"]["reproductions"] = ["reproductions/full"]
    with pytest.raises(ReportError, match="reproductions/full .* has not been verified against its dvc.lock"):
        write_report(resolved, "results", PAPER)
    check()
    EDITS["a number"]()
    with pytest.raises(ReportError, match="reproductions/full/results/summary.csv changed since check@reproductions"):
        write_report(resolved, "results", PAPER)


def test_the_check_is_a_stage_before_the_report():
    """DVC deletes a stage's outputs before running it: a refusal in the report itself would delete results/."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "reproductions" in stages["check"]["foreach"] and "reproductions" in stages["check"]["do"]["deps"]
    assert stages["check"]["do"]["outs"] == ["resolved/${item}"] and VERIFIED.parent == Path("resolved/reproductions")
    assert "resolved/reproductions" in stages["report"]["deps"]
