"""Stage report: the paper's tables with our numbers beside them, summary.csv, headline metrics, figures."""
from gcl.config import read_resolved
from gcl.layout import resolved_report
from gcl.report import write_report

if __name__ == "__main__":
    write_report(read_resolved(resolved_report()), "results",
                 ["reference/paper_results.csv", "reference/der_paper_results.csv"])
