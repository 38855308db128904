"""tools/part_profile.py cuts a profile to a workspace's finished runs: the runs not finished and every part of the
report that needs one go, the rest of the text stays as written, and the result is a valid profile."""
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import part_profile  # noqa: E402
from gcl.config import check_runs, load_params, resolve_run  # noqa: E402
from gcl.core.layout import run_dir  # noqa: E402

PROFILE = ROOT / "profiles" / "online-cifar10.yaml"
UNTRAINED = {"online-cifar10-derpp-star-200", "online-cifar10-derpp-star-1000", "online-cifar10-coca-g00-1000",
             "online-cifar10-coca-g06-1000"}


def workspace(tmp_path: Path, untrained: set[str]) -> Path:
    """A workspace whose dvc.lock records every run of the profile but `untrained` as finished."""
    params = load_params(PROFILE)
    stages = {}
    for key in params["runs"]:
        if key in untrained:
            continue
        folder = run_dir(resolve_run(params, key).run)
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "metrics.json").write_text("{}")
        stages[f"train@{key}"] = {"cmd": "t", "outs": [{"path": str(folder), "md5": "x.dir", "nfiles": 1}]}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))
    return tmp_path


def cut(tmp_path: Path, untrained: set[str]) -> str:
    out = tmp_path / "part.yaml"
    part_profile.main([str(workspace(tmp_path, untrained)), "--profile", str(PROFILE), "--out", str(out)])
    return out.read_text()


def test_untrained_runs_and_what_needs_them_are_cut(tmp_path):
    text = cut(tmp_path, UNTRAINED)
    whole, part = yaml.safe_load(PROFILE.read_text()), yaml.safe_load(text)
    assert set(part["runs"]) == set(whole["runs"]) - UNTRAINED
    assert all(part["runs"][k] == whole["runs"][k] for k in part["runs"])         # anchors and merges still resolve
    report = part["report"]
    assert report["comparisons"][0]["against"] == ["er", "er-ace", "derpp"]       # DER++-STAR has no run
    assert report["comparisons"][1] == whole["report"]["comparisons"][1]
    assert [s["parameter"] for s in report["sensitivity"]["sweeps"]] == ["omega"]   # gamma lacks two points
    assert report["curves"] == whole["report"]["curves"]                           # draws the methods that ran
    assert report["ablation"] == whole["report"]["ablation"]                      # every configuration ran
    assert "Table 3 (online split CIFAR-10)" in [t["title"] for t in report["tables"]]
    assert {k: v for k, v in part.items() if k not in ("runs", "report")} == \
           {k: v for k, v in whole.items() if k not in ("runs", "report")}
    check_runs(part)                                                              # a valid profile, report and all
    # the text outside the cuts is the profile's: its comments stay, the comment heading only cut runs goes
    assert "# Table 3's claims, decided on Welch 95% intervals" in text
    assert "# STAR on DER++ (beyond the paper)" not in text
    assert "# Figure 4's points" in text
    assert text.startswith("# A REPORT OF PART OF THE GRID (tools/part_profile.py)")
    kept = [line for line in PROFILE.read_text().splitlines() if line not in text.splitlines()]
    assert all("derpp-star" in line or "g00" in line or "g06" in line or "gamma" in line or "γ" in line
               or line.lstrip().startswith(("#", "- {between: [0.", "changes:", "replay_batch: 10, alpha"))
               for line in kept), kept


def test_an_ablation_with_a_configuration_missing_loses_its_table_and_claims(tmp_path):
    part = yaml.safe_load(cut(tmp_path, {"online-cifar10-coca-ckd-scl-1000"}))
    assert "ablation" not in part["report"] or not part["report"]["ablation"]
    assert "Table 3 (online split CIFAR-10)" not in [t["title"] for t in part["report"]["tables"]]
    assert len(part["report"]["sensitivity"]["sweeps"]) == 2
    check_runs(part)


def test_a_whole_grid_is_left_as_written(tmp_path):
    assert cut(tmp_path, set()) == PROFILE.read_text()


def test_a_workspace_with_nothing_finished_is_refused(tmp_path):
    params = load_params(PROFILE)
    with pytest.raises(SystemExit, match="no run of .* is finished"):
        cut(tmp_path, set(params["runs"]))


def test_a_list_over_several_lines_is_refused_not_mangled():
    text = "runs: {}\nreport:\n  curves:\n    groups:\n      g: [er,\n          derpp-star]\n"
    cutter = part_profile.Cutter(text)
    doc = part_profile.YAML().load(text)
    with pytest.raises(part_profile.PartError, match="not written on one line"):
        cutter.keep_in_list(doc["report"]["curves"]["groups"], "g", ["er"], "why")
