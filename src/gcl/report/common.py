"""What the report's tables and figures share: its error type, its warnings, the order of buffers."""
from __future__ import annotations

import sys

from gcl.core.errors import UserError


class ReportError(UserError, RuntimeError):
    pass


def buffer_key(b) -> tuple:
    """'none' first, then buffers numerically (200 < 500 < 1000 < 5120)."""
    b = str(b)
    return (b != "none", int(b) if b.isdigit() else 0, b)


def warn(message: str, warnings: list[str]) -> None:
    print(f"warning: {message}", file=sys.stderr)
    warnings.append(message)
