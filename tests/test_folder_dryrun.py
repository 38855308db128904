"""CI-size dry runs of the profiles that read CIFAR-10 from an image folder (profiles/cifar10-folder.yaml,
profiles/online-cifar10.yaml; gcl.dryrun), as tests/test_dryrun.py runs the paper profile's: the folder's
`like: cifar10` gives the dry run its shape, so no folder is needed. The folder profile's: 51 s and 84 s in two runs on the
2-core development machine (beside another job), hence e2e."""
from pathlib import Path

import pytest
import yaml

from gcl import dryrun

ROOT = Path(__file__).resolve().parents[1]

PROFILES = {   # profile -> its image-folder source, its benchmark, the runs of a one-per-method-and-benchmark cut
    "cifar10-folder.yaml": ("cifar10-folder", "seq-cifar10", 5),
    "online-cifar10.yaml": ("cifar10-images", "online-cifar10", 13),     # 9 methods without augmentation, 4 with
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_ci_size_dry_run_of_a_folder_profile_trains_and_reports_without_the_folder(name, tmp_path, capsys):
    """One run per method at its smallest buffer, 2 epochs, through `dvc repro`, on random images of CIFAR-10's shape
    standing in for the folder the profile points at (which does not exist here)."""
    profile, (source, benchmark, runs) = ROOT / "profiles" / name, PROFILES[name]
    assert not (ROOT / yaml.safe_load(profile.read_text())["sources"][source]["path"]).exists()
    status = dryrun.main([str(profile), "--one-per-method", "--scale", "0.01", "--root", str(ROOT),
                          "--workspace", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert status == 0, out
    ok = [line for line in out.splitlines() if line.startswith("ok  ")]
    assert len(ok) == runs + 1 and "ok      report:" in out       # the runs and the report
    dry = yaml.safe_load((tmp_path / "dry" / "params.yaml").read_text())
    assert list(dry["sources"]) == ["random-cifar10"] and dry["benchmarks"][benchmark]["source"] == "random-cifar10"
    assert (tmp_path / "dry" / "results" / "tables.md").exists()
