"""Stage train@<run>: every seed of one run; writes runs/<benchmark>/<method>/<buffer>/metrics.json."""
import sys

from gcl.config import load_params, read_resolved, resolve_runtime
from gcl.layout import resolved_run
from gcl.processes import die_with_parent
from gcl.run import train_run

if __name__ == "__main__":
    die_with_parent()   # a killed `dvc repro` must not leave this stage writing results behind it
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/train.py <run>   (a key of runs: in params.yaml)")
    spec = read_resolved(resolved_run(sys.argv[1]))
    print(train_run(spec, **resolve_runtime(load_params(), spec["run"])))
