"""The published numbers our runs are set beside: reference/*.csv (columns table, setting, benchmark, method,
buffer, accuracy; an empty buffer for a method without one)."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

SETTING = {"class_il": "class-il", "task_il": "task-il"}   # our metric -> the reference files' `setting`


def read_paper(paper_csvs: Iterable[str | Path]) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f, dtype={"buffer": "string"}) for f in paper_csvs], ignore_index=True)


def paper_value(paper: pd.DataFrame, table: str, metric: str, benchmark: str, row: str, buffer: str) -> float | None:
    """The paper's number, or None. The reference file's `setting` must match the metric, so a Class-IL-only
    reference (the DER paper's) never fills a Task-IL column."""
    hit = paper[(paper.table == table) & (paper.setting == SETTING[metric]) & (paper.benchmark == benchmark)
                & (paper.method == row)]
    hit = hit[hit.buffer.isna()] if buffer == "none" else hit[hit.buffer == buffer]
    return float(hit.accuracy.iloc[0]) if len(hit) else None
