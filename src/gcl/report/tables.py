"""The paper's tables with our mean ± std beside its numbers, and the headline (the main method against the best
baseline, with the few numbers `dvc exp show` compares).

It knows nothing of one profile: row names, row order, the paper rows each method is compared with, footnotes
and the tables themselves come from the `report:` block of params.yaml (declared in gcl.report.settings) or
from the method's registration (its algorithm; optional `label` and `paper_row` class attributes).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gcl.report.common import buffer_key
from gcl.report.display import Display, buffer_text, fmt_difference, fmt_number, fmt_ours, markdown
from gcl.report.paper import paper_value
from gcl.report.settings import TableSpec
from gcl.report.summary import ResolvedReport, environments, stats

# ---------------------------------------------------------------------------- the paper's tables


def table_benchmarks(spec: TableSpec, summary: pd.DataFrame, resolved: ResolvedReport) -> list[str]:
    ran = [b for b in resolved.benchmarks if b in set(summary.benchmark)]
    if spec.benchmarks is not None:
        return list(spec.benchmarks) if all(b in ran for b in spec.benchmarks) else []
    return [b for b in ran if summary[summary.benchmark == b][spec.metric].notna().any()]


def table_rows(spec: TableSpec, display: Display, present: set[str]) -> list[tuple[str, str]]:
    """(row method, method shown) pairs of a table on one benchmark."""
    if spec.rows is None:
        return [(m, m) for m in display.sort(present) if m not in spec.exclude]
    rows = []
    for m in spec.rows:
        if m in present:
            rows.append((m, m))
        elif spec.stand_in.get(m) in present:
            rows.append((m, spec.stand_in[m]))
    return rows


def accuracy_table(spec: TableSpec, summary: pd.DataFrame, paper: pd.DataFrame, display: Display,
                   benchmark: str) -> tuple[str, list[str]]:
    """One benchmark's table (markdown) and its footnotes."""
    ours = summary[summary.benchmark == benchmark]
    st = stats(ours, spec.metric)
    present = set(st.dropna(subset=["mean"]).method)
    rows = table_rows(spec, display, present)
    buffers = sorted(set(st[st.method.isin([shown for _, shown in rows])].buffer), key=buffer_key)
    out, notes = [], []
    for row_method, shown in rows:
        label = spec.labels.get(shown) or display.label(shown)   # a stand-in is named as itself
        ref_table, ref_row = display.paper_row(row_method)
        line, has_paper = {"method": label}, False
        for b in buffers:
            hit = st[(st.method == shown) & (st.buffer == b)]
            name = buffer_text(b)
            value = paper_value(paper, ref_table or spec.paper_table, spec.metric, benchmark, ref_row, b)
            line[f"{name} ours"] = fmt_ours(*hit[["mean", "std"]].iloc[0], value) if len(hit) else "-"
            line[f"{name} paper"] = fmt_number(value)
            has_paper |= value is not None
        out.append(line)
        if has_paper:     # a note explains a paper column: none where that column is empty
            notes += [f"{label}: {n}" for n in display.notes(shown, benchmark)]
    return markdown(pd.DataFrame(out)), list(dict.fromkeys(notes))


def table_section(spec: TableSpec, resolved: ResolvedReport, summary: pd.DataFrame, paper: pd.DataFrame,
                  display: Display, h: str) -> str:
    """One of the paper's tables as a section headed `h`: a sub-section per benchmark that ran it, each with its
    notes (the rows' notes, mixed environments); '' where no benchmark has it."""
    sections = []
    for b in table_benchmarks(spec, summary, resolved):
        present = set(summary[(summary.benchmark == b) & summary[spec.metric].notna()].method)
        rows = table_rows(spec, display, present)
        if not rows:
            continue
        if spec.rows is not None and len(present & set(spec.rows)) < 2:
            continue        # named rows (an ablation) with one configuration run compare nothing
        table, notes = accuracy_table(spec, summary, paper, display, b)
        mixed = environments(summary[summary.benchmark == b])
        if len(mixed) > 1:
            notes = [f"its cells come from {len(mixed)} environments: " + "; ".join(mixed), *notes]
        sections.append(f"{h}# {b}\n\n" + "".join(f"- {n}\n" for n in notes) + ("\n" if notes else "") + table + "\n\n")
    if not sections:
        return ""
    return f"{h} {spec.title}\n\n" + (f"{spec.text}\n\n" if spec.text else "") + "".join(sections)


# ---------------------------------------------------------------------------- the headline

@dataclass(frozen=True)
class HeadlineSide:
    """One method of a headline row: our mean (and std) over seeds and the paper's number."""

    method: str
    label: str                     # its label, '(no buffer)' added where it competes without one
    class_il: float
    class_il_std: float
    task_il: float | None          # None on a benchmark without tasks
    paper_class_il: float | None
    paper_task_il: float | None


@dataclass(frozen=True)
class HeadlineRow:
    benchmark: str
    buffer: str
    main: HeadlineSide
    baseline: HeadlineSide | None  # None where no other method ran at that buffer or without one


def _side(method: str, bench: str, b: str, at: pd.DataFrame, task: pd.DataFrame, paper: pd.DataFrame,
          display: Display) -> HeadlineSide:
    """`method`'s side of the headline row of (bench, b); `at`: the Class-IL stats at b or without a buffer."""
    h = display.settings.headline
    ref_table, row = display.paper_row(method)
    mine = at[at.method == method].iloc[0]
    own = mine.buffer                                       # b, or "none"
    t = task[(task.benchmark == bench) & (task.buffer == own) & (task.method == method)]["mean"]
    return HeadlineSide(method, display.label(method) + (" (no buffer)" if own != b else ""),
                        float(mine["mean"]), float(mine["std"]),
                        float(t.iloc[0]) if len(t) and pd.notna(t.iloc[0]) else None,
                        paper_value(paper, ref_table or h.paper_table, "class_il", bench, row, own),
                        paper_value(paper, ref_table or h.task_paper_table, "task_il", bench, row, own))


def headline(summary: pd.DataFrame, paper: pd.DataFrame, display: Display) -> list[HeadlineRow]:
    """Per benchmark and buffer of the main method: its Class-IL (and Task-IL) and those of the best baseline
    (the method with the highest mean Class-IL at that buffer or without a buffer, variants of the main
    method and headline.exclude left out), with the paper's numbers. A method runs at one buffer or none,
    so (benchmark, method) picks one row among those."""
    h = display.settings.headline
    main_alg = display.algorithm_of(h.method)
    out = []
    cls, task = stats(summary, "class_il"), stats(summary, "task_il")
    for bench in dict.fromkeys(summary.benchmark):
        for b in sorted(set(cls[(cls.benchmark == bench) & (cls.method == h.method)].buffer), key=buffer_key):
            at = cls[(cls.benchmark == bench) & (cls.buffer.isin([b, "none"]))]   # methods without memory compete too
            base = at[~at.method.isin(h.exclude) & (at.method.map(display.algorithm_of) != main_alg)]
            best = base.loc[base["mean"].idxmax(), "method"] if len(base) else None
            out.append(HeadlineRow(bench, b, _side(h.method, bench, b, at, task, paper, display),
                                   _side(best, bench, b, at, task, paper, display) if best is not None else None))
    return out


def headline_metrics(rows: list[HeadlineRow]) -> dict:
    """results/metrics.json: the few numbers `dvc exp show` / `dvc metrics diff` compare, per benchmark and
    buffer; no timings (they differ on every run)."""
    out: dict = {}
    for e in rows:
        cell = out.setdefault(e.benchmark, {}).setdefault(e.buffer, {})
        for side, key in ((e.main, e.main.method), (e.baseline, "best_baseline")):
            if side is None:
                continue
            entry = {"method": side.method} if key == "best_baseline" else {}
            entry["class_il"] = round(side.class_il, 2)
            if side.task_il is not None:
                entry["task_il"] = round(side.task_il, 2)
            cell[key] = entry
    return out


def headline_table(rows: list[HeadlineRow]) -> str:
    """Class-IL of the main method and the best baseline: ours (≈ as in the other tables), the paper's, and
    ours − paper; Task-IL (ours) where a benchmark has tasks."""
    lines = []
    tasks = any(s is not None and s.task_il is not None for e in rows for s in (e.main, e.baseline))
    for e in rows:
        m, b = e.main, e.baseline
        line = {"benchmark": e.benchmark, "buffer": e.buffer}
        for name, side in ((m.label, m), ("baseline", b)):
            if name == "baseline":
                line["best baseline"] = b.label if b else "-"
            line[f"{name} ours"] = fmt_ours(side.class_il, side.class_il_std, side.paper_class_il) if side else "-"
            line[f"{name} paper"] = fmt_number(side.paper_class_il) if side else "-"
            line[f"{name} ours − paper"] = fmt_difference(side.class_il, side.paper_class_il) if side else "-"
        if tasks:
            line[f"{m.label} Task-IL"] = fmt_number(m.task_il)
            line["baseline Task-IL"] = fmt_number(b.task_il) if b else "-"
        lines.append(line)
    return markdown(pd.DataFrame(lines))

