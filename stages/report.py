"""Stage report: the paper's tables with our numbers beside them, summary.csv, headline metrics, figures."""
from gcl.config import load_params
from gcl.report import write_report

if __name__ == "__main__":
    write_report(load_params(), "results", ["reference/paper_results.csv", "reference/der_paper_results.csv"])
