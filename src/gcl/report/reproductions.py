"""Committed reproductions (report.reproductions): another profile's params.yaml, dvc.lock and results/, copied
from a workspace that ran it. The folder's own dvc.lock records the MD5 of its params.yaml and of the report's
outputs, so an edit of a number, a row or a setting since that `dvc repro` shows.

Stage check@reproductions verifies every folder (`verify`) before the report runs, so that a refused folder stops
`dvc repro` there and leaves results/ in place (DVC deletes a stage's outputs before running it), and writes what
the report reads of it to VERIFIED; the report takes a folder's numbers only while its summary.csv is the file
that was verified (`read_verified`).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from gcl.core.errors import UserError
from gcl.report.common import ReportError

VERIFIED = Path("resolved/reproductions/verified.json")   # check@reproductions' output (dvc.yaml)
PARAMS, SUMMARY, METRICS = "params.yaml", "results/summary.csv", "results/metrics.json"
# the inputs, whose digests the folder's dvc.lock must vouch for; what the report renders from them is checked by
# rendering it again (gcl.report.rerender)
RECORDED = (PARAMS, SUMMARY)
RUN = ["benchmark", "method", "buffer"]
ROW = [*RUN, "seed"]
NEVER_EMPTY = [*ROW, "class_il"]           # other columns may be empty for a whole run (Task-IL without tasks)
# columns a seed may leave empty where other seeds of its run hold a value: a run whose seeds do not fill whole stacks
# trains the rest alone (3 seeds in 2 processes: seeds 0 and 1 stacked, seed 2 alone), and a lone seed has no stack
SEEDWISE = ["env_stacked"]


def fix(folder: Path) -> str:
    return (f"restore it (`git checkout -- {folder}`), or copy params.yaml, dvc.lock and results/ of a finished "
            f"`dvc repro` of that profile into {folder} (docs/running.md: 'Another profile'), or remove it from "
            "report.reproductions")


def verify(folder: str | Path, resolve_profile: Callable[[Path], dict]) -> dict:
    """Check one folder of report.reproductions: its files are those its dvc.lock records, its params.yaml is a
    valid profile (`resolve_profile`, gcl.config's, resolves it as the report reads it), and its summary holds
    each seed of each run that params.yaml lists and that has run exactly once, with no value emptied. Returns what
    the report reads (VERIFIED); refuses in one line naming the folder and the file."""
    folder = Path(folder)
    for name in (PARAMS, "dvc.lock", SUMMARY, METRICS):
        if not (folder / name).is_file():
            raise ReportError(f"{folder / name} is missing (report.reproductions lists {folder}): {fix(folder)}")
    recorded = recorded_digests(folder)
    for name in RECORDED:
        check_digest(folder, name, recorded.get(name, []))
    resolved = resolve(folder, resolve_profile)
    check_rows(folder, read_summary(folder), resolved)
    return {"resolved": resolved, "summary_md5": md5(folder / SUMMARY)}


def md5(path: Path, legacy: bool = False) -> str:
    """DVC's MD5 of a file: of its bytes; `legacy` (a dvc.lock entry without `hash: md5`, from DVC 2): with
    Windows line ends made Unix ones first, as DVC 2 hashed text files."""
    data = path.read_bytes()
    return hashlib.md5(data.replace(b"\r\n", b"\n") if legacy else data).hexdigest()


def recorded_digests(folder: Path) -> dict[str, list[tuple[str, bool]]]:
    """(md5, legacy) of each file path that the folder's dvc.lock records, from every stage that names it."""
    lock = folder / "dvc.lock"
    try:
        stages = yaml.safe_load(lock.read_text())["stages"]
        entries = [e for stage in stages.values() for e in (stage.get("deps") or []) + (stage.get("outs") or [])]
        recorded: dict[str, list[tuple[str, bool]]] = {}
        for e in entries:
            if "md5" in e:
                recorded.setdefault(e["path"], []).append((e["md5"], e.get("hash") != "md5"))
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"{lock} cannot be read as a dvc.lock ({type(exc).__name__}): {fix(folder)}") from None
    return recorded


def check_digest(folder: Path, name: str, recorded: list[tuple[str, bool]]) -> None:
    """`name` must be the file that every stage of the folder's dvc.lock naming it recorded."""
    path = folder / name
    if not recorded:
        raise ReportError(f"{folder / 'dvc.lock'} records no digest of {name}, so {path} cannot be verified: "
                          f"{fix(folder)}")
    for digest, legacy in recorded:
        actual = md5(path, legacy)
        if actual != digest:
            raise ReportError(f"{path} is not the file {folder / 'dvc.lock'} records (md5 {actual}, recorded {digest}): "
                              f"it was edited after that `dvc repro`; {fix(folder)}")


def resolve(folder: Path, resolve_profile: Callable[[Path], dict]) -> dict:
    """The folder's params.yaml as the report reads it; a profile this code refuses is one line naming it."""
    try:
        return resolve_profile(folder / PARAMS)
    except UserError as exc:    # gcl.core.settings.ParamsError names the file only by its name, one problem a line
        reasons = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ReportError(f"{folder / PARAMS} (report.reproductions lists {folder}) is refused: {reasons}") from None


def read_summary(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / SUMMARY, dtype={"buffer": str})


def check_rows(folder: Path, summary: pd.DataFrame, resolved: dict) -> None:
    """Each seed of each run of `resolved` that has run (the run's own seeds where it lists them) appears once, nothing
    else does, and no value is emptied (a run with no seed at all has not run yet: its report says so): the columns
    NEVER_EMPTY hold one in every row, any other but SEEDWISE holds one for every seed of a run or for none."""
    path = folder / SUMMARY
    missing = [c for c in NEVER_EMPTY if c not in summary.columns]
    if missing:
        raise ReportError(f"{path} has no column {missing[0]}: {fix(folder)}")
    for column in summary.columns:
        if column in SEEDWISE:
            continue
        empty = summary[column].isna()
        if column not in NEVER_EMPTY:
            empty &= summary.groupby(RUN, dropna=False)[column].transform(lambda values: values.notna().any())
        if empty.any():
            raise ReportError(f"{path} has an empty {column} in {_row(summary, empty.idxmax())}"
                              f"{'' if column in NEVER_EMPTY else ', which the other seeds of its run have'}: "
                              f"{fix(folder)}")
    twice = summary.duplicated(ROW)
    if twice.any():
        raise ReportError(f"{path} repeats {_row(summary, twice.idxmax())}: each seed of a run appears once; "
                          f"{fix(folder)}")
    have = set(zip(summary.benchmark, summary.method, summary.buffer.astype(str), summary.seed.astype(int)))
    ran = {(b, m, buffer) for b, m, buffer, _ in have}
    # a run with no seed here has not run yet (a report of part of a grid says so); one with some seeds is half-copied
    want = {(r["benchmark"], r["method"], str(r["buffer"]), seed) for key, r in resolved["runs"].items()
            for seed in resolved["run_seeds"][key] if (r["benchmark"], r["method"], str(r["buffer"])) in ran}
    if want != have:
        missing, extra = sorted(want - have), sorted(have - want)
        raise ReportError(f"{path} does not hold the runs {folder / PARAMS} lists ({len(missing)} seed(s) missing, "
                          f"e.g. {missing[:2]}; {len(extra)} not listed, e.g. {extra[:2]}): {fix(folder)}")


def _row(summary: pd.DataFrame, index: int) -> str:
    """A summary row in words: 'the row of mnist-360 er 200 seed 1 (line 8)'."""
    row = summary.loc[index]
    return f"the row of {row.benchmark} {row.method} {row.buffer} seed {row.seed} (line {index + 2})"


def read_verified(folder: str | Path, verified: Path = VERIFIED) -> tuple[dict, pd.DataFrame]:
    """The resolved params and the summary of a folder that check@reproductions verified; refused when it was not
    verified, or its summary.csv changed since (as after `dvc repro -s report`)."""
    folder = Path(folder)
    again = "run `dvc repro` (its stage check@reproductions verifies it before the report)"
    try:
        record = json.loads(verified.read_text())[folder.as_posix()]
    except (OSError, ValueError, KeyError):
        raise ReportError(f"{folder} (report.reproductions) has not been verified against its dvc.lock: {again}") from None
    if md5(folder / SUMMARY) != record["summary_md5"]:
        raise ReportError(f"{folder / SUMMARY} changed since check@reproductions verified it: {again}")
    return record["resolved"], read_summary(folder)
