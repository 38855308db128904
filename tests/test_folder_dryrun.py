"""A CI-size dry run of profiles/cifar10-folder.yaml (tools/dryrun.py), as tests/test_dryrun.py runs the paper
profile's: the folder's `like: cifar10` gives the dry run its shape, so no folder is needed. 51 s and 84 s in two runs on the
2-core development machine (beside another job), hence e2e."""
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import dryrun  # noqa: E402

FOLDER = ROOT / "profiles" / "cifar10-folder.yaml"


@pytest.mark.e2e
def test_a_ci_size_dry_run_of_the_folder_profile_trains_and_reports_without_the_folder(tmp_path, capsys):
    """One run per method (SGD, JOINT, ER, DER++, CoCa at their smallest buffer), 2 epochs, through `dvc repro`,
    on random images of CIFAR-10's shape standing in for the folder the profile points at (which does not exist)."""
    assert not Path(yaml.safe_load(FOLDER.read_text())["sources"]["cifar10-folder"]["path"]).exists()
    status = dryrun.main([str(FOLDER), "--one-per-method", "--scale", "0.01", "--workspace", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert status == 0, out
    ok = [line for line in out.splitlines() if line.startswith("ok  ")]
    assert len(ok) == 6 and "ok      report:" in out       # 5 runs and the report
    dry = yaml.safe_load((tmp_path / "dry" / "params.yaml").read_text())
    assert list(dry["sources"]) == ["random-cifar10"] and dry["benchmarks"]["seq-cifar10"]["source"] == "random-cifar10"
    assert (tmp_path / "dry" / "results" / "tables.md").exists()
