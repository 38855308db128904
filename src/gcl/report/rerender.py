"""A committed reproduction checked as a reader reads it, and rendered again when the report's code changes.

A folder of report.reproductions (gcl.report.reproductions) holds a profile's params.yaml, dvc.lock, results/ and,
where they were committed, the runs' runs/<benchmark>/<method>/<buffer>/metrics.json. Its dvc.lock vouches for the
inputs (params.yaml, results/summary.csv); this module vouches for the rest:

- params.yaml holds the settings of the profile it is named after: reproductions/<name>/params.yaml parses to what
  profiles/<name>.yaml parses to, comments aside (`check_profile`);
- where runs/ is committed, summary.csv is what the report builds from the runs' metrics.json, so an edited seed
  shows, named by its run (`check_runs`);
- tables.md, costs.md, metrics.json and the plot data are what the report renders today from those inputs and the
  published numbers (reference/*.csv), byte for byte (`check_outputs`); the figures (PNG) are not compared.

- a README (the folder's, and the project's README.md) states a reproduction's readings only inside a block that
  this module generates from the folder's runs, between `<!-- readings: reproductions/<name> -->` and
  `<!-- /readings -->`, and the block is what it generates today (`check_readme_blocks`).

So an edited verdict row, seed, number or setting stops check@reproductions with a line naming the file. A change of
the report's code (a reading rule, a caption) makes every reproduction's documents stale in the same way; they are
rendered again from their own inputs with

    python -m gcl.rerender reproductions/<name> [...]

which rewrites the compared files of results/ (never summary.csv, params.yaml, dvc.lock or runs/).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from gcl.report.common import ReportError
from gcl.report.comparison import LEVEL, TIE_WITHIN, comparison_rows, interval_text
from gcl.report.display import Display, fmt_mean_std, markdown
from gcl.report.document import COSTS, TABLES
from gcl.report.paper import read_paper
from gcl.report.reproductions import PARAMS, SUMMARY, read_summary
from gcl.report.summary import ResolvedReport, load_cells, stale_runs, summary_frame, unrun
from gcl.report.write import render_report

PROFILES = Path("profiles")
RERENDER = "python -m gcl.rerender"   # the command that renders a reproduction again (gcl.rerender)
REFERENCE = Path("reference")
DOCUMENTS = (TABLES, COSTS, "metrics.json")   # under results/; with the plot data, what check_outputs compares
READMES = ("README.md",)                       # besides the folder's own README.md: files that may hold its readings
BLOCK = re.compile(r"<!-- readings: (?P<folder>\S+) -->\n(?P<body>.*?)<!-- /readings -->", re.S)


def profile_of(folder: Path) -> Path:
    """The profile a reproduction folder is a run of: profiles/<the folder's name>.yaml."""
    return PROFILES / f"{folder.name}.yaml"


def check_profile(folder: Path) -> None:
    """The folder's params.yaml must hold the settings of its profile, every value equal (comments may differ: they
    document, and the profile's are kept current); the first setting that differs is named."""
    profile, params = profile_of(folder), folder / PARAMS
    if not profile.is_file():
        raise ReportError(f"{folder} names no profile: {profile} does not exist (a reproduction folder is named after "
                          "the profile it ran); rename the folder or add the profile")
    ran, declared = yaml.safe_load(params.read_text()), yaml.safe_load(profile.read_text())
    where = first_different_setting(declared, ran)
    if where is not None:
        raise ReportError(f"{params} is not {profile}: {where}; a reproduction holds the profile it ran, unedited: "
                          f"restore it (`git checkout -- {params}`), or make the profile and the folder one again (train "
                          "the profile's changed runs and snapshot them)")


def first_different_setting(expected, actual, path: str = "") -> str | None:
    """'runs.x.lr is 0.2 there, 0.1 here' for the first setting (in the expected file's order) that differs."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in [*expected, *(k for k in actual if k not in expected)]:
            inner = f"{path}.{key}" if path else str(key)
            if key not in actual:
                return f"{inner} is missing"
            if key not in expected:
                return f"{inner} is not in the profile"
            found = first_different_setting(expected[key], actual[key], inner)
            if found:
                return found
        return None
    if expected != actual:
        return f"{path or 'the file'} reads {_short(actual)} where the profile has {_short(expected)}"
    return None


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def first_difference(expected: Path, actual: Path, expected_name: str | None = None) -> str:
    """'line 12 reads '...x...' where <expected> has '...y...'' at the first place two text files differ."""
    a, b = expected.read_text().splitlines(), actual.read_text().splitlines()
    name = expected_name or str(expected)
    for i, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            at = next((j for j, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
            return f"line {i} reads {_around(y, at)} where {name} has {_around(x, at)}"
    if len(a) != len(b):
        return f"it has {len(b)} lines, {name} {len(a)}"
    return f"it differs from {name} in its line ends or bytes"


def _around(line: str, at: int, before: int = 30, after: int = 50) -> str:
    """The part of `line` around column `at`, with '...' where it is cut."""
    start = max(0, at - before)
    return repr(("..." if start else "") + line[start:at + after] + ("..." if at + after < len(line) else ""))


def check_runs(folder: Path, cells) -> pd.DataFrame:
    """summary.csv must be what the report builds from the runs' metrics.json (returned); the run of the first line
    that differs is named."""
    built = summary_frame(cells)
    mine, theirs = built.to_csv(index=False).splitlines(), (folder / SUMMARY).read_text().splitlines()
    if mine == theirs:
        return built
    line = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    if line == 0 or line > len(built):
        raise ReportError(f"{folder / SUMMARY} is not what the report builds from {folder}/runs (its columns or its "
                          f"length differ): restore it (`git checkout -- {folder}`)")
    row = built.iloc[line - 1]
    path = folder / "runs" / row.benchmark / row.method / str(row.buffer) / "metrics.json"
    raise ReportError(f"{path} does not hold what {folder / SUMMARY} records for seed {row.seed} (line {line + 1} of "
                      f"the summary): one of the two was edited; restore them (`git checkout -- {folder}`)")


def render_again(folder: Path, resolved: dict, out: Path, paper_csvs: list[Path] | None = None) -> list[str]:
    """The folder's report rendered from its own inputs into the empty folder `out` (no figures); returns the paths,
    relative to results/, that a reader reads and that the inputs determine: the documents, and the plot data (the
    curves and confusion matrices only where runs/ is committed)."""
    report = ResolvedReport.from_json(resolved)
    if report.settings.reproductions:
        raise ReportError(f"{folder / PARAMS} lists reproductions of its own (report.reproductions): a reproduction "
                          "holds one profile's results; remove them there")
    # the runs' results where the folder was committed with its runs/ (a run not there has not run yet), else none
    cells = load_cells(report, folder) if (folder / "runs").is_dir() else None
    summary = check_runs(folder, cells) if cells is not None else read_summary(folder)
    warnings = [f"stale: {run} is not a run of params.yaml; delete it" for run in stale_runs(report, folder)]
    paper = read_paper(paper_csvs if paper_csvs is not None else sorted(REFERENCE.glob("*.csv")))
    render_report(report, summary, cells, paper, out, warnings, figures=False)
    plots = sorted(p.relative_to(out).as_posix() for p in (out / "plots").rglob("*.csv"))
    return [*DOCUMENTS, *plots]


def compared_plots(folder: Path, has_runs: bool) -> list[str]:
    """The plot data committed under results/plots that the inputs determine (all of it where runs/ is committed;
    else the sensitivity sweep's, built from the summary)."""
    plots = folder / "results" / "plots"
    found = sorted(p.relative_to(folder / "results").as_posix() for p in plots.rglob("*.csv"))
    return found if has_runs else [p for p in found if p.startswith("plots/sensitivity/")]


def check_outputs(folder: Path, resolved: dict) -> None:
    """results/ must hold what the report renders today from the folder's inputs (render_again), byte for byte."""
    with tempfile.TemporaryDirectory() as tmp:
        rendered = render_again(folder, resolved, Path(tmp))
        committed = compared_plots(folder, (folder / "runs").is_dir())
        extra = sorted(set(committed) - set(rendered))
        if extra:
            raise ReportError(f"{folder / 'results' / extra[0]} is not part of the report of {folder / PARAMS}: remove it, "
                              f"or render the report again ({RERENDER} {folder})")
        for name in rendered:
            mine, theirs = Path(tmp) / name, folder / "results" / name
            if not theirs.is_file():
                raise ReportError(f"{theirs} is missing: render the report again ({RERENDER} {folder})")
            if mine.read_bytes() != theirs.read_bytes():
                raise ReportError(f"{theirs} is not what the report renders from {folder}'s runs and params.yaml: "
                                  f"{first_difference(mine, theirs, 'the rendering')}. Restore it (`git checkout -- "
                                  f"{theirs}`); where the report's code changed, render it again: {RERENDER} {folder}")


def rerender(folder: Path, resolved: dict) -> list[str]:
    """Rewrite the folder's compared results/ files with what the report renders today, and remove the plot data it no
    longer renders; returns those that changed."""
    with tempfile.TemporaryDirectory() as tmp:
        rendered = render_again(folder, resolved, Path(tmp))
        changed = []
        for name in rendered:
            mine, theirs = Path(tmp) / name, folder / "results" / name
            if theirs.is_file() and theirs.read_bytes() == mine.read_bytes():
                continue
            theirs.parent.mkdir(parents=True, exist_ok=True)
            staged = theirs.with_name(f".{theirs.name}.tmp")
            shutil.copyfile(mine, staged)
            os.replace(staged, theirs)          # a reader never sees half a file
            changed.append(name)
        for name in sorted(set(compared_plots(folder, (folder / "runs").is_dir())) - set(rendered)):
            (folder / "results" / name).unlink()    # plot data of a run the report no longer draws
            changed.append(f"{name} (removed)")
        return changed


# ---------------------------------------------------------------------------- readings quoted in a README


def readings_block(folder: Path, resolved: dict) -> str:
    """The body of a README's readings block for `folder`: every comparison of its report (report.comparisons) as
    one table, a row per benchmark and buffer, with the reading rule and where the numbers come from."""
    report = ResolvedReport.from_json(resolved)
    summary, display = read_summary(folder), Display(report)
    pending = unrun(report, summary)
    rows = []
    for spec in report.settings.comparisons:
        main = display.label(spec.method)
        for r in comparison_rows(spec, summary, pending):
            rows.append({"benchmark": spec.benchmark, "buffer": r.buffer,
                         "method (seeds)": f"{main} {fmt_mean_std(r.main.mean(), r.main.std())} ({len(r.main)})",
                         "best other (seeds)": f"{display.label(r.best)} {fmt_mean_std(r.other.mean(), r.other.std())} "
                                               f"({len(r.other)})",
                         f"difference, {LEVEL:.0%} interval": f"{r.difference.estimate:+.2f} {interval_text(r.difference)}",
                         "reading": r.difference.verdict + (f" (not run yet: {', '.join(map(display.label, r.left_out))})"
                                                            if r.left_out else "")})
    if not rows:
        raise ReportError(f"{folder / PARAMS} has no report.comparisons: a README has no readings of it to quote")
    return (markdown(pd.DataFrame(rows)) + "\n\n"
            f"Mean ± std over seeds, Class-IL %; the best other method by mean at each buffer; Welch {LEVEL:.0%} "
            f"interval. Reading: wins or loses where the interval excludes 0, ties where it lies inside ±{TIE_WITHIN:g} "
            f"points, else not decided. Generated from {folder}'s runs by `{RERENDER}`; check@reproductions refuses "
            "it where it differs from them.\n")


def readme_files(folder: Path) -> list[Path]:
    return [p for p in (folder / "README.md", *map(Path, READMES)) if p.is_file()]


def check_readme_blocks(folder: Path, resolved: dict) -> None:
    """Each readings block of `folder` in its README and the project's holds what readings_block generates."""
    expected = None
    for readme in readme_files(folder):
        for block in BLOCK.finditer(readme.read_text()):
            if Path(block["folder"]) != folder:
                continue
            expected = expected or readings_block(folder, resolved)
            if block["body"] != expected:
                line = readme.read_text()[:block.start("body")].count("\n") + 1
                raise ReportError(f"{readme}: the readings block of {folder} (from line {line}) is not what {folder}'s "
                                  f"runs give: restore it (`git checkout -- {readme}`), or, where the runs or the report's "
                                  f"code changed, generate it again: {RERENDER} {folder}")


def rewrite_readme_blocks(folder: Path, resolved: dict) -> list[str]:
    """Generate each readings block of `folder` again; returns the READMEs that changed."""
    changed = []
    for readme in readme_files(folder):
        text = readme.read_text()
        new = BLOCK.sub(lambda m: m.group(0) if Path(m["folder"]) != folder else
                        f"<!-- readings: {m['folder']} -->\n{readings_block(folder, resolved)}<!-- /readings -->", text)
        if new != text:
            staged = readme.with_name(f".{readme.name}.tmp")
            staged.write_text(new)
            os.replace(staged, readme)
            changed.append(readme.as_posix())
    return changed
