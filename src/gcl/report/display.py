"""How the report shows things: a method's label, paper row, notes and row order (the `report:` block; a method
it does not name shows its key and sits beside its algorithm's paper row), a benchmark's caption, and how every
number prints: accuracies with two decimals, ours as mean ± std with ≈ where the paper's number lies within one
seed-std, differences signed, counts (steps, a buffer's size, experts) as whole numbers."""
from __future__ import annotations

import pandas as pd

from gcl.report.summary import ResolvedReport

WITHIN_STD = "≈"   # marks our mean ± std when the published number lies within one seed-std of our mean
WITHIN_STD_TEXT = f"{WITHIN_STD} marks our mean where the published number beside it lies within one seed-std of it"


class Display:
    """Labels, paper rows, notes and row order, from the report settings."""

    def __init__(self, resolved: ResolvedReport):
        self.settings = resolved.settings
        self.registered = resolved.methods
        self.algorithm = {r["method"]: r.get("algorithm", r["method"]) for r in resolved.runs.values()}
        named = list(self.registered) + [r["method"] for r in resolved.runs.values()]
        self.order = list(dict.fromkeys(list(self.settings.order) + named))

    def label(self, method: str) -> str:
        spec = self.settings.methods.get(method)
        return (spec and spec.label) or method

    def algorithm_of(self, method: str) -> str:
        registered = self.registered.get(method)
        return (registered and registered.algorithm) or self.algorithm.get(method, method)

    def paper_row(self, method: str) -> tuple[str | None, str]:
        """(reference table or None for the table at hand, row name in the reference files): the report block's
        `paper_table` and `paper_row`, the row by default its algorithm's name (a row the file lacks: no number)."""
        spec = self.settings.methods.get(method)
        table = spec.paper_table if spec else None
        row = (spec and spec.paper_row) or self.algorithm_of(method)
        return table, row

    def notes(self, method: str, benchmark: str) -> list[str]:
        spec = self.settings.methods.get(method)
        return [n.text for n in (spec.notes if spec else []) if n.benchmarks is None or benchmark in n.benchmarks]

    def sort(self, methods) -> list[str]:
        methods = set(methods)
        known = [m for m in self.order if m in methods]
        return known + sorted(methods - set(known))

    def benchmark_label(self, benchmark: str) -> str:
        """The benchmark's caption (report.benchmarks.<name>.label), '' where the profile gives none."""
        shown = self.settings.benchmarks.get(benchmark)
        return shown.label if shown else ""


def buffer_text(buffer) -> str:
    return "no buffer" if str(buffer) == "none" else f"B={buffer}"


def missing(x) -> bool:
    return x is None or bool(pd.isna(x))


def fmt_number(x) -> str:
    return "-" if missing(x) else f"{x:.2f}"


def fmt_mean_std(mean, std) -> str:
    if missing(mean):
        return "-"
    return f"{mean:.2f} ± {0.0 if missing(std) else std:.2f}"


def within_std(mean, std, paper: float | None) -> bool:
    """The paper's number lies within one seed-std of our mean (never with one seed: std 0)."""
    return not missing(mean) and paper is not None and not missing(std) and std > 0 and abs(mean - paper) <= std


def fmt_ours(mean, std, paper: float | None) -> str:
    """Our mean ± std, marked ≈ where the paper's number lies within one seed-std of the mean."""
    return fmt_mean_std(mean, std) + (f" {WITHIN_STD}" if within_std(mean, std, paper) else "")


def fmt_difference(ours, paper: float | None) -> str:
    """ours − paper, signed ('+1.65', '-3.33'); '-' where either is missing."""
    return "-" if missing(ours) or missing(paper) else f"{ours - paper:+.2f}"


def fmt_count(low, high=None) -> str:
    """A count as a whole number ('13,516'), or its range over seeds where they differ ('13,510–13,516')."""
    if missing(low):
        return "-"
    high = low if missing(high) else high
    low, high = int(round(float(low))), int(round(float(high)))
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def markdown(frame: pd.DataFrame) -> str:
    """A markdown table whose cells print exactly as formatted (tabulate would turn '66.90' back into 66.9)."""
    return frame.to_markdown(index=False, disable_numparse=True)
