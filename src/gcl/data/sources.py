"""Raw data sources: fetch (or read a bundled copy), verify, and save as uint8 tensors.

Every source writes one file, `<out_dir>/data.pt`, holding
    train_x, test_x: uint8 tensors shaped (N, C, H, W)
    train_y, test_y: int64 labels
    classes: the class names, in label order
so that benchmark builders never care where the pixels came from.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gcl.core.atomic import save_tensors
from gcl.core.settings import Settings, validate

# the source modules register their sources on import
from gcl.data import cifar_sources, folder_sources, mnist_sources, random_sources, tinyimagenet_sources  # noqa: F401
from gcl.data.source_registry import SOURCES, SourceError, SourceSettings, register_source  # noqa: F401  (the API)


def source_settings(name: str, settings: Settings | dict | None) -> Settings:
    """The settings of source kind `name`, typed: validated from a params.yaml block of that kind (a mapping, or
    None for an empty one), or as they are when already validated."""
    if name not in SOURCES:
        raise SourceError(f"unknown data source {name!r}; known sources: {sorted(SOURCES)}")
    if isinstance(settings, SOURCES[name].Settings):
        return settings
    return validate(SOURCES[name].Settings, settings, f"sources.{name}")


def read_source(name: str, settings: Settings | dict | None, download_dir: str | Path | None = None) -> dict:
    """The tensors of source kind `name`. `settings`: its block (source_settings); `download_dir` replaces its own where given
    (a source without downloads ignores it)."""
    settings = source_settings(name, settings)
    if download_dir is None:
        download_dir = settings.download_dir if isinstance(settings, SourceSettings) else SourceSettings().download_dir
    data = SOURCES[name].read(settings, Path(download_dir))
    _check_source_tensors(name, data)
    return data


def prepare_source(name: str, settings: Settings | dict | None, out_dir: str | Path) -> Path:
    """Build source kind `name` with `settings` (as read_source takes them) and write `<out_dir>/data.pt`
    atomically."""
    data = read_source(name, settings)
    out = Path(out_dir) / "data.pt"
    save_tensors(out, data)
    return out


def load_source(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise SourceError(f"{path} does not exist: run `dvc repro` to prepare the data source first")
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise SourceError(f"{path} is corrupt or not a prepared source ({exc}); delete it and run "
                          "`dvc repro` again") from exc


def _check_source_tensors(name: str, data: dict) -> None:
    for split in ("train", "test"):
        x, y = data[f"{split}_x"], data[f"{split}_y"]
        if x.dtype != torch.uint8 or x.ndim != 4:
            raise SourceError(f"source {name}: {split}_x must be uint8 (N, C, H, W), got {x.dtype} {tuple(x.shape)}")
        if y.shape != (x.shape[0],):
            raise SourceError(f"source {name}: {split}_y has {y.shape[0]} labels for {x.shape[0]} images")
