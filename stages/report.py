"""Stage report: the paper's tables with our numbers beside them, the headline, summary.csv, the metrics
`dvc exp show` compares, plot data for `dvc plots`, figures. Warnings (stale run folders, skipped
figures) are printed and listed at the top of results/tables.md."""
from pathlib import Path

from gcl.config import load_params, read_current, resolve_report
from gcl.core.layout import resolved_report
from gcl.core.progress_files import sweep_finished_progress
from gcl.report.write import write_report

PAPER = sorted(Path("reference").glob("*.csv"))   # the published numbers our runs are set beside


def main() -> None:
    resolved = read_current(resolved_report(), resolve_report(load_params()), "report", "report")
    warnings = write_report(resolved, "results", PAPER)
    print(f"report written to results/ ({len(warnings)} warning(s))")
    swept = sweep_finished_progress(resolved["runs"])    # left by runs DVC restored from its run cache
    if swept:
        print(f"removed the progress files of {len(swept)} finished run(s) from .gcl-progress/")


if __name__ == "__main__":
    main()
