"""A method against the best of a set of others, per buffer, decided with a confidence interval: the difference
of the mean accuracies over seeds, its Welch interval (unequal variances, Welch-Satterthwaite degrees of
freedom, as scipy's `ttest_ind(equal_var=False)` gives it), and a verdict in words (report.comparisons).

The one reading rule of every report (comparisons here, the paper's claims in gcl.report.claims): a reading says no
more than its interval. A win or a loss where the 95% interval excludes 0; a tie (equivalent within TIE_WITHIN
points) only where the whole interval lies inside ±TIE_WITHIN; otherwise not decided, with the interval. A point
estimate alone never decides anything. With fewer than 2 seeds on a side there is no interval: the difference is
shown alone, and the verdict says that an interval needs 2 seeds."""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from gcl.report.common import ReportError
from gcl.report.display import Display, buffer_text, fmt_mean_std, markdown
from gcl.report.settings import Comparison

LEVEL = 0.95
TIE_WITHIN = 2.0   # accuracy points: a tie only where the whole interval lies inside ±TIE_WITHIN


@dataclass(frozen=True)
class Difference:
    """mean(a) − mean(b) and its confidence interval [low, high] at LEVEL; `df`: the Welch degrees of freedom. Without
    an interval (a side with one seed) low, high and df are None, and there is no verdict."""

    estimate: float
    low: float | None = None
    high: float | None = None
    df: float | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    def above(self, bound: float = 0.0) -> bool | None:
        """True where the interval lies above `bound`, False where it lies below, None where it holds `bound` (or
        there is no interval): a claim about the difference decided three ways."""
        if not self.has_interval:
            return None
        return True if self.low > bound else False if self.high < bound else None

    def inside(self, bound: float) -> bool | None:
        """True where the whole interval lies strictly inside (−bound, +bound), False where it lies wholly outside
        (above +bound or below −bound), None where it reaches across ±bound (or there is no interval): "equivalent
        within bound points" decided three ways, the same rule for a tie and for the paper's "barely matters"."""
        if not self.has_interval:
            return None
        if -bound < self.low and self.high < bound:
            return True
        return False if self.low > bound or self.high < -bound else None

    @property
    def verdict(self) -> str:
        """The one reading rule: 'wins' / 'loses' where the interval excludes 0, 'ties' where it lies inside
        ±TIE_WITHIN, else 'not decided' (or NO_INTERVAL without one)."""
        if not self.has_interval:
            return NO_INTERVAL
        side = self.above(0.0)
        if side is not None:
            return "wins" if side else "loses"
        return "ties" if self.inside(TIE_WITHIN) else UNDECIDED


NO_INTERVAL = "no interval (needs 2 seeds a side)"
UNDECIDED = "not decided"


def interval_text(d: Difference) -> str:
    """The interval as the documents print it, '[-1.21, +5.21]'; '-' where there is none."""
    return f"[{d.low:+.2f}, {d.high:+.2f}]" if d.has_interval else "-"


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """mean(a) − mean(b), with its Welch interval where each side has 2 seeds or more (a profile of one seed, or a
    dry run, still gets the difference)."""
    if len(a) < 2 or len(b) < 2:
        return Difference(float(pd.Series(a, dtype=float).mean() - pd.Series(b, dtype=float).mean()))
    return welch_difference(a, b)


def welch_difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """The Welch t interval of mean(a) − mean(b); each side needs two seeds or more."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"an interval needs at least 2 seeds on each side (got {len(a)} and {len(b)})")
    a, b = pd.Series(a, dtype=float), pd.Series(b, dtype=float)
    estimate = float(a.mean() - b.mean())
    va, vb = a.var() / len(a), b.var() / len(b)          # each mean's squared standard error
    if va + vb == 0:                                      # both sides constant: the difference is exact
        return Difference(estimate, estimate, estimate, math.inf)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * math.sqrt(va + vb)
    return Difference(estimate, estimate - half, estimate + half, float(df))


@dataclass(frozen=True)
class ComparisonRow:
    buffer: str
    main: pd.Series        # the main method's accuracy, one value per seed
    best: str              # the other method with the highest mean at this buffer
    other: pd.Series
    difference: Difference
    left_out: tuple[str, ...] = ()   # methods of `against` whose run at this buffer has not run yet


def comparison_rows(spec: Comparison, summary: pd.DataFrame, unrun: Collection[tuple[str, str, str]] = ()
                    ) -> list[ComparisonRow]:
    """Per buffer where the main method has results on the benchmark: the best of `spec.against` there (by mean) and
    the difference. A method of `against` whose run at that buffer has not run yet (`unrun`: (benchmark, method,
    buffer) of params.yaml's runs without results) is left out of that buffer's candidates only, and the row says
    so; one with no run at that buffer in params.yaml is refused (a comparison with a method missing would read as a
    win). A buffer where no candidate has run has no row."""
    on = summary[summary.benchmark == spec.benchmark]
    rows = []
    for buffer in dict.fromkeys(on[on.method == spec.method].buffer):
        at = on[on.buffer == buffer]
        absent = [m for m in spec.against if m not in set(at.method)]
        pending = tuple(m for m in absent if (spec.benchmark, m, str(buffer)) in unrun)
        never = [m for m in absent if m not in pending]
        if never:
            raise ReportError(f"report.comparisons: {never} have no run on {spec.benchmark} at buffer {buffer}, where "
                              f"{spec.method} ran; add the runs or drop them from `against`")
        candidates = [m for m in spec.against if m not in absent]
        if not candidates:
            continue
        per_method = {m: at.loc[at.method == m, spec.metric].astype(float).reset_index(drop=True)
                      for m in [spec.method, *candidates]}
        best = max(candidates, key=lambda m: per_method[m].mean())
        rows.append(ComparisonRow(str(buffer), per_method[spec.method], best, per_method[best],
                                  difference(per_method[spec.method], per_method[best]), pending))
    return rows


def not_run_text(spec: Comparison, rows: list[ComparisonRow], unrun: Collection[tuple[str, str, str]],
                 display: Display) -> str:
    """'Not run yet, so left out: ER-ACE at B=1000; CoCa at B=200 (no row).' ('' where nothing is left out)."""
    parts = [f"{display.label(m)} at {buffer_text(r.buffer)}" for r in rows for m in r.left_out]
    shown = {r.buffer for r in rows}
    parts += [f"{display.label(method)} at {buffer_text(buffer)} (no row)" for benchmark, method, buffer in unrun
              if benchmark == spec.benchmark and method == spec.method and buffer not in shown]
    return f"Not run yet, so left out: {'; '.join(parts)}.\n" if parts else ""


def _verdicts(rows: list[ComparisonRow], main: str) -> str:
    """The outcome in words, e.g. 'CoCa wins at B=500 and B=1000 and ties at B=200.'"""
    parts = []
    for verdict in ("wins", "ties", "loses", UNDECIDED, NO_INTERVAL):
        at = [buffer_text(r.buffer) for r in rows if r.difference.verdict == verdict]
        if at:
            where = ' and '.join(at) if len(at) < 3 else ', '.join(at[:-1]) + ' and ' + at[-1]
            parts.append({NO_INTERVAL: f"is not decided at {where}: an interval needs at least 2 seeds on each side",
                          UNDECIDED: f"is not decided at {where}: the interval holds 0 and reaches beyond "
                                     f"±{TIE_WITHIN:g} points (more seeds would tell)"}.get(verdict,
                                                                                                 f"{verdict} at {where}"))
    return f"{main} " + "; ".join(parts) + "."


def comparison_section(spec: Comparison, summary: pd.DataFrame, display: Display, h: str,
                       unrun: Collection[tuple[str, str, str]] = ()) -> str:
    rows = comparison_rows(spec, summary, unrun)
    if not rows:
        return ""
    main = display.label(spec.method)
    table = pd.DataFrame([{
        "buffer": r.buffer,
        f"{main} (seeds)": f"{fmt_mean_std(r.main.mean(), r.main.std())} ({len(r.main)})",
        "best other": display.label(r.best),
        "its mean (seeds)": f"{fmt_mean_std(r.other.mean(), r.other.std())} ({len(r.other)})",
        f"{main} − best": f"{r.difference.estimate:+.2f}",
        f"{LEVEL:.0%} interval (Welch)": interval_text(r.difference),
        "verdict": r.difference.verdict,
    } for r in rows])
    metric = {"class_il": "Class-IL", "task_il": "Task-IL"}[spec.metric]
    ran = [m for m in spec.against if any(m not in r.left_out for r in rows)]   # never name a method that did not run
    others = ", ".join(display.label(m) for m in ran)
    title = spec.title if spec.title and ran == list(spec.against) else f"{main} against the best of {others}"
    out = [f"{h} {title} ({spec.benchmark}, {metric})\n"]
    if spec.text and ran == list(spec.against):
        out.append(spec.text + "\n")
    out.append(f"Per buffer, {main}'s mean minus that of the best of {others} there (by mean), with the "
               f"{LEVEL:.0%} confidence interval of the difference (Welch: unequal variances); a win or a loss where "
               f"the interval excludes 0; a tie where the whole interval lies inside ±{TIE_WITHIN:g} points; else "
               "not decided (the interval holds 0 and reaches beyond that bound).\n")
    left_out = not_run_text(spec, rows, unrun, display)
    if left_out:
        out.append(left_out)
    out.append(markdown(table) + "\n")
    out.append(_verdicts(rows, main) + "\n\n")
    return "\n".join(out)
