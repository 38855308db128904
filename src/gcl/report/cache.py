"""What the report keeps between its runs: t-SNE embeddings and drawn figures, outside results/ (which DVC empties
before the stage runs), each under a key of all it is made from (its inputs, the code that makes it, the libraries'
versions). A report after a one-setting change so recomputes only what that change touched, and a kept file holds
the very bytes a fresh computation wrote."""
from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path

from gcl.core.progress_files import PROGRESS_DIR

CACHE_DIR = PROGRESS_DIR / ".report-cache"   # ignored by git and DVC, as the runs' progress is


def key_of(code: Iterable[Path], packages: Iterable[str], inputs: object) -> str:
    """The key of what `code` (its files' bytes) makes from `inputs` (pickled) with `packages` (their versions)."""
    digest = hashlib.sha256()
    for file in code:
        digest.update(Path(file).read_bytes())
    digest.update(repr([version(p) for p in packages]).encode())
    digest.update(pickle.dumps(inputs, protocol=5))
    return digest.hexdigest()[:40]


class Kept:
    """One kind of kept file (a folder of files named by their key); `prune` removes those this report did not ask
    for, so the folder holds the latest report's files only."""

    def __init__(self, folder: Path, suffix: str):
        self.folder, self.suffix = folder, suffix
        self.asked: set[Path] = set()

    def path(self, key: str) -> Path:
        path = self.folder / f"{key}{self.suffix}"
        self.asked.add(path)
        return path

    def prune(self) -> None:
        for stale in set(self.folder.glob(f"*{self.suffix}")) - self.asked:
            stale.unlink(missing_ok=True)
