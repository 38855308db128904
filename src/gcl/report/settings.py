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


def _pair_of(value, what: str) -> tuple[float, float]:
    """Two distinct values of a swept setting (a span's ends, a change's from and to)."""
    if len(value) != 2 or value[0] == value[1]:
        raise ValueError(f"{what} takes two distinct values of the swept setting, got {list(value)}")
    return value


def _between_shorthand(value):
    """`[a, b]` stands for `{between: [a, b]}` (the numbers, no claim)."""
    return {"between": value} if isinstance(value, list) else value


class Span(Settings):
    """The range of Class-IL means over the points of a sweep between two values (the paper's "ω barely matters in
    (0.1, 0.9)"): the lowest and the highest mean, each ± its std, and highest − lowest with its Welch interval."""

    between: list[float] = Field(description="the span's two ends, lowest first; both included")
    claim: Literal["", "flat"] = Field("", description="flat: the paper says the setting barely matters there; it holds "
                                                       "where highest − lowest is shown within `within` points (its "
                                                       "whole interval inside ±within, a tie's rule), fails where it "
                                                       "is shown beyond, and is not decided otherwise")
    within: float | None = Field(None, gt=0, description="the points 'barely' allows (default: 2, the comparisons' tie "
                                                         "bound)")

    @field_validator("between")
    @classmethod
    def _ends(cls, between: list[float]) -> list[float]:
        _pair_of(between, "between")
        if between[0] > between[1]:
            raise ValueError(f"a span's ends go lowest first, got {between}")
        return between


class Change(Settings):
    """Class-IL from one point of a sweep to another (the paper's "γ 0.1 beats 0 by more than 2 points"): both
    means ± std and the difference (to − from) with its Welch interval."""

    between: list[float] = Field(description="[from, to]: two values of the swept setting, each a point of the sweep")
    claim: Literal["", "rises", "falls"] = Field("", description="what the paper says the change does: rises holds where "
                                                                 "the interval lies above `by` and fails where it lies "
                                                                 "below, falls holds below −`by` and fails above; "
                                                                 "not decided where it holds the bound ('': the "
                                                                 "numbers only)")
    by: float = Field(0.0, ge=0, description="the least rise or fall (points) the claim states, e.g. 2")

    @field_validator("between")
    @classmethod
    def _ends(cls, between: list[float]) -> list[float]:
        return _pair_of(between, "between")


class Sweep(Settings):
    """One panel of the sensitivity figure: Class-IL against one setting, one point per method (configuration); the
    statements its line in tables.md makes (`span`, `changes`)."""

    parameter: str = Field(min_length=1, description="the swept setting, as the methods' runs resolve it (e.g. omega)")
    methods: list[str] = Field(min_length=1, description="methods whose runs are the sweep's points (each at the "
                                                         "figure's benchmark and buffer)")
    label: str = Field("", description="the x axis's label (default: the parameter's name)")
    name: str = Field("", description="the setting's name in tables.md's lines, e.g. ω (default: the parameter's name)")
    marks: list[Mark] = Field([], description="dotted vertical lines with a note")
    span: Span | None = Field(None, description="the range of Class-IL means between two values ([low, high] or "
                                                "{between, claim, within})")
    changes: list[Change] = Field([], description="changes from one point to another ([from, to] or "
                                                  "{between, claim, by}), in the line's order")

    @field_validator("span", mode="before")
    @classmethod
    def _span_shorthand(cls, value):
        return _between_shorthand(value)

    @field_validator("changes", mode="before")
    @classmethod
    def _changes_shorthand(cls, value):
        return [_between_shorthand(v) for v in value] if isinstance(value, list) else value

    @property
    def shown_name(self) -> str:
        return self.name or self.parameter


PAPER_NOTE = "The paper's Figure 4 is on Seq-CIFAR-100 at buffer 500."


class Sensitivity(Settings):
    """The sensitivity figure (the paper's Figure 4): a panel per sweep, and its section in tables.md (a caption, a
    line per sweep stating its `span` and `changes` as numbers)."""

    benchmark: str = Field(description="the benchmark of the sweeps")
    buffer: int = Field(gt=0, description="the buffer of the sweeps")
    title: str = Field("sensitivity", description="the figure's title, after the benchmark and buffer")
    heading: str = Field("", description="the tables.md section's heading (default: 'Figure 4: ' + title + ' to ' "
                                         "+ the sweeps' names)")
    paper_note: str = Field(PAPER_NOTE, description="where the paper's figure was measured, in the caption and the figure")
    sweeps: list[Sweep] = Field(min_length=1, description="the panels, in order")

    @field_validator("sweeps")
    @classmethod
    def _one_panel_a_setting(cls, sweeps: list[Sweep]) -> list[Sweep]:
        twice = sorted({s.parameter for s in sweeps if [t.parameter for t in sweeps].count(s.parameter) > 1})
        if twice:
            raise ValueError(f"{twice} swept twice: one sweep a setting (its data is plots/sensitivity/<parameter>.csv)")
        return sweeps

    @property
    def shown_heading(self) -> str:
        return self.heading or f"Figure 4: {self.title} to " + " and ".join(s.shown_name for s in self.sweeps)


class BenchmarkDisplay(Settings):
    """How the report names one benchmark (a key of `benchmarks:`)."""

    label: str = Field("", description="the benchmark's caption under the tables (default: its source)")


class Note(Settings):
    text: str = Field(min_length=1, description="a footnote printed under the tables where the row appears")
    benchmarks: list[str] | None = Field(None, description="the benchmarks where the note is true (default: all)")


class MethodDisplay(Settings):
    """How the report shows one named method (a key of `methods:`). Entries for methods without runs are
    ignored, so a profile may describe a method before its runs exist."""

    label: str | None = Field(None, description="the row's name (default: the method's key)")
    paper_row: str | None = Field(None, description="the paper's row it sits beside, '-' for none "
                                                     "(default: its algorithm's name)")
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
    rows: list[str] | None = Field(None, description="its methods in order; written on a benchmark where `min_rows` "
                                                     "have runs (default: every method with runs, in report.order)")
    min_rows: int = Field(2, ge=2, description="named rows with runs on a benchmark for its section there (e.g. 3 for an "
                                               "ablation, whose reference row and full method alone compare nothing)")
    exclude: list[str] = Field([], description="methods left out of the default rows")
    buffers: list[int | Literal["none"]] | None = Field(None, description="its buffers (columns), e.g. [1000] for an "
                                                          "ablation run at one memory (default: every buffer its "
                                                          "rows ran)")
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


class Ablation(Settings):
    """The paper's Table 3 claims tested on one benchmark: each component helps (the configuration with it beats the
    same configuration without it, its Welch interval above 0), and all of them together are best. A line per buffer
    under the first of report.tables whose rows name every configuration."""

    benchmark: str = Field(description="the benchmark of the configurations' runs")
    buffers: list[int] = Field(min_length=1, description="the buffers tested, a line each; every configuration needs "
                                                         "a run at each")
    configurations: dict[str, list[str]] = Field(min_length=2, description="method -> the components it has (e.g. "
                                                                           "coca-ckd-pt: [CKD, PT]; [] for none); "
                                                                           "one has all (the full method)")

    @field_validator("configurations")
    @classmethod
    def _one_full(cls, configurations: dict[str, list[str]]) -> dict[str, list[str]]:
        sets = {method: frozenset(parts) for method, parts in configurations.items()}
        repeated = [m for m, parts in configurations.items() if len(set(parts)) != len(parts) or "" in parts]
        if repeated:
            raise ValueError(f"{repeated}: each component once, named")
        same = [m for m in sets if list(sets.values()).count(sets[m]) > 1]
        if same:
            raise ValueError(f"{same} have the same components; each configuration needs its own")
        every = frozenset().union(*sets.values())
        if not every:
            raise ValueError("no configuration has a component")
        if every not in sets.values():
            raise ValueError(f"no configuration has every component ({', '.join(sorted(every))}): the full method "
                             "is the one with all of them")
        return configurations

    @property
    def components(self) -> list[str]:
        """Every component, in the order the configurations first name them."""
        return list(dict.fromkeys(c for parts in self.configurations.values() for c in parts))

    @property
    def full(self) -> str:
        """The configuration with every component."""
        return next(m for m, parts in self.configurations.items() if set(parts) == set(self.components))


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
    ablation: list[Ablation] = Field([], description="Table 3's claims (each component helps, all together are best) "
                                                     "tested with Welch intervals: a line under the table, per buffer")
    reproductions: list[str] = Field([], description="folders holding another profile's committed results (its "
                                                     "params.yaml, dvc.lock and results/), verified against that "
                                                     "dvc.lock (stage check@reproductions) and shown first in tables.md")
