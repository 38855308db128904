"""The published numbers our runs are set beside: reference/*.csv (columns table, setting, benchmark, method,
buffer, accuracy, source; an empty buffer for a method without one).

`source` says whose number a row is, as the tables' column heads name it: PAPER ("paper") for the paper this
project reproduces (CoCa), any other publication by its own name ("DER paper", "CLS-ER paper", "ER-ACE paper").
A number is shown only under its own source's heading, so a baseline's authors' number never reads as the CoCa
paper's."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gcl.report.common import ReportError

SETTING = {"class_il": "class-il", "task_il": "task-il"}   # our metric -> the reference files' `setting`
PAPER = "paper"   # the source of the reproduced paper's (CoCa's) own numbers


@dataclass(frozen=True)
class Published:
    """One published number and whose it is (a column head: 'paper', 'DER paper', ...)."""

    value: float
    source: str


def read_paper(paper_csvs: Iterable[str | Path]) -> pd.DataFrame:
    return pd.concat([_read_reference(f) for f in paper_csvs], ignore_index=True)


def _read_reference(path: str | Path) -> pd.DataFrame:
    """One reference file; every row must name its source, or its numbers could stand under another paper's name."""
    frame = pd.read_csv(path, dtype={"buffer": "string", "source": "string"})
    if "source" not in frame or frame["source"].isna().any():
        raise ReportError(f"{Path(path).as_posix()}: every row needs a `source` column naming whose number it is "
                          f"('{PAPER}' for the CoCa paper's, else the publication, e.g. 'ER-ACE paper'); add it")
    return frame


def published(paper: pd.DataFrame, table: str, metric: str, benchmark: str, row: str,
              buffer: str) -> Published | None:
    """The published number and its source, or None. The reference file's `setting` must match the metric, so a
    Class-IL-only reference (the DER paper's) never fills a Task-IL column."""
    hit = paper[(paper.table == table) & (paper.setting == SETTING[metric]) & (paper.benchmark == benchmark)
                & (paper.method == row)]
    hit = hit[hit.buffer.isna()] if buffer == "none" else hit[hit.buffer == buffer]
    return Published(float(hit.accuracy.iloc[0]), str(hit.source.iloc[0])) if len(hit) else None


def table_source(paper: pd.DataFrame, table: str) -> str:
    """Whose numbers a reference table holds (its first row's source); PAPER for a table the files lack."""
    sources = paper.loc[paper.table == table, "source"]
    return str(sources.iloc[0]) if len(sources) else PAPER
