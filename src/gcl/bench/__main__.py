"""`python -m gcl.bench <command> [options]`: one benchmark of the training code; `<command> --help` says what it
measures and how.

    steps        each method's training step beside a bare forward/backward/SGD loop; whole seeds (--cell, --stacked)
    grid         a profile's device-hours, projected from timed steps of every (benchmark, method) pair
    compile      compiled against eager training steps, per method: the speed-up and the compilation's cost
    breakdown    where the wall time of a cold `dvc repro` goes, in a fresh clone
    same-state   whether two checkouts' code trains a seed to the same state (save each, then compare)
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {"steps": "gcl.bench.steps", "grid": "gcl.bench.grid", "compile": "gcl.bench.compiled",
            "breakdown": "gcl.bench.breakdown", "same-state": "gcl.bench.same_state"}


def main(argv: list[str] | None = None):
    """Run `argv[0]`'s module's main on the rest (each module is imported only when its command runs)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.exit(f"error: no command {argv[0]!r}; the commands: {', '.join(COMMANDS)} (python -m gcl.bench --help)")
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    result = main()
    sys.exit(result if isinstance(result, int) else 0)
