"""The paper's claims about CoCa's own parts, put as numbers and decided on the runs with Welch intervals
(gcl.report.comparison):

- Figure 4 (report.sensitivity): a section in tables.md naming the figure and its data, and one line per sweep
  stating its `span` (the range of Class-IL means between two values) and `changes` (from one point to another),
  each mean with its seeds' std and each difference with its 95% interval, and whether the claim declared with it
  (flat, rises, falls) holds, does not hold, or is not decided.
- Table 3 (report.ablation): a line per buffer under the table: each component helps where the configuration with
  it beats the same configuration without it (interval above 0), hurts where it loses so (interval below 0), counted
  over every such pair, and the full method is best where it beats every other configuration so; the pairs that do
  not show a gain are named.

Every claim has three outcomes, never two: it holds where the interval lies on the claim's side of its bound, does
not hold where it lies on the other side, and is not decided where it reaches both (too few seeds to tell), so that
a sweep of 2 seeds a point is not read as refuting what it cannot measure.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import pandas as pd

from gcl.report.common import ReportError
from gcl.report.comparison import LEVEL, TIE_WITHIN, Difference, difference, interval_text
from gcl.report.display import Display, buffer_text, fmt_mean_std
from gcl.report.figures import SENSITIVITY
from gcl.report.plot_data import SweepPanel, SweepPoint
from gcl.report.settings import Ablation, Change, ReportSettings, Span, Sweep

# ---------------------------------------------------------------------------- a claim decided on an interval


def verdict(d: Difference, holds: bool | None, claim: str) -> str:
    """`: the paper's "<claim>" holds` (True), does not hold (False) or is not decided (None, or no interval)."""
    if not d.has_interval:
        return f': the paper\'s "{claim}" is not decided (an interval needs 2 seeds a side)'
    if holds is None:
        return f': the paper\'s "{claim}" is not decided (the interval reaches both sides of its bound)'
    return f': the paper\'s "{claim}" ' + ("holds" if holds else "does not hold")


def _not(side: bool | None) -> bool | None:
    return None if side is None else not side


def change_holds(d: Difference, change: Change) -> bool | None:
    """rises: holds where the interval lies above `by`, fails where it lies below; falls: holds where it lies below
    −`by`, fails where it lies above; None where it holds the bound (or has no interval)."""
    return d.above(change.by) if change.claim == "rises" else _not(d.above(-change.by))


def span_within(span: Span) -> float:
    """The points highest − lowest must be shown under for "barely matters" (the comparisons' tie bound unless
    `within` says otherwise)."""
    return TIE_WITHIN if span.within is None else span.within


def span_holds(d: Difference, span: Span) -> bool | None:
    """flat: holds where highest − lowest is shown smaller than span_within (its interval inside ±bound, the rule of
    a tie), fails where it is shown larger (the interval beyond the bound), None otherwise."""
    return d.inside(span_within(span))


def claim_words(claim: str, by: float = 0.0, within: float | None = None) -> str:
    """The claim as the line quotes it, e.g. 'rises by more than 2 points'."""
    if claim == "flat":
        return "barely matters" + (f" (by less than {within:g} points)" if within is not None else "")
    return claim + (f" by more than {by:g} points" if by else "")


# ---------------------------------------------------------------------------- Figure 4: the sweeps' lines


def _point(panel: SweepPanel, x: float, where: str) -> SweepPoint:
    """The sweep's point at `x`; a value no point has is an error naming `where` and the values there are."""
    found = panel.at(x)
    if found is None:
        values = ", ".join(f"{p.x:g}" for p in panel.points)
        raise ReportError(f"{where}: no point at {panel.sweep.parameter} = {x:g} (the sweep's points: {values})")
    return found


def _mean_std(p: SweepPoint) -> str:
    return fmt_mean_std(p.mean, p.std)


def span_statement(panel: SweepPanel, span: Span, where: str) -> str:
    """The lowest and highest Class-IL mean over the points between the span's ends (both points of the sweep),
    each ± its std and where, and highest − lowest with its interval (and the claim's verdict where one is
    declared)."""
    low_end, high_end = (_point(panel, x, f"{where}.span") for x in span.between)
    inside = [p for p in panel.points if low_end.x <= p.x <= high_end.x]
    lowest, highest = min(inside, key=lambda p: p.mean), max(inside, key=lambda p: p.mean)
    d = difference(highest.accs, lowest.accs)
    name = panel.sweep.shown_name
    text = (f"over {name} in [{low_end.x:g}, {high_end.x:g}] ({len(inside)} points) Class-IL ranges from "
            f"{_mean_std(lowest)} ({name} = {lowest.x:g}) to {_mean_std(highest)} ({name} = {highest.x:g}), "
            f"highest − lowest {d.estimate:+.2f} {_interval(d)}")
    return text + (verdict(d, span_holds(d, span), claim_words("flat", within=span_within(span)))
                   if span.claim else "")


def change_statement(panel: SweepPanel, change: Change, where: str) -> str:
    """Class-IL at the change's two points (mean ± std) and the difference to − from with its interval (and the
    claim's verdict where one is declared)."""
    start, end = (_point(panel, x, where) for x in change.between)
    d = difference(end.accs, start.accs)
    name = panel.sweep.shown_name
    text = (f"{name} {start.x:g} → {end.x:g}: {_mean_std(start)} → {_mean_std(end)}, {d.estimate:+.2f} "
            f"{_interval(d)}")
    return text + (verdict(d, change_holds(d, change), claim_words(change.claim, by=change.by))
                   if change.claim else "")


def _interval(d: Difference) -> str:
    return interval_text(d) if d.has_interval else "(no interval: one seed)"


def seeds_text(panel: SweepPanel) -> str:
    """How many seeds a point has, and the points with other counts (one seed: std 0, no interval)."""
    counts = Counter(len(p.seeds) for p in panel.points)
    usual = counts.most_common(1)[0][0]
    name = panel.sweep.shown_name
    odd = [f"{len(p.seeds)} at {name} = {p.x:g}" for p in panel.points if len(p.seeds) != usual]
    one = " (1 seed: std 0, no interval)" if 1 in counts else ""
    return f"{usual} seed{'s' if usual > 1 else ''} a point" + (", " + ", ".join(odd) if odd else "") + one


def sweep_line(panel: SweepPanel, index: int) -> str:
    """One line for one panel: its seeds, then its span and its changes as numbers, each with its verdict; a sweep
    with points not run yet: which, and nothing decided."""
    where = f"report.sensitivity.sweeps[{index}]"
    sweep: Sweep = panel.sweep
    if panel.pending:
        return f"{sweep.shown_name}: not drawn: {', '.join(panel.pending)} not run yet."
    parts = ([span_statement(panel, sweep.span, where)] if sweep.span else []) + [
        change_statement(panel, change, f"{where}.changes[{j}]") for j, change in enumerate(sweep.changes)]
    values = ", ".join(f"{p.x:g}" for p in panel.points)
    return f"{sweep.shown_name} ({values}; {seeds_text(panel)}): " + ("; ".join(parts) or "no statement declared") + "."


def sensitivity_section(settings: ReportSettings, panels: list[SweepPanel], display: Display, folder: str,
                        h: str) -> str:
    """The figure's section of tables.md: heading, caption (benchmark, buffer, the figure's and its data's paths,
    where the paper measured it, how a claim is decided) and a line per sweep; '' without report.sensitivity."""
    spec = settings.sensitivity
    if spec is None or not panels:
        return ""
    results = f"{folder}/results" if folder else "results"
    figure = f"`{results}/figures/{SENSITIVITY}`" if settings.figures else "not drawn (report.figures is false)"
    data = ", ".join(f"`{results}/plots/sensitivity/{p.sweep.parameter}.csv`" for p in panels)
    caption = (f"Class-IL accuracy (%) after the stream against each swept setting, the other settings at the "
               f"method's own, on {display.benchmark_label(spec.benchmark) or spec.benchmark} ({spec.benchmark}) at "
               f"buffer {spec.buffer}; mean ± std over seeds. Figure: {figure}; its data, a line per seed: {data}. "
               f"{spec.paper_note} Each difference has its {LEVEL:.0%} confidence interval (Welch); a claim of the "
               "paper holds where its interval lies on the claim's side of the claim's bound, does not hold where it "
               "lies on the other side, and is not decided where it reaches both (more seeds would tell): a rise (a "
               "fall) by more than b points holds where the interval lies above b (below −b); \"barely matters\" "
               "holds where highest − lowest is shown under its bound.")
    lines = "".join(f"- {sweep_line(panel, i)}\n" for i, panel in enumerate(panels))
    return f"{h} {spec.shown_heading}\n\n{caption}\n\n{lines}\n"


# ---------------------------------------------------------------------------- Table 3: the ablation's line


@dataclass(frozen=True)
class Pair:
    """A configuration with a component beside the same configuration without it."""

    component: str
    with_it: str
    without: str
    difference: Difference   # mean(with_it) − mean(without), Class-IL

    @property
    def helps(self) -> bool | None:
        """True: a gain on the interval (above 0); False: a loss on it (below 0); None: not decided."""
        return self.difference.above(0.0)


def component_pairs(spec: Ablation) -> list[tuple[str, str, str]]:
    """(component, configuration with it, the configuration with the same others and without it), per component
    in spec.components' order, then in the configurations' order."""
    by_parts = {frozenset(parts): method for method, parts in spec.configurations.items()}
    return [(c, method, by_parts[frozenset(parts) - {c}]) for c in spec.components
            for method, parts in spec.configurations.items() if c in parts and frozenset(parts) - {c} in by_parts]


def ablation_accs(spec: Ablation, summary: pd.DataFrame, buffer: int, where: str,
                  unrun: Collection[tuple[str, str, str]] = ()) -> dict[str, list[float]] | list[str]:
    """Each configuration's Class-IL per seed at `buffer`; where configurations have not run yet (`unrun`), their
    names instead; a configuration without a run there in params.yaml is an error."""
    on = summary[(summary.benchmark == spec.benchmark) & (summary.buffer.astype(str) == str(buffer))]
    accs = {m: on.loc[on.method == m, "class_il"].astype(float).tolist() for m in spec.configurations}
    missing = [m for m, values in accs.items() if not values]
    never = [m for m in missing if (spec.benchmark, m, str(buffer)) not in unrun]
    if never:
        raise ReportError(f"{where}: no run of {', '.join(never)} on {spec.benchmark} at buffer {buffer}; add its "
                          "run or drop it from the configurations")
    return missing or accs


def _failed(pairs: Sequence[Pair], name: Callable[[str], str], full: bool = False) -> str:
    """' (worse: A over B -3.10 [-5.00, -1.20]; not decided: C over D +1.20 [-0.50, +2.90], ...)' for the pairs that
    show a loss or neither on the interval ('over B ...' for the full method's, `full`); '' where every pair gains."""
    def pair(p: Pair) -> str:
        return (("" if full else f"{name(p.with_it)} ") + f"over {name(p.without)} {p.difference.estimate:+.2f} "
                f"{_interval(p.difference)}")

    groups = [(label, [pair(p) for p in pairs if p.helps is outcome])
              for label, outcome in (("worse", False), ("not decided", None))]
    shown = [f"{label}: {', '.join(items)}" for label, items in groups if items]
    return f" ({'; '.join(shown)})" if shown else ""


def ablation_line(spec: Ablation, summary: pd.DataFrame, name: Callable[[str], str], buffer: int, where: str,
                  unrun: Collection[tuple[str, str, str]] = ()) -> str:
    """One buffer's line: per component 'helps in k of n pairs' with the failing pairs named, then whether the
    full method beats every other configuration on the interval. `name`: a configuration's row name. Where
    configurations have not run yet (`unrun`), the line says so and decides nothing."""
    accs = ablation_accs(spec, summary, buffer, where, unrun)
    if isinstance(accs, list):
        return f"{buffer_text(buffer)}: not drawn: {', '.join(map(name, accs))} not run yet."
    pairs = [Pair(c, w, wo, difference(accs[w], accs[wo])) for c, w, wo in component_pairs(spec)]
    parts = []
    for c in spec.components:
        mine = [p for p in pairs if p.component == c]
        hurts = sum(p.helps is False for p in mine)
        parts.append(f"{c} helps in {sum(p.helps is True for p in mine)} of {len(mine)} pairs"
                     + (f", hurts in {hurts}" if hurts else "") + _failed(mine, name)
                     if mine else f"{c}: no pair of configurations differs by {c} alone")
    full = spec.full
    beside = [Pair("all", full, m, difference(accs[full], accs[m])) for m in spec.configurations if m != full]
    best = ("are best" if all(p.helps is True for p in beside) else
            "are not best" if any(p.helps is False for p in beside) else "are best is not decided")
    parts.append(f"all together ({name(full)}) {best}" + _failed(beside, name, full=True))
    return f"{buffer_text(buffer)}: " + "; ".join(parts) + "."


def ablation_table(settings: ReportSettings, index: int) -> int:
    """The index in report.tables of the table the ablation's lines go under: the first whose rows name every
    configuration; none is an error."""
    spec = settings.ablation[index]
    found = [j for j, t in enumerate(settings.tables) if t.rows is not None and set(spec.configurations) <= set(t.rows)]
    if not found:
        raise ReportError(f"report.ablation[{index}]: no table of report.tables has rows naming every configuration "
                          f"({', '.join(spec.configurations)}); its line goes under that table (the paper's Table 3)")
    return found[0]


ABLATION_TEXT = ("The paper's Table 3 claims on these runs: a component helps where the configuration with it beats "
                 f"the same configuration without it, the {LEVEL:.0%} confidence interval (Welch) of the difference "
                 "above 0, and hurts where the interval lies below 0 (counted over every such pair; an interval "
                 "holding 0 decides nothing); all together are best where the full method beats every other "
                 "configuration so, and are not best where another configuration beats it so. The pairs that show "
                 "no gain are named with their difference and interval.")


def ablation_texts(settings: ReportSettings, summary: pd.DataFrame, display: Display,
                   unrun: Collection[tuple[str, str, str]] = ()) -> dict[tuple[int, str], str]:
    """(index in report.tables, benchmark) -> the text under that table's section of that benchmark: the rule, then
    a line per buffer of each report.ablation entry there."""
    out: dict[tuple[int, str], list[str]] = {}
    for i, spec in enumerate(settings.ablation):
        j = ablation_table(settings, i)
        labels = settings.tables[j].labels

        def name(method: str, labels: dict[str, str] = labels) -> str:   # as the table names the row
            return labels.get(method) or display.label(method)

        lines = [f"- {ablation_line(spec, summary, name, b, f'report.ablation[{i}]', unrun)}\n" for b in spec.buffers]
        out.setdefault((j, spec.benchmark), []).extend(lines)
    return {key: f"{ABLATION_TEXT}\n\n" + "".join(lines) + "\n" for key, lines in out.items()}


def below_table(texts: dict[tuple[int, str], str], index: int) -> dict[str, str]:
    """benchmark -> what goes under table `index`'s section there (ablation_texts)."""
    return {b: text for (j, b), text in texts.items() if j == index}
