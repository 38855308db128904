"""Copy a workspace's finished runs of its profile into a reproduction folder, so that a grid that spans several
sittings keeps what it has trained (reproductions/<name>/README.md says how a later sitting resumes from it).

    python -m gcl.snapshot <workspace> reproductions/<name>

Copies the workspace's params.yaml, its dvc.lock cut to the stages of that profile (the data, settings and code
digest of each run), and runs/<benchmark>/<method>/<buffer>/ of every finished run (its train stage in dvc.lock,
its folder complete, no trainer at work on it), and, once the workspace's report is the one dvc.lock records, its
results/ (what check@reproductions verifies). Files are written, then renamed into place; the workspace may be
training meanwhile.

A report of part of a grid: `dvc repro -s check@runs report` in the workspace (its params.yaml the whole profile;
the report draws the finished runs and names the others), then snapshot, and train on. While the workspace's report
is not current, a folder that holds a report keeps it whole (its params.yaml, results/ and every stage of its
dvc.lock that records params.yaml's digest), so check@reproductions goes on verifying it, and the runs trained since
join runs/ and dvc.lock's train stages, ready for a later sitting to resume from.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
import yaml

from gcl.core.atomic import atomic_path
from gcl.report.reproductions import RUN, SUMMARY, md5


def profile_stages(params: dict) -> set[str]:
    """The stage names dvc.yaml's foreach makes of this profile."""
    names = {f"check@{item}" for item in ("data", "runs", "reproductions")}
    names |= {f"prepare@{key}" for key in params["sources"]} | {f"benchmark@{key}" for key in params["benchmarks"]}
    return names | {f"train@{key}" for key in params["runs"]}


def finished(workspace: Path, key: str, out: dict) -> bool:
    """Whether run `key`'s folder holds a finished run: DVC deletes a stage's outputs before it runs it again, and a
    run being trained holds its progress lock; so a folder with its metrics.json and as many files as dvc.lock
    records, and no trainer, is the one dvc.lock records."""
    folder = workspace / out["path"]
    return (folder / "metrics.json").is_file() and not (workspace / ".gcl-progress" / f"{key}.lock").exists() \
        and out.get("nfiles") == sum(f.is_file() for f in folder.rglob("*"))


def report_is_current(workspace: Path, lock: dict, params: dict) -> bool:
    """Whether results/ is the report of every run of params.yaml that dvc.lock records: its summary.csv has the
    recorded MD5 and holds every run of params.yaml, and nothing else."""
    outs = {out["path"]: out for out in lock["stages"].get("report", {}).get("outs", [])}
    summary = workspace / SUMMARY
    if SUMMARY not in outs or not summary.is_file() or md5(summary) != outs[SUMMARY]["md5"]:
        return False
    cells = {tuple(str(v) for v in row) for row in pd.read_csv(summary)[RUN].itertuples(index=False)}
    return cells == {(r["benchmark"], r["method"], str(r["buffer"])) for r in params["runs"].values()}


def copy_folder(src: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def records_params(entry: dict) -> bool:
    """Whether a dvc.lock stage records params.yaml's digest (the check stages and the report do)."""
    return any(dep.get("path") == "params.yaml" and "md5" in dep for dep in entry.get("deps") or [])


def folder_report(dest: Path) -> dict | None:
    """The stages of the folder's dvc.lock that belong with its report (None when it holds none): the report and
    every stage recording the digest of the params.yaml that report was made from."""
    lock_file = dest / "dvc.lock"
    if not (dest / "results").is_dir() or not lock_file.is_file():
        return None
    stages = yaml.safe_load(lock_file.read_text())["stages"]
    if "report" not in stages:
        return None
    return {name: entry for name, entry in stages.items() if name == "report" or records_params(entry)}


def snapshot(workspace: Path, dest: Path) -> list[str]:
    params_text = (workspace / "params.yaml").read_text()
    params = yaml.safe_load(params_text)
    lock = yaml.safe_load((workspace / "dvc.lock").read_text())
    keep = profile_stages(params)
    stages = {name: entry for name, entry in lock["stages"].items() if name in keep}
    copied = []
    if report_is_current(workspace, lock, params):      # the report of every run listed: results/ joins them
        stages["report"] = lock["stages"]["report"]
        copy_folder(workspace / "results", dest / "results")
        copied.append("report")
    elif (kept_report := folder_report(dest)) is not None:    # the folder's report of part of the grid stays whole
        stages = {name: entry for name, entry in stages.items() if not records_params(entry)} | kept_report
        params_text = (dest / "params.yaml").read_text()
    for name, entry in stages.items():
        if not name.startswith("train@"):
            continue
        (out,) = entry["outs"]
        if not finished(workspace, name.removeprefix("train@"), out):
            continue
        copy_folder(workspace / out["path"], dest / out["path"])
        copied.append(name)
    for name, text in (("params.yaml", params_text),
                       ("dvc.lock", yaml.safe_dump({"schema": lock["schema"], "stages": stages}, sort_keys=False))):
        with atomic_path(dest / name) as tmp:
            Path(tmp).write_text(text)
    return copied


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m gcl.snapshot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workspace", type=Path)
    p.add_argument("dest", type=Path)
    args = p.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    copied = snapshot(args.workspace, args.dest)
    print(f"{len(copied)} finished run(s) in {args.dest}: {', '.join(sorted(copied)) or '-'}")


if __name__ == "__main__":
    main()
