"""The params.yaml of a report of part of a grid: a profile cut to the runs a workspace has finished, and its report
cut to what those runs can draw.

    python tools/part_profile.py <workspace> --profile profiles/<name>.yaml      # writes <workspace>/params.yaml

A run is finished when tools/snapshot_reproduction.py would copy it (its train stage in the workspace's dvc.lock,
its folder complete, no trainer at work on it). The runs not finished are removed, and so is every part of the
report that would need one of them, since the report stops on a part naming a run that does not exist:
- a table with explicit `rows` where a row has no run on its benchmarks (at its buffers): a partial Table 3 would
  read as the paper's table;
- a method of a comparison's `against` without a run at every buffer where the compared method ran, and the
  comparison itself where its method has no run or no other method is left;
- an ablation (at every buffer one of its configurations lacks), a sensitivity sweep with a point missing (the
  whole figure where no sweep is left), a visualised cell.
(A curve group may name a method without runs: the figure draws those that ran.)
The cuts are made in the text, at the lines a round-trip parse locates (a comment right above cut entries goes
with them), so the rest keeps the profile's comments and layout; the result starts with a comment naming the cuts.
A report text that names a method cut out is printed as a warning: its words are the profile's, edit them by hand
where they must change. Written to a temporary file, then renamed.

Errors: a workspace without dvc.lock, or with no finished run of the profile.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tools"))
from gcl.config import load_params, resolve_run  # noqa: E402
from gcl.core.atomic import atomic_path  # noqa: E402
from snapshot_reproduction import finished  # noqa: E402


class PartError(Exception):
    pass


def finished_runs(workspace: Path, params: dict) -> list[str]:
    """The profile's runs that the workspace has finished, in the profile's order."""
    lock_file = workspace / "dvc.lock"
    if not lock_file.is_file():
        raise PartError(f"{lock_file} not found: the workspace has trained nothing yet (run `dvc repro -s train@<run>`)")
    stages = yaml.safe_load(lock_file.read_text())["stages"]
    done = []
    for key in params["runs"]:
        entry = stages.get(f"train@{key}")
        if entry is not None and finished(workspace, key, entry["outs"][0]):
            done.append(key)
    return done


class Cells:
    """What the kept runs trained: (benchmark, method) -> the buffers, as strings ('none' for none)."""

    def __init__(self, params: dict, keys: list[str]):
        self.buffers: dict[tuple[str, str], set[str]] = {}
        for key in keys:
            run = resolve_run(params, key).run
            self.buffers.setdefault((run.benchmark, run.method), set()).add(str(run.buffer))

    def has(self, benchmark: str, method: str, buffers=None) -> bool:
        ran = self.buffers.get((benchmark, method), set())
        return bool(ran) if buffers is None else {str(b) for b in buffers} <= ran

    def on(self, benchmark: str, method: str) -> set[str]:
        return self.buffers.get((benchmark, method), set())

    def benchmarks(self) -> set[str]:
        return {b for b, _ in self.buffers}


def _cell(cell: str) -> tuple[str, list[str]]:
    """'er/200' -> ('er', ['200'])."""
    method, buffer = cell.split("/")
    return method, [buffer]


@dataclass
class Edit:
    """Replace lines[start:end] (0-based) of the profile by `lines`."""
    start: int
    end: int
    lines: list[str]


class Cutter:
    """Edits of the profile's text, located by the round-trip parse's line numbers: the text outside them stays as
    written (comments, layout, anchors)."""

    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self.edits: list[Edit] = []
        self.cut: list[str] = []

    def _block(self, line: int) -> Edit:
        """The lines of the entry starting at `line`: up to the next line (a comment too) indented no deeper than
        its first (a comment right above the next entry is that entry's)."""
        indent, end = self._indent(line), line + 1
        while end < len(self.lines) and (not self.lines[end].strip() or self._indent(end) > indent):
            end += 1
        while end > line + 1 and not self.lines[end - 1].strip():     # the blank lines after it stay
            end -= 1
        return Edit(line, end, [])

    def _indent(self, line: int) -> int:
        return len(self.lines[line]) - len(self.lines[line].lstrip(" "))

    def _heading(self, start: int, dropped_starts: set[int]) -> tuple[int, int]:
        """The comment lines right above the entry at `start` (same indentation), where every entry they head (up
        to the next blank line, comment or shallower line) is cut: (first, start), else an empty range."""
        indent, first = self._indent(start), start
        while first > 0 and self.lines[first - 1].lstrip().startswith("#") and self._indent(first - 1) == indent:
            first -= 1
        line = start
        while line < len(self.lines) and self.lines[line].strip() and self._indent(line) >= indent:
            if self._indent(line) == indent:
                if self.lines[line].lstrip().startswith("#"):
                    break
                if line not in dropped_starts:
                    return start, start
            line += 1
        return first, start

    def drop_key(self, mapping, key, why: str) -> None:
        self.edits.append(self._block(mapping.lc.key(key)[0]))
        self.cut.append(why)

    def drop_item(self, seq, index: int, why: str) -> None:
        self.edits.append(self._block(seq.lc.item(index)[0]))
        self.cut.append(why)

    def keep_in_list(self, mapping, key, kept: list, why: str) -> None:
        """`mapping[key]`, a flow list written on one line ([a, b, c]), rewritten to hold `kept` only; `why` is
        followed by the items cut."""
        line, col = mapping.lc.value(key)
        text = self.lines[line]
        close = text.find("]", col)
        if text[col:col + 1] != "[" or close < 0:
            raise PartError(f"line {line + 1}: {key}'s list is not written on one line as [a, b]; write it so, "
                            "or cut it by hand")
        self.edits.append(Edit(line, line + 1, [text[:col] + "[" + ", ".join(str(k) for k in kept) + "]" + text[close + 1:]]))
        self.cut.append(why + ", ".join(str(item) for item in mapping[key] if item not in kept))

    def text(self) -> str:
        """The profile with the edits made; an edit inside a cut block is moot."""
        blocks = [(e.start, e.end) for e in self.edits if not e.lines]
        starts = {a for a, _ in blocks}
        blocks += [heading for heading in (self._heading(a, starts) for a, _ in blocks) if heading[0] < heading[1]]

        def inside(start: int, end: int) -> bool:
            return any(a <= start and end <= b and (a, b) != (start, end) for a, b in blocks)

        edits = {(e.start, e.end, tuple(e.lines)) for e in self.edits if not inside(e.start, e.end)}
        edits |= {(a, b, ()) for a, b in blocks if not inside(a, b)}
        lines = list(self.lines)
        for start, end, new in sorted(edits, reverse=True):
            lines[start:end] = new
        return "".join(lines)


def cut_report(report, cells: Cells, cutter: Cutter) -> None:
    """Records in `cutter` the cuts of what the kept runs cannot draw from `report` (the round-trip mapping)."""
    gone = {}                 # list of the report -> {index: why} of its items cut
    for i, spec in enumerate(report.get("tables") or []):
        if spec.get("rows"):
            on = spec.get("benchmarks") or sorted(cells.benchmarks())
            lacking = [m for m in spec["rows"] if not any(cells.has(b, m, spec.get("buffers")) for b in on)]
            if lacking:
                gone.setdefault("tables", {})[i] = f"report.tables: {spec['title']!r} (no run of {', '.join(lacking)})"
    for i, spec in enumerate(report.get("comparisons") or []):
        buffers = cells.on(spec["benchmark"], spec.get("method", "coca"))
        kept = [m for m in spec["against"] if buffers and cells.has(spec["benchmark"], m, buffers)]
        if not kept:
            gone.setdefault("comparisons", {})[i] = f"report.comparisons[{i}] on {spec['benchmark']} (no runs)"
        elif kept != list(spec["against"]):
            cutter.keep_in_list(spec, "against", kept, f"report.comparisons[{i}].against: ")
    for i, spec in enumerate(report.get("ablation") or []):
        kept = [b for b in spec["buffers"] if all(cells.has(spec["benchmark"], m, [b]) for m in spec["configurations"])]
        if not kept:
            gone.setdefault("ablation", {})[i] = f"report.ablation[{i}] (a configuration has no run)"
        elif kept != list(spec["buffers"]):
            cutter.keep_in_list(spec, "buffers", kept, f"report.ablation[{i}] at buffers ")
    for name, items in gone.items():
        if len(items) < len(report[name]):
            for i, why in items.items():
                cutter.drop_item(report[name], i, why)
        elif name == "tables":      # an empty list would bring back the default tables, of runs this profile lacks
            raise PartError("every table of report.tables needs a run not finished: nothing to report yet")
        else:
            cutter.drop_key(report, name, "; ".join(items.values()))
    sensitivity = report.get("sensitivity")
    if sensitivity:
        sweeps = sensitivity["sweeps"]
        lacking = {i: [m for m in sweep["methods"] if not cells.has(sensitivity["benchmark"], m, [sensitivity["buffer"]])]
                   for i, sweep in enumerate(sweeps)}
        if all(lacking.values()):
            cutter.drop_key(report, "sensitivity", "report.sensitivity (no sweep has all its runs)")
        else:
            for i, missing in lacking.items():
                if missing:
                    cutter.drop_item(sweeps, i, f"report.sensitivity: the {sweeps[i]['parameter']} sweep "
                                                f"(no run of {', '.join(missing)})")
    visualise = report.get("visualise")
    if visualise:
        kept = [c for c in visualise["cells"] if cells.has(visualise["benchmark"], *_cell(c))]
        if not kept:
            cutter.drop_key(report, "visualise", "report.visualise (none of its cells ran)")
        elif kept != list(visualise["cells"]):
            cutter.keep_in_list(visualise, "cells", kept, "report.visualise.cells: ")


def texts_naming(report: dict, names: list[str]) -> list[str]:
    """The report's texts (table texts, comparison texts, the sensitivity title and note) that name one of `names`."""
    texts = [spec.get("text", "") for spec in report.get("tables") or []]
    texts += [spec.get("text", "") for spec in report.get("comparisons") or []]
    sensitivity = report.get("sensitivity") or {}
    texts += [sensitivity.get("title", ""), sensitivity.get("paper_note", "")]
    return [t for t in texts if t and any(n in t for n in names)]


def part_profile(profile_text: str, done: list[str], params: dict) -> tuple[str, list[str]]:
    """The profile's text cut to the runs `done` (keys of params['runs']), and a line per cut."""
    doc = YAML().load(profile_text)
    cutter = Cutter(profile_text)
    for key in params["runs"]:
        if key not in done:
            cutter.drop_key(doc["runs"], key, f"runs.{key}")
    if doc.get("report") is not None:
        cut_report(doc["report"], Cells(params, done), cutter)
    header = "".join(f"# {line}\n" for line in textwrap.wrap(
        "A REPORT OF PART OF THE GRID (tools/part_profile.py): the profile cut to the runs finished so far; cut out: "
        + "; ".join(cutter.cut) + ".", 116)) if cutter.cut else ""
    return header + cutter.text(), cutter.cut


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workspace", type=Path)
    p.add_argument("--profile", type=Path, help="the whole profile (default: the workspace's params.yaml)")
    p.add_argument("--out", type=Path, help="where to write (default: the workspace's params.yaml)")
    args = p.parse_args(argv)
    profile = args.profile or args.workspace / "params.yaml"
    try:
        params = load_params(profile)
        done = finished_runs(args.workspace, params)
        if not done:
            raise PartError(f"no run of {profile} is finished in {args.workspace}: nothing to report")
        text, cut = part_profile(profile.read_text(), done, params)
    except PartError as exc:
        sys.exit(f"part_profile: {exc}")
    names = [m for m in {params["runs"][k]["method"] for k in params["runs"]} - {params["runs"][k]["method"] for k in done}]
    labels = [((params.get("report") or {}).get("methods") or {}).get(m, {}).get("label") or m for m in names]
    for text_named in texts_naming(yaml.safe_load(text).get("report") or {}, labels):
        print(f"warning: this report text names a method cut out; edit it if it must change: {text_named[:100]!r}")
    out = args.out or args.workspace / "params.yaml"
    with atomic_path(out) as tmp:
        Path(tmp).write_text(text)
    print(f"{out}: {len(done)} finished run(s) kept; cut out {len(cut)}:\n  " + "\n  ".join(cut or ["nothing"]))


if __name__ == "__main__":
    main()
