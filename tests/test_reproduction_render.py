"""check@reproductions verifies what a reader reads: each committed reproduction's params.yaml is its profile, its
summary is what its runs hold, and its tables.md, costs.md, metrics.json and plot data are what the report renders
from them today. Every edit below is refused in one line naming the edited file."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from gcl.config import check_reproductions
from gcl.report.common import ReportError
from gcl.rerender import main as rerender_main
from test_report import ROOT

COMMITTED = ["reproductions/mnist-360", "reproductions/mnist-360-sensitivity", "reproductions/online-cifar10"]


def params_of(*folders: str) -> dict:
    return {"report": {"reproductions": list(folders)}}


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """A workspace holding a copy of one committed reproduction, its profile and the published numbers."""
    def make(name: str) -> Path:
        folder = tmp_path / "reproductions" / name
        shutil.copytree(ROOT / "reproductions" / name, folder)
        (tmp_path / "profiles").mkdir(exist_ok=True)
        shutil.copy(ROOT / "profiles" / f"{name}.yaml", tmp_path / "profiles")
        if not (tmp_path / "reference").exists():
            shutil.copytree(ROOT / "reference", tmp_path / "reference")
        monkeypatch.chdir(tmp_path)
        return Path("reproductions") / name
    return make


def refusal(folder: Path) -> str:
    with pytest.raises(ReportError) as refused:
        check_reproductions(params_of(folder.as_posix()))
    line = str(refused.value)
    assert "\n" not in line
    return line


def reseal(folder: Path, name: str) -> None:
    """Make the folder's dvc.lock vouch for an edited file, as a hand-run `dvc commit` in its workspace would."""
    lock = folder / "dvc.lock"
    data = (folder / name).read_bytes()
    stages = yaml.safe_load(lock.read_text())
    for stage in stages["stages"].values():
        for entry in (stage.get("deps") or []) + (stage.get("outs") or []):
            if entry["path"] == name:
                entry.update(md5=hashlib.md5(data).hexdigest(), size=len(data))
    lock.write_text(yaml.safe_dump(stages, sort_keys=False))


@pytest.mark.slow
def test_every_committed_reproduction_is_what_the_report_renders_from_it(monkeypatch):
    monkeypatch.chdir(ROOT)
    verified = check_reproductions(params_of(*COMMITTED))
    assert list(verified) == COMMITTED


def test_an_edited_seed_accuracy_in_runs_is_refused_naming_its_metrics_json(copy):
    folder = copy("mnist-360-sensitivity")
    metrics = folder / "runs/mnist-360/coca-w05/500/metrics.json"
    data = json.loads(metrics.read_text())
    seed = next(iter(data["seeds"]))
    data["seeds"][seed]["class_il"] += 1.0
    metrics.write_text(json.dumps(data))
    line = refusal(folder)
    assert line.startswith(f"{metrics} does not hold what {folder / 'results/summary.csv'} records for seed {seed}")


def test_an_edited_verdict_row_in_tables_md_is_refused_naming_it(copy):
    folder = copy("online-cifar10")
    tables = folder / "results/tables.md"
    text = tables.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| 200 ") and ln.endswith("| loses     |"))
    tables.write_text(text.replace(row, row.replace("| loses     |", "| wins      |")))
    line = refusal(folder)
    assert line.startswith(f"{tables} is not what the report renders from {folder}'s runs and params.yaml: line ")
    assert "| wins      |'" in line and "'...| loses     |'" not in line and "python -m gcl.rerender" in line


def test_an_edited_number_in_costs_or_plot_data_is_refused_naming_it(copy):
    folder = copy("mnist-360-sensitivity")
    plot = next((folder / "results/plots/sensitivity").glob("*.csv"))
    lines = plot.read_text().splitlines()
    lines[1] = lines[1][:-1] + ("1" if lines[1][-1] != "1" else "2")
    plot.write_text("\n".join(lines) + "\n")
    assert refusal(folder).startswith(f"{plot} is not what the report renders")


def test_a_params_yaml_other_than_its_profile_is_refused_even_with_a_matching_lock(copy):
    """The hand edit that once went unseen: a report text of the reproduction's params.yaml, its dvc.lock made to
    match. A comment may differ (the profile's document the grid, and are kept current)."""
    folder = copy("mnist-360-sensitivity")
    params = folder / "params.yaml"
    original = params.read_text()
    params.write_text(original.replace("\n", "\n# a comment added by hand\n", 1))
    reseal(folder, "params.yaml")
    check_reproductions(params_of(folder.as_posix()))
    edited = yaml.safe_load(original)
    edited["report"]["sensitivity"]["paper_note"] = "a note edited by hand"
    params.write_text(yaml.safe_dump(edited))
    reseal(folder, "params.yaml")
    line = refusal(folder)
    assert line.startswith(f"{params} is not profiles/mnist-360-sensitivity.yaml: report.sensitivity.paper_note reads "
                           "'a note edited by hand' where the profile has ")


def test_a_folder_named_after_no_profile_is_refused(copy):
    folder = copy("mnist-360-sensitivity")
    (Path("profiles") / "mnist-360-sensitivity.yaml").unlink()
    assert refusal(folder).startswith(f"{folder} names no profile: profiles/mnist-360-sensitivity.yaml does not exist")


@pytest.mark.slow
def test_rerender_brings_a_stale_document_back_and_then_it_passes(copy, capsys):
    """What `python -m gcl.rerender` does after a change of the report's code: here the stale document is an
    edited one, rendered back to the committed bytes."""
    folder = copy("mnist-360-sensitivity")
    tables = folder / "results/tables.md"
    original = tables.read_bytes()
    tables.write_text(tables.read_text().replace("holds", "fails"))
    refusal(folder)
    rerender_main([str(folder)])
    assert "rewrote tables.md" in capsys.readouterr().out
    assert tables.read_bytes() == original
    check_reproductions(params_of(folder.as_posix()))


@pytest.mark.slow
def test_a_readme_number_in_a_readings_block_is_refused_naming_the_readme(copy):
    """A README quotes a reproduction's readings only in a generated block; an edited number there is refused, and
    `python -m gcl.rerender` writes the block back."""
    folder = copy("online-cifar10")
    readme = folder / "README.md"
    text = readme.read_text()
    assert "<!-- readings: reproductions/online-cifar10 -->\n|" in text
    row = "| online-cifar10     | 200      | CoCa 35.61 ± 2.07 (5) | PCR 49.34 ± 1.52 (5)    | -13.73 [-16.42, -11.04]"
    assert row in text
    readme.write_text(text.replace("-13.73 [-16.42, -11.04]", "-12.73 [-16.42, -11.04]"))
    line = refusal(folder)
    assert line.startswith(f"{readme}: the readings block of {folder} (from line ")
    Path("README.md").write_text("# a project\n\n<!-- readings: reproductions/online-cifar10 -->\nold\n<!-- /readings -->\n")
    rerender_main([str(folder)])
    assert readme.read_text() == text
    assert row in Path("README.md").read_text()
    check_reproductions(params_of(folder.as_posix()))


@pytest.mark.slow
def test_a_reproduction_of_part_of_its_grid_is_verified_as_its_report_says(copy):
    """A snapshot part way through a grid: whole runs absent from runs/ and summary.csv (its report names them), the
    rest verified as ever; a run with only some of its seeds is still refused."""
    folder = copy("mnist-360-sensitivity")
    shutil.rmtree(folder / "runs/mnist-360/coca-g09")
    summary = folder / "results/summary.csv"
    summary.write_text("".join(ln for ln in summary.read_text().splitlines(keepends=True) if ",coca-g09," not in ln))
    reseal(folder, "results/summary.csv")
    rerender_main([str(folder)])
    tables = (folder / "results/tables.md").read_text()
    assert "**Part of the grid.** 7 of the 8 runs params.yaml lists have results; not run yet: mnist-360-coca-g09-500." in tables
    assert "- γ: not drawn: mnist-360/coca-g09/500 not run yet." in tables
    check_reproductions(params_of(folder.as_posix()))
    lines = summary.read_text().splitlines(keepends=True)
    summary.write_text("".join(lines[:-1]))           # the last run's last seed
    reseal(folder, "results/summary.csv")
    assert "does not hold the runs" in refusal(folder)
