"""The report's two documents, as a paper's results section and its appendix:

- tables.md: the warnings, then every accuracy table: the committed reproductions' first (report.reproductions),
  then this profile's; each profile's headline, data, the paper's tables (Table 3 with its claims line,
  report.ablation), the comparisons and the sensitivity figure's section (report.sensitivity).
- costs.md: per profile, in the same order, what each run cost (forgetting, steps, time) and the methods' own
  metrics.
"""
from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from gcl.report.claims import ablation_texts, below_table, sensitivity_section
from gcl.report.common import ReportError
from gcl.report.comparison import comparison_section
from gcl.report.costs import cost_legend, cost_table, method_metric_legend, method_metrics_table
from gcl.report.display import WITHIN_STD_TEXT, Display, fmt_count
from gcl.report.paper import PAPER, table_source
from gcl.report.plot_data import SweepPanel, sweep_panels
from gcl.report.reproductions import read_verified
from gcl.report.summary import (
    ResolvedReport,
    environment_line,
    environments,
    mixes_environments,
    stacked_seeds,
    unrun,
)
from gcl.report.tables import HeadlineRow, headline, headline_table, table_section, unfilled_line

TABLES, COSTS = "tables.md", "costs.md"


@dataclass(frozen=True, eq=False)
class ProfileResults:
    """One profile's results as the documents show them: this one's (params.yaml) or a committed reproduction's."""

    resolved: ResolvedReport
    summary: pd.DataFrame           # gcl.report.summary.COLUMNS
    head: list[HeadlineRow]
    folder: str = ""                # a reproduction's folder; '' for this profile

    @cached_property
    def display(self) -> Display:
        return Display(self.resolved)

    @cached_property
    def sweeps(self) -> list[SweepPanel]:
        """The sensitivity figure's panels (report.sensitivity), from this profile's summary; [] without one."""
        try:
            return sweep_panels(self.resolved, self.summary)
        except ReportError as exc:
            raise ReportError(f"{self.folder}: {exc}" if self.folder else str(exc)) from None

    @cached_property
    def unrun(self) -> dict[tuple[str, str, str], str]:
        """The runs params.yaml lists without results here (a report of part of a grid): cell -> run key."""
        return unrun(self.resolved, self.summary)

    @property
    def title(self) -> str:
        """Its benchmarks' captions (their keys where a profile gives none)."""
        return "; ".join(self.display.benchmark_label(b) or b for b in self.resolved.benchmarks)

    @property
    def benchmarks(self) -> list[str]:
        """The benchmarks with runs, in params.yaml's order."""
        return [b for b in self.resolved.benchmarks if b in set(self.summary.benchmark)]


def profile_results(resolved: ResolvedReport, summary: pd.DataFrame, paper: pd.DataFrame,
                    folder: str = "") -> ProfileResults:
    return ProfileResults(resolved, summary, headline(summary, paper, Display(resolved)), folder)


def read_reproduction(folder: str | Path, paper: pd.DataFrame) -> ProfileResults:
    """One folder of `report.reproductions`, as check@reproductions verified it against its own dvc.lock
    (gcl.report.reproductions: every seed of every run its params.yaml lists, once, nothing edited)."""
    resolved, summary = read_verified(folder)
    return profile_results(ResolvedReport.from_json(resolved), summary, paper, Path(folder).as_posix())


def seeds_line(profile: ProfileResults) -> str:
    """The profile's seeds, and the runs that train other seeds (a run's own `seeds`), by method in params.yaml's
    order: a reader must not take a 10-seed cell for a 3-seed one."""
    default = tuple(profile.resolved.seeds)
    several = len(profile.benchmarks) > 1
    runs = [(benchmark, method, buffer, tuple(sorted(int(s) for s in group.seed))) for (benchmark, method, buffer), group
            in profile.summary.groupby(["benchmark", "method", "buffer"], sort=False)]
    by_seeds: dict[tuple[int, ...], dict[str, list[str]]] = {}
    for benchmark, method, buffer, seeds in runs:
        if seeds != default:
            cell = f"{benchmark} B={buffer}" if several else f"B={buffer}"
            by_seeds.setdefault(seeds, {}).setdefault(method, []).append(cell)
    runs_of = Counter(method for _, method, _, _ in runs)
    parts = []
    for seeds, methods in by_seeds.items():
        names = [profile.display.label(method) + ("" if len(cells) == runs_of[method] else " at " + ", ".join(cells))
                 for method, cells in methods.items()]
        span = (f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 2 and seeds == tuple(range(seeds[0], seeds[-1] + 1))
                else ", ".join(map(str, seeds)))
        parts.append(f"{len(seeds)} seeds ({span}) for {', '.join(names)}")
    return f"Seeds {list(default)}" + ("" if not parts else " except " + "; ".join(parts)) + "."


def data_lines(profile: ProfileResults, unfilled: list[str], h: str) -> str:
    """Where each benchmark's numbers come from (caption, source, stream length), the environments, and the tables
    this profile cannot fill (`unfilled`: a line each)."""
    out = [f"{h} Data\n"]
    summary, display = profile.summary, profile.display
    for b in profile.benchmarks:
        source = profile.resolved.benchmarks[b].source
        samples = summary.loc[summary.benchmark == b, "samples"].dropna() if "samples" in summary else pd.Series([])
        stream = "" if samples.empty else f", {fmt_count(samples.min(), samples.max())} stream samples per seed"
        out.append(f"- **{b}**: {display.benchmark_label(b) or source} (source `{source}`{stream})")
    out.append("\n" + computed_on(summary))
    if unfilled:
        out.append("\nTables this profile cannot fill:\n\n" + "\n".join(f"- {line}" for line in unfilled))
    return "\n".join(out) + "\n\n"


def computed_on(summary: pd.DataFrame) -> str:
    """Where the numbers were computed: one plain line where the seeds differ at most in stacking, a warning where
    they differ in what moves numbers more (another CPU or GPU, torch build, threads, precision, compilation)."""
    if mixes_environments(summary):
        return ("Computed on: " + "; ".join(environments(summary)) + ". **These results mix environments**: another "
                "CPU or GPU, torch build, thread count, precision or a compiled backbone moves a run's numbers within "
                "seed noise, so compare cells from one environment (summary.csv has each seed's).")
    return f"Computed on: {environment_line(summary)}." + (
        " Stacked seeds train as one network, whose float32 sums round in another order than a lone seed's: the same "
        "numbers in distribution." if stacked_seeds(summary) else "")


def not_run_line(profile: ProfileResults) -> str:
    """A report of part of a grid says so before any table: how many runs have results, which have not run yet."""
    listed = len(profile.resolved.runs)
    keys = list(profile.unrun.values())
    return (f"**Part of the grid.** {listed - len(keys)} of the {listed} runs params.yaml lists have results; not run "
            f"yet: {', '.join(keys)}. Every table, comparison, claim and figure below draws what has run: a method "
            "that has not run is absent from it, and a claim that needs it says so.")


def accuracy_sections(profile: ProfileResults, paper: pd.DataFrame, h: str) -> str:
    """One profile's accuracies: headline, data, the paper's tables. `h` is their heading level."""
    resolved, display, settings = profile.resolved, profile.display, profile.resolved.settings
    out = io.StringIO()
    if profile.head:
        main = display.label(settings.headline.method)
        out.write(f"{h} Headline: {main} against the best baseline (Class-IL)\n\n"
                  f"Best baseline: the method with the highest mean Class-IL at that buffer (or without a buffer), {main}'s own "
                  f"variants and {', '.join(map(display.label, settings.headline.exclude)) or 'none'} left out. "
                  "Ours − paper: our mean minus the paper's number; a column named after another paper holds that "
                  "paper's own number (its authors' data and protocol) and ours minus it.\n\n")
        out.write(headline_table(profile.head, table_source(paper, settings.headline.paper_table)) + "\n\n")
    if profile.unrun:
        out.write(not_run_line(profile) + "\n\n")
    claims = ablation_texts(settings, profile.summary, display, profile.unrun)
    tables = [(spec, table_section(spec, resolved, profile.summary, paper, display, h, below_table(claims, j)))
              for j, spec in enumerate(settings.tables)]
    out.write(data_lines(profile, [unfilled_line(spec, resolved, profile.summary) for spec, text in tables if not text], h))
    out.write("".join(text for _, text in tables))
    for spec in settings.comparisons:
        out.write(comparison_section(spec, profile.summary, display, h, profile.unrun))
    out.write(sensitivity_section(settings, profile.sweeps, display, profile.folder, h))
    return out.getvalue()


def cost_sections(profile: ProfileResults, h: str) -> str:
    """One profile's costs per run, then its methods' own metrics."""
    out = f"{h} Forgetting and cost per run\n\n" + cost_table(profile.summary, profile.display) + "\n\n"
    extra = method_metrics_table(profile.summary, profile.display)
    if extra:
        legend = "".join(f"- {line}\n" for line in method_metric_legend(profile.summary, profile.display))
        out += f"{h} Method-specific metrics\n\n{legend}\n{extra}\n\n"
    return out


def _profiles(this: ProfileResults, reproductions: list[ProfileResults]) -> list[tuple[str, str, ProfileResults]]:
    """(section heading or '', heading level inside it, profile): the reproductions first, then this profile."""
    if not reproductions:
        return [("", "##", this)]
    return [*((f"## Reproduction: {rep.title}", "###", rep) for rep in reproductions),
            ("## This profile (params.yaml)", "###", this)]


def render_tables(this: ProfileResults, paper: pd.DataFrame, warnings: list[str],
                  reproductions: list[ProfileResults] = ()) -> str:
    """tables.md: the warnings, then every profile's accuracy tables; costs are in costs.md."""
    out = io.StringIO()
    out.write("# Results: our numbers beside the paper's\n\n")
    out.write(f"Mean ± std over seeds; accuracies in %. A column headed *{PAPER}* holds the CoCa paper's number; one "
              "headed with another paper's name (*DER paper*, *CLS-ER paper*, ...) holds that paper's own number, on "
              f"its authors' data and protocol (`reference/*.csv` say whose each number is). {WITHIN_STD_TEXT}. "
              "Generated by `dvc repro` (stage "
              "`report`) from the runs params.yaml lists" + (" and the committed results of the profiles in "
                                                             "`report.reproductions`" if reproductions else "") +
              f"; do not edit by hand. What each run cost (forgetting, steps, time) and the methods' own metrics: "
              f"[{COSTS}]({COSTS}).\n\n")
    if warnings:
        out.write("## Warnings\n\n" + "".join(f"- {w}\n" for w in warnings) + "\n")
    for heading, h, profile in _profiles(this, list(reproductions)):
        if heading:
            out.write(heading + "\n\n")
        if profile.folder:
            out.write(f"{seeds_line(profile)} The results of another profile, run with `dvc repro` in a "
                      f"workspace of its own and committed in `{profile.folder}` (its params.yaml, dvc.lock and "
                      "results/); docs/running.md says how to regenerate them.\n\n")
        else:
            out.write(f"{seeds_line(profile)}\n\n")
        out.write(accuracy_sections(profile, paper, h))
    return out.getvalue().rstrip("\n") + "\n"


def render_costs(this: ProfileResults, reproductions: list[ProfileResults] = ()) -> str:
    """costs.md: per profile, in tables.md's order, the cost of each run and the methods' own metrics."""
    out = io.StringIO()
    out.write("# Costs: forgetting, steps, time and the methods' own metrics\n\n")
    out.write(f"Per run: the runs whose accuracies [{TABLES}]({TABLES}) shows, in its order. Generated by `dvc repro` "
              "(stage `report`); do not edit by hand. Besides benchmark, method and buffer, the columns hold:\n\n"
              + "".join(f"- {line}\n" for line in cost_legend()) + "\n")
    for heading, h, profile in _profiles(this, list(reproductions)):
        if heading:
            out.write(heading + "\n\n" + (f"Committed in `{profile.folder}`.\n\n" if profile.folder else ""))
        out.write(cost_sections(profile, h))
    return out.getvalue().rstrip("\n") + "\n"
