"""The `report:` block of params.yaml: what the report draws and how it names things (declared once here;
gcl.config validates it with the rest of params.yaml, the report reads the validated values)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gcl.core.settings import Settings


class Visualise(Settings):
    benchmark: str = Field(description="the benchmark whose runs are drawn")
    cells: list[str] = Field(min_length=1, description="'method/buffer' of runs on that benchmark")


class Mark(Settings):
    x: float = Field(description="where on the x axis a dotted line is drawn")
    text: str = Field(min_length=1, description="its note, e.g. why the sweep has no point there")


class Sweep(Settings):
    """One panel of the sensitivity figure: Class-IL against one setting, one point per method (configuration)."""

    parameter: str = Field(min_length=1, description="the swept setting, as the methods' runs resolve it (e.g. omega)")
    methods: list[str] = Field(min_length=1, description="methods whose runs are the sweep's points (each at the "
                                                         "figure's benchmark and buffer)")
    label: str = Field("", description="the x axis's label (default: the parameter's name)")
    marks: list[Mark] = Field([], description="dotted vertical lines with a note")


class Sensitivity(Settings):
    """The sensitivity figure (the paper's Figure 4): a panel per sweep."""

    benchmark: str = Field(description="the benchmark of the sweeps")
    buffer: int = Field(gt=0, description="the buffer of the sweeps")
    title: str = Field("sensitivity", description="the figure's title, after the benchmark and buffer")
    sweeps: list[Sweep] = Field(min_length=1, description="the panels, in order")


class BenchmarkDisplay(Settings):
    """How the report names one benchmark (a key of `benchmarks:`)."""

    label: str = Field("", description="the benchmark's caption under the tables (default: its source)")


class Note(Settings):
    text: str = Field(min_length=1, description="a footnote printed under the tables where the row appears")
    benchmarks: list[str] | None = Field(None, description="the benchmarks where the note is true (default: all)")


class MethodDisplay(Settings):
    """How the report shows one named method (a key of `methods:`). Entries for methods without runs are
    ignored, so a profile may describe a method before its runs exist."""

    label: str | None = Field(None, description="the row's name (default: the method's registered label, else its key)")
    paper_row: str | None = Field(None, description="the paper's row it sits beside, '-' for none "
                                                     "(default: registered paper_row, else its algorithm)")
    paper_table: str | None = Field(None, description="reference table to read that row from, e.g. der_paper "
                                                       "(default: the table at hand)")
    notes: list[Note] = Field([], description="footnotes on this row's paper column")


class TableSpec(Settings):
    """One of the paper's tables: a row per method, per benchmark and buffer our mean ± std and the paper's number."""

    title: str = Field(min_length=1, description="heading, e.g. 'Table 1: Class-IL accuracy'")
    text: str = Field("", description="a paragraph under the heading")
    metric: Literal["class_il", "task_il"] = Field("class_il", description="which accuracy the table shows")
    paper_table: str = Field(min_length=1, description="the `table` column of reference/*.csv it is compared with")
    benchmarks: list[str] | None = Field(None, description="its benchmarks; written only when all have runs "
                                                           "(default: every benchmark whose runs report the metric)")
    rows: list[str] | None = Field(None, description="its methods in order; written on a benchmark where two have runs "
                                                     "(default: every method with runs, in report.order)")
    exclude: list[str] = Field([], description="methods left out of the default rows")
    labels: dict[str, str] = Field({}, description="row names in this table only (default: the method's label)")
    stand_in: dict[str, str] = Field({}, description="row method -> method shown in its place on a benchmark "
                                                     "where the row's method did not run")
    filled_by: str = Field("", description="the profile that fills this table where this one cannot (e.g. "
                                           "profiles/paper.yaml), named in tables.md")


class Headline(Settings):
    method: str = Field("coca", description="the method the headline compares with the best baseline")
    exclude: list[str] = Field(["joint"], description="never the best baseline (besides variants of `method`)")
    paper_table: str = Field("table1_gcl", description="reference table of the headline's Class-IL paper numbers")
    task_paper_table: str = Field("table2_task_il", description="reference table of its Task-IL paper numbers")


class Comparison(Settings):
    """A method against the best of others on one benchmark, per buffer, with a confidence interval (Welch)."""

    benchmark: str = Field(description="the benchmark compared on")
    method: str = Field("coca", description="the method compared")
    against: list[str] = Field(min_length=1, description="the others; at each buffer the best of them by mean")
    metric: Literal["class_il", "task_il"] = Field("class_il", description="the accuracy compared")
    title: str = Field("", description="the section's heading (default: says what is compared)")
    text: str = Field("", description="a paragraph under the heading (e.g. how the settings were chosen)")


MAX_LINES = 8   # lines per curve panel; more are unreadable


class Curves(Settings):
    groups: dict[str, list[str]] = Field({}, description="panel title -> methods drawn together (at most "
                                                         f"{MAX_LINES}); others fill panels of {MAX_LINES} in row order")

    @field_validator("groups")
    @classmethod
    def _small(cls, groups: dict[str, list[str]]) -> dict[str, list[str]]:
        big = {k: len(v) for k, v in groups.items() if len(v) > MAX_LINES}
        if big:
            raise ValueError(f"at most {MAX_LINES} methods per panel, got {big}")
        return groups


def _default_tables() -> list[TableSpec]:
    return [TableSpec(title="Table 1: Class-IL / general continual accuracy", metric="class_il", paper_table="table1_gcl"),
            TableSpec(title="Table 2: Task-IL accuracy", metric="task_il", paper_table="table2_task_il")]


class ReportSettings(Settings):
    figures: bool = Field(True, description="draw the PNG figures")
    visualise: Visualise | None = Field(None, description="t-SNE and confusion matrices of these runs, first seed")
    sensitivity: Sensitivity | None = Field(None, description="Figure 4: Class-IL against omega and gamma")
    benchmarks: dict[str, BenchmarkDisplay] = Field({}, description="how the report names each benchmark (its caption)")
    order: list[str] = Field([], description="row order of the tables; methods not named follow in `methods:` order")
    methods: dict[str, MethodDisplay] = Field({}, description="how the report shows each method (labels, paper rows, notes)")
    tables: list[TableSpec] = Field(default_factory=_default_tables, description="the tables, in order")
    headline: Headline = Field(default_factory=Headline, description="the top of tables.md and results/metrics.json")
    curves: Curves = Field(default_factory=Curves, description="how the accuracy curves are grouped into panels")
    comparisons: list[Comparison] = Field([], description="a method against the best of others per buffer: the "
                                                          "difference and its 95% interval (Welch), with a verdict")
    reproductions: list[str] = Field([], description="folders holding another profile's committed results (its "
                                                     "params.yaml, dvc.lock and results/), verified against that "
                                                     "dvc.lock (stage check@reproductions) and shown first in tables.md")
