"""Stage train@<run>: every seed of one run; writes runs/<benchmark>/<method>/<buffer>/metrics.json.

It refuses settings that check@runs resolved for other code than is there now, or before an edit of
params.yaml (`dvc repro -s` skips check@runs): it trains on what params.yaml says, or not at all."""
import sys

from gcl.config import load_params, read_current, read_resolved, resolve_run, resolve_runtime
from gcl.core.fingerprint import train_code_digest
from gcl.core.layout import TRAIN_CODE, resolved_run
from gcl.training.run import train_run


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python stages/train.py <run>   (a key of runs: in params.yaml; dvc.yaml adds the run's "
                 "settings after it, which are not read: the stage reads params.yaml)")
    key = sys.argv[1]
    if read_resolved(resolved_run(key)).get("code") != train_code_digest(__file__):
        # e.g. `dvc repro -s train@<run>` after a code edit: the settings were resolved for other code
        sys.exit(f"error: {resolved_run(key)} was resolved for other code than {', '.join(TRAIN_CODE)} hold "
                 "now: run `dvc repro check@runs` (or a plain `dvc repro`) first")
    params = load_params()
    spec = read_current(resolved_run(key), resolve_run(params, key), f"runs.{key}", f"train@{key}")
    print(train_run(spec, **resolve_runtime(params)))


if __name__ == "__main__":
    main()
