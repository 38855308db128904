"""The committed dvc.lock is current: every stage's committed dependencies (code, params.yaml, profiles, reference
numbers, reproductions) and committed outputs (results/) are the files the lock records, so that a fresh clone's
`dvc status` names only what it has not computed yet (data, runs), never a stage made stale by a commit."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.lock     # by the full suite and CI: mid-edit, a working tree's lock is stale by design


def tracked(root: Path, path: str) -> bool:
    return bool(subprocess.run(["git", "ls-files", "--", path], cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip())


def stale_stages(root: Path) -> dict[str, list[str]]:
    """Stage -> what makes it stale in the committed files: a committed dependency or output whose digest is not the
    one dvc.lock records, or a command other than the recorded one. Dependencies that are (or hold) another stage's
    outputs (resolved/, data/, runs/) are what a clone computes and are not looked at."""
    status = subprocess.run(["dvc", "status", "--json"], cwd=root, capture_output=True, text=True)
    if status.returncode != 0:
        raise AssertionError(f"dvc status failed in {root}: {status.stderr.strip()}")
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    outs = {o["path"] for s in stages.values() for o in s.get("outs", [])}

    def computed(path: str) -> bool:      # an output, inside one, or holding one
        return any(path == o or path.startswith(o + "/") or o.startswith(path + "/") for o in outs)

    stale: dict[str, list[str]] = {}
    for stage, changes in json.loads(status.stdout or "{}").items():
        for change in changes:
            if isinstance(change, str):               # 'changed command', 'always changed', ...
                stale.setdefault(stage, []).append(change)
                continue
            for kind, paths in change.items():
                for path, how in paths.items():
                    if how == "modified" and tracked(root, path) and (kind == "changed outs" or not computed(path)):
                        stale.setdefault(stage, []).append(f"{path} ({kind}: {how})")
    return stale


def test_the_committed_lock_is_current():
    stale = stale_stages(ROOT)
    assert not stale, ("dvc.lock is stale; run `dvc repro` and commit dvc.lock: "
                       + "; ".join(f"{stage}: {', '.join(why)}" for stage, why in stale.items()))


@pytest.fixture
def clone(tmp_path):
    """A fresh clone of the committed project (what a new user, or CI, starts from)."""
    target = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(target)], check=True)
    return target


def commit(root: Path, message: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message], cwd=root, check=True)


def test_a_commit_that_edits_a_dependency_without_dvc_repro_is_named(clone):
    """Seen from a fresh clone: the lock of HEAD names no stale stage (whatever the working tree holds), and a commit
    that edits a tracked dependency, or a committed result, without `dvc repro` makes its stages stale by name."""
    if shutil.which("dvc") is None:
        pytest.fail("dvc is not installed: the project's install provides it")
    assert stale_stages(clone) == {}, "the committed dvc.lock is stale (see test_the_committed_lock_is_current)"
    csv = next((clone / "reference").glob("*.csv"))
    csv.write_text(csv.read_text() + "\n")
    commit(clone, "an edit of a dependency, without dvc repro")
    stale = stale_stages(clone)
    assert "report" in stale and any(why.startswith("reference (changed deps") for why in stale["report"])
    tables = clone / "results" / "tables.md"
    tables.write_text(tables.read_text().replace("±", "+-", 1))
    commit(clone, "a hand edit of a result")
    assert "results/tables.md (changed outs: modified)" in stale_stages(clone)["report"]
