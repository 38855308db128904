"""Stage check@<data|runs|reproductions>: validate params.yaml and write the resolved settings the other stages
read.

check@data resolves the sources and benchmarks (what prepare@ and benchmark@ read); check@runs resolves
every run and the report (what train@ and report read); check@reproductions verifies each committed
reproduction against its own dvc.lock before the report reads its numbers (gcl.report.reproductions), so that a
refused one stops `dvc repro` before DVC deletes results/ to run the report. All depend on the whole params.yaml,
so the file is validated on every `dvc repro` that follows an edit; the files they write change only where a
setting changed, so only the stages that read a changed setting re-run. Each run's file also carries the
digest of the code its train stage runs (gcl.core.layout.TRAIN_CODE): a code change re-runs every train stage.
"""
import sys

from gcl.config import check_data, check_reproductions, check_runs, load_params
from gcl.core.atomic import write_json
from gcl.core.fingerprint import train_code_digest
from gcl.core.layout import resolved_benchmark, resolved_report, resolved_run, resolved_source
from gcl.report.reproductions import VERIFIED

USAGE = "usage: python stages/check.py data|runs|reproductions"


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in ("data", "runs", "reproductions"):
        sys.exit(USAGE)
    params = load_params()
    if sys.argv[1] == "data":
        resolved = check_data(params)
        for name, settings in resolved["sources"].items():
            write_json(resolved_source(name), settings)
        for name, groups in resolved["benchmarks"].items():
            # only what the benchmark file is built from: a caption or a thread count must not rebuild it
            write_json(resolved_benchmark(name), {"data": groups["data"]})
    elif sys.argv[1] == "runs":
        resolved = check_runs(params)
        code = train_code_digest(__file__)   # the train stages' code, as part of each run's settings
        for key, spec in resolved["runs"].items():
            write_json(resolved_run(key), {**spec, "code": code})
        write_json(resolved_report(), resolved["report"])
    else:
        write_json(VERIFIED, check_reproductions(params))
    print(f"params.yaml: {sys.argv[1]} settings valid")


if __name__ == "__main__":
    main()
