"""Stage train@<run>: every seed of one run; writes runs/<benchmark>/<method>/<buffer>/metrics.json."""
import sys

from gcl.config import load_params, read_resolved, resolve_benchmark
from gcl.layout import resolved_run
from gcl.processes import die_with_parent
from gcl.run import train_run

if __name__ == "__main__":
    die_with_parent()   # a killed `dvc repro` must not leave this stage writing results behind it
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/train.py <run>   (a key of runs: in params.yaml)")
    spec = read_resolved(resolved_run(sys.argv[1]))
    # how fast, not what: read from params.yaml, not a dependency of the stage
    params = load_params()
    threads = resolve_benchmark(params, spec["run"]["benchmark"])["runtime"]["threads"]
    print(train_run(spec, workers=params.get("workers", 1), threads=threads))
