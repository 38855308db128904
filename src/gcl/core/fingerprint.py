"""Digests of code and data, and the resume fingerprint: a finished seed (or a checkpoint) is reused only if
everything its result depends on is unchanged: its settings, its benchmark file and the code train stages run
(gcl.core.layout.TRAIN_CODE, the same scope as the train stages' own code digest)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gcl.core import layout

LIBRARY = Path(__file__).parents[1]   # the whole gcl package (what a warm stage process has imported: gcl.warm)


def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_digest(paths, root: str | Path = ".") -> str:
    """The names and bytes of every file of `paths` (files or folders, relative to `root`), file by file, as a
    DVC dependency on them sees them: bytecode (__pycache__, *.pyc, *.pyo) is not source and is left out."""
    root = Path(root)
    files = []
    for path in map(Path, paths):
        if not (root / path).exists():
            raise FileNotFoundError(f"{root / path}: part of the code being hashed, but missing")
        found = [root / path] if (root / path).is_file() else (root / path).rglob("*")
        files += [f for f in found if f.is_file() and f.suffix not in (".pyc", ".pyo")
                  and "__pycache__" not in f.relative_to(root).parts]
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def train_code_digest(stage_script: str | Path | None = None) -> str:
    """The digest of the code train stages run (gcl.core.layout.TRAIN_CODE): in the project whose stages/ folder
    holds `stage_script` (what check@runs writes into every run's settings and train@ checks), or, without one,
    in the project that holds this library (what the resume fingerprint hashes)."""
    root = Path(stage_script).resolve().parents[1] if stage_script is not None else layout.PROJECT
    return tree_digest(layout.TRAIN_CODE, root)


def library_digest() -> str:
    """The bytes of the whole library's code, file by file (a warm stage process serves only this code)."""
    return tree_digest(["."], LIBRARY)


def fingerprint(*parts, files: tuple[str | Path, ...] = ()) -> str:
    """Hash of the settings `parts` (JSON values), of the bytes of `files` and of the code train stages run
    (train_code_digest): an edit elsewhere, such as the report's, keeps every seed's progress."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for path in files:
        h.update(file_digest(path).encode())
    h.update(train_code_digest().encode())
    return h.hexdigest()[:16]
