"""python -m gcl.rerender reproductions/<name> [...]: render committed reproductions' tables.md, costs.md,
metrics.json, plot data and README readings blocks again from their own runs, params.yaml and the published numbers
(reference/*.csv), after a change of the report's code (gcl.report.rerender says what is compared and why). Each
folder's inputs are verified against its dvc.lock first; summary.csv, params.yaml, dvc.lock, runs/ and the figures
are never written."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gcl.config import resolve_profile
from gcl.core.errors import UserError
from gcl.report.reproductions import verify
from gcl.report.rerender import RERENDER, rerender, rewrite_readme_blocks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=RERENDER, description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("folders", nargs="+", type=Path, help="reproduction folders, e.g. reproductions/mnist-360")
    args = parser.parse_args(argv)
    try:
        for folder in args.folders:
            record = verify(folder, resolve_profile)      # its inputs are those its dvc.lock records
            changed = rerender(folder, record["resolved"]) + rewrite_readme_blocks(folder, record["resolved"])
            print(f"{folder}: " + (f"rewrote {', '.join(changed)}" if changed else "already current"))
    except UserError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
