"""The registry of raw data sources: each source module registers a reader and its settings under a name, the
source's kind. A params.yaml block `sources.<key>` is read by the reader its `kind:` names, by default the reader
registered as its key: `mnist: {}` is read by `mnist`, `my-copy: {kind: image-folder, path: ...}` by `image-folder`,
so that several sources can share a reader."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from gcl.core.errors import UserError
from gcl.core.settings import Settings, derived_model


class SourceError(UserError, RuntimeError):
    """A raw dataset is missing, corrupt or unreadable; the message says how to fix it."""


class SourceSettings(Settings):
    """Settings every downloadable source reads."""

    download: bool = Field(True, description="download when the files are missing (False: use what is on disk)")
    download_dir: str = Field("data/downloads", min_length=1, description="where downloads and archives are kept")


@dataclass(frozen=True)
class Source:
    read: Callable[[Settings, Path], dict]     # (its validated settings, the download folder) -> tensors
    Settings: type[Settings]                   # the declared settings with `kind` (kind_settings)
    summary: str


SOURCES: dict[str, Source] = {}


def kind_settings(name: str, settings: type[Settings]) -> type[Settings]:
    """`settings` with the block's `kind`, which must be `name` and defaults to it: the settings of kind `name` (a
    subclass, so a reader reads them as the class it declared), their JSON naming their reader."""
    title = "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", name)) + "Source"
    kind = Field(name, description="the reader of this block (default: the block's key)")
    return derived_model(title, __name__, settings, settings.__doc__ or "", kind=(Literal[name], kind))


def register_source(name: str, settings: type[Settings] = SourceSettings):
    """Register the decorated reader `read(settings, download_dir) -> tensors` as source kind `name`, whose
    params.yaml block `settings` declares (the reader gets it validated, with `kind`: kind_settings); its
    docstring's first line summarises it."""
    def wrap(fn):
        SOURCES[name] = Source(fn, kind_settings(name, settings), (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return wrap
