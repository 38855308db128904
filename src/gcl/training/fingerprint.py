"""The resume fingerprint: a finished seed is reused only if everything its result depends on is unchanged."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

LIBRARY = Path(__file__).parents[1]   # the whole gcl package


def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def library_digest() -> str:
    """The bytes of the library's code, file by file."""
    h = hashlib.sha256()
    for path in sorted(LIBRARY.rglob("*.py")):
        h.update(str(path.relative_to(LIBRARY)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def fingerprint(*parts, files: tuple[str | Path, ...] = ()) -> str:
    """Hash of the settings `parts`, of the bytes of `files` (the benchmark the run trains on) and of the
    library's source code."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for path in files:
        h.update(file_digest(path).encode())
    h.update(library_digest().encode())
    return h.hexdigest()[:16]
