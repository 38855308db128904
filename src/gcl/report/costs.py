"""What each run cost and its method's own numbers, beside the accuracies: forgetting, SGD steps, train time and
throughput per run, and the numeric method_metrics (e.g. CN-DPM's experts, iCaRL's exemplars)."""
from __future__ import annotations

import pandas as pd

from gcl.report.common import buffer_key
from gcl.report.display import Display, fmt_count, fmt_number, markdown
from gcl.report.summary import is_count, method_metric_columns

RUN = ["benchmark", "method", "buffer"]

COST_COLUMNS = {  # the cost table's columns (besides benchmark, method, buffer) and what each holds
    "seeds": "the seeds the run trained; every other column is over them",
    "forgetting": "mean over evaluation groups (tasks; digits on MNIST-360) of the best earlier accuracy minus the "
                  "final one, in points, mean over seeds; '-' for an offline method (JOINT), which is evaluated once",
    "steps": "SGD steps of the stream per seed (the run's batch decides them: compare rows at equal steps)",
    "train seconds": "wall time of the training steps per seed, evaluations excluded, mean over seeds (it grows on a "
                     "busy machine)",
    "samples/s": "stream samples per train second, mean over seeds",
    "device": "where the run trained (cpu or cuda)",
}
METHOD_METRICS = {  # the numbers methods report of their own (`method_metrics` in a run's metrics.json)
    "experts": "CN-DPM: the experts it created over the stream",
    "exemplars": "iCaRL: the exemplars in its memory at the end of the stream",
    "memory": "FDR: the samples in its episodic memory at the end of the stream",
    "anchors": "HAL: the anchors it holds at the end of the stream (one per class seen)",
    "star_steps": ("STAR (ER-STAR, DER++-STAR): the steps whose gradient took STAR's term (those with at least "
                   "`min_correct` correctly classified buffer samples)"),
}
COUNT_TEXT = ("A count (steps, a method's own counts) prints as its value, or as its range over seeds where they "
              "differ; any other number of a method's own as its mean over seeds.")


def cost_legend() -> list[str]:
    """costs.md's legend: every column of the cost table, and how counts print."""
    return [f"**{column}**: {text}." for column, text in COST_COLUMNS.items()] + [COUNT_TEXT]


def method_metric_legend(summary: pd.DataFrame, display: Display) -> list[str]:
    """What each column of the method-specific table holds; one no method documents here is named by the methods
    that report it."""
    out = []
    for column in method_metric_columns(summary):
        name = _metric_name(column)
        reporting = display.sort(summary.loc[summary[column].notna(), "method"])
        text = METHOD_METRICS.get(name) or (f"{', '.join(map(display.label, reporting))}: a number of its own "
                                            "(`method_metrics` in its runs' metrics.json)")
        out.append(f"**{name}**: {text}.")
    return out


def _metric_name(column: str) -> str:
    return column.split(".", 1)[1]


def _in_order(agg: pd.DataFrame, display: Display) -> pd.DataFrame:
    """Rows by benchmark, then in the tables' method order, then by buffer (none, 200, 500, ...)."""
    order = {m: i for i, m in enumerate(display.sort(agg.method))}
    return agg.sort_values(RUN, key=lambda col: col.map(order) if col.name == "method" else
                           col.map(buffer_key) if col.name == "buffer" else col)


def cost_table(summary: pd.DataFrame, display: Display) -> str:
    agg = summary.groupby(RUN).agg(
        seeds=("seed", "count"), forgetting=("forgetting", "mean"), steps_low=("steps", "min"),
        steps_high=("steps", "max"), train_seconds=("train_seconds", "mean"),
        samples_per_second=("samples_per_second", "mean"), device=("device", "first")).reset_index()
    agg = _in_order(agg, display)
    shown = pd.DataFrame({
        "benchmark": agg.benchmark, "method": agg.method.map(display.label), "buffer": agg.buffer,
        "seeds": agg.seeds.map(fmt_count), "forgetting": agg.forgetting.map(fmt_number),
        "steps": [fmt_count(lo, hi) for lo, hi in zip(agg.steps_low, agg.steps_high)],
        "train seconds": agg.train_seconds.map(fmt_number), "samples/s": agg.samples_per_second.map(fmt_number),
        "device": agg.device})
    return markdown(shown)


def method_metrics_table(summary: pd.DataFrame, display: Display) -> str | None:
    """Each method's own numeric metrics per run: a count as its value (or range over seeds), another number as
    its mean over seeds; None where no method reports one."""
    cols = method_metric_columns(summary)
    if not cols:
        return None
    frame = summary.dropna(subset=cols, how="all")
    grouped = frame.groupby(RUN)[cols]
    low, high, mean = grouped.min(), grouped.max(), grouped.mean()
    agg = _in_order(mean.reset_index()[RUN], display)
    shown = pd.DataFrame({"benchmark": agg.benchmark, "method": agg.method.map(display.label), "buffer": agg.buffer})
    keys = list(agg.itertuples(index=False, name=None))
    for c in cols:
        if is_count(summary[c]):
            shown[_metric_name(c)] = [fmt_count(low.at[k, c], high.at[k, c]) for k in keys]
        else:
            shown[_metric_name(c)] = [fmt_number(mean.at[k, c]) for k in keys]
    return markdown(shown)
