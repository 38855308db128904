"""The registry of raw data sources: each source module registers a reader and its settings under a name."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from gcl.core.errors import UserError
from gcl.core.settings import Settings


class SourceError(UserError, RuntimeError):
    """A raw dataset is missing, corrupt or unreadable; the message says how to fix it."""


class SourceSettings(Settings):
    """Settings every downloadable source reads."""

    download: bool = Field(True, description="download when the files are missing (False: use what is on disk)")
    download_dir: str = Field("data/downloads", min_length=1, description="where downloads and archives are kept")


@dataclass(frozen=True)
class Source:
    read: Callable[[Settings, Path], dict]     # (its validated settings, the download folder) -> tensors
    Settings: type[Settings]
    summary: str


SOURCES: dict[str, Source] = {}


def register_source(name: str, settings: type[Settings] = SourceSettings):
    """Register the decorated reader `read(settings, download_dir) -> tensors` as source `name`, whose params.yaml
    block `settings` declares (the reader gets it validated); its docstring's first line summarises it."""
    def wrap(fn):
        SOURCES[name] = Source(fn, settings, (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return wrap
