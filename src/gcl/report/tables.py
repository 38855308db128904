"""The paper's tables with our mean ± std beside its numbers, and the headline (the main method against the best
baseline, with the few numbers `dvc exp show` compares).

It knows nothing of one profile: row names, row order, the paper rows each method is compared with, footnotes
and the tables themselves come from the `report:` block of params.yaml (declared in gcl.report.settings); a
method's algorithm from its registration.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gcl.report.common import ReportError, buffer_key
from gcl.report.display import Display, buffer_text, fmt_difference, fmt_number, fmt_ours, markdown
from gcl.report.paper import Published, published, table_source
from gcl.report.settings import TableSpec
from gcl.report.summary import ResolvedReport, environments, mixes_environments, stats

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


def column_sources(numbers: list[Published | None], primary: str) -> list[str]:
    """The published columns of one group of cells: `primary`'s (the table's own reference) always, another
    source's only where it has a number, each headed by its source."""
    return [primary, *(s for s in dict.fromkeys(p.source for p in numbers if p) if s != primary)]


def published_cells(numbers: list[Published | None], source: str) -> list[str]:
    """Each row's published number under `source`'s heading, '-' where that source has none for the row."""
    return [fmt_number(p.value) if p and p.source == source else "-" for p in numbers]


def accuracy_table(spec: TableSpec, summary: pd.DataFrame, paper: pd.DataFrame, display: Display,
                   benchmark: str) -> tuple[str, list[str]]:
    """One benchmark's table (markdown) and its footnotes: per buffer our mean ± std, then the published numbers
    under their sources' names ('paper' for the CoCa paper's, e.g. 'DER paper' for another)."""
    st = stats(summary[summary.benchmark == benchmark], spec.metric)
    rows = table_rows(spec, display, set(st.dropna(subset=["mean"]).method))
    buffers = sorted(set(st[st.method.isin([shown for _, shown in rows])].buffer), key=buffer_key)
    if spec.buffers is not None:
        kept = {str(b) for b in spec.buffers}
        buffers = [b for b in buffers if b in kept]
    numbers = {b: [] for b in buffers}
    notes = []
    for row_method, shown in rows:
        ref_table, ref_row = display.paper_row(row_method)
        for b in buffers:
            numbers[b].append(published(paper, ref_table or spec.paper_table, spec.metric, benchmark, ref_row, b))
        if any(numbers[b][-1] for b in buffers):     # a note explains a published number: none where there is none
            label = spec.labels.get(shown) or display.label(shown)
            notes += [f"{label}: {n}" for n in display.notes(shown, benchmark)]
    columns = {"method": [spec.labels.get(shown) or display.label(shown) for _, shown in rows]}   # a stand-in as itself
    primary = table_source(paper, spec.paper_table)
    for b in buffers:
        name = buffer_text(b)
        columns[f"{name} ours"] = [_ours(st, shown, b, number) for (_, shown), number in zip(rows, numbers[b])]
        for source in column_sources(numbers[b], primary):
            columns[f"{name} {source}"] = published_cells(numbers[b], source)
    return markdown(pd.DataFrame(columns)), list(dict.fromkeys(notes))


def _ours(st: pd.DataFrame, method: str, buffer: str, number: Published | None) -> str:
    hit = st[(st.method == method) & (st.buffer == buffer)]
    return fmt_ours(*hit[["mean", "std"]].iloc[0], number and number.value) if len(hit) else "-"


def table_section(spec: TableSpec, resolved: ResolvedReport, summary: pd.DataFrame, paper: pd.DataFrame,
                  display: Display, h: str, below: dict[str, str] | None = None) -> str:
    """One of the paper's tables as a section headed `h`: a sub-section per benchmark that ran it, each with its
    notes (the rows' notes, mixed environments) and, under the table, `below`'s text for that benchmark (e.g.
    Table 3's claims); '' where no benchmark has it. Text for a benchmark without a sub-section is an error."""
    below = below or {}
    sections, shown = [], set()
    for b in table_benchmarks(spec, summary, resolved):
        present = set(summary[(summary.benchmark == b) & summary[spec.metric].notna()].method)
        rows = table_rows(spec, display, present)
        if not rows:
            continue
        if spec.rows is not None and len(present & set(spec.rows)) < spec.min_rows:
            continue        # too few named rows to compare (an ablation with one configuration run)
        table, notes = accuracy_table(spec, summary, paper, display, b)
        on = summary[summary.benchmark == b]
        if mixes_environments(on):
            mixed = environments(on)
            notes = [f"its cells come from {len(mixed)} environments: " + "; ".join(mixed), *notes]
        sections.append(f"{h}# {b}\n\n" + "".join(f"- {n}\n" for n in notes) + ("\n" if notes else "") + table + "\n\n"
                        + below.get(b, ""))
        shown.add(b)
    lost = [b for b in below if b not in shown]
    if lost:
        raise ReportError(f"{spec.title!r} has no section on {', '.join(lost)}, where report.ablation's line goes "
                          f"under it: it needs runs of {spec.min_rows} of its rows there")
    if not sections:
        return ""
    return f"{h} {spec.title}\n\n" + (f"{spec.text}\n\n" if spec.text else "") + "".join(sections)


def unfilled_line(spec: TableSpec, resolved: ResolvedReport, summary: pd.DataFrame) -> str:
    """Why this profile has no section for the table (table_section gave none), and which profile fills it."""
    ran = [b for b in resolved.benchmarks if b in set(summary.benchmark)]
    if spec.benchmarks is not None and not set(spec.benchmarks) <= set(ran):
        why = "needs runs on " + " and ".join(b for b in spec.benchmarks if b not in ran)
    elif not table_benchmarks(spec, summary, resolved):
        why = f"no benchmark of this profile has {'tasks' if spec.metric == 'task_il' else 'its metric'}"
    else:
        why = (f"needs runs of {spec.min_rows} of its rows on one benchmark" if spec.rows is not None
               else "none of its methods ran")
    return f"{spec.title}: {why}" + (f"; {spec.filled_by} fills it" if spec.filled_by else "") + "."


# ---------------------------------------------------------------------------- the headline

@dataclass(frozen=True)
class HeadlineSide:
    """One method of a headline row: our mean (and std) over seeds and the paper's number."""

    method: str
    label: str                     # its label, '(no buffer)' added where it competes without one
    class_il: float
    class_il_std: float
    task_il: float | None          # None on a benchmark without tasks
    paper_class_il: Published | None
    paper_task_il: Published | None


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
                        published(paper, ref_table or h.paper_table, "class_il", bench, row, own),
                        published(paper, ref_table or h.task_paper_table, "task_il", bench, row, own))


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


def headline_table(rows: list[HeadlineRow], primary: str) -> str:
    """Class-IL of the main method and the best baseline: ours (≈ as in the other tables), each published number
    under its source's name and ours minus it; Task-IL (ours) where a benchmark has tasks. `primary`: the source
    of the headline's own reference table ('paper': the CoCa paper)."""
    main = rows[0].main.label
    columns = {"benchmark": [e.benchmark for e in rows], "buffer": [e.buffer for e in rows],
               **_side_columns(main, [e.main for e in rows], primary),
               "best baseline": [e.baseline.label if e.baseline else "-" for e in rows],
               **_side_columns("baseline", [e.baseline for e in rows], primary)}
    if any(s is not None and s.task_il is not None for e in rows for s in (e.main, e.baseline)):
        columns[f"{main} Task-IL"] = [fmt_number(e.main.task_il) for e in rows]
        columns["baseline Task-IL"] = [fmt_number(e.baseline.task_il) if e.baseline else "-" for e in rows]
    return markdown(pd.DataFrame(columns))


def _side_columns(name: str, sides: list[HeadlineSide | None], primary: str) -> dict[str, list[str]]:
    """One side's columns: ours, then per source its published number and ours minus it."""
    numbers = [side.paper_class_il if side else None for side in sides]
    columns = {f"{name} ours": [fmt_ours(side.class_il, side.class_il_std, number and number.value) if side else "-"
                                for side, number in zip(sides, numbers)]}
    for source in column_sources(numbers, primary):
        columns[f"{name} {source}"] = published_cells(numbers, source)
        columns[f"{name} ours − {source}"] = [
            fmt_difference(side.class_il, number.value) if side and number and number.source == source else "-"
            for side, number in zip(sides, numbers)]
    return columns
