"""The report stage's library: the paper's tables beside ours (tables), the figures and plot data (figures),
and what both share (common)."""
from gcl.report.common import ReportError
from gcl.report.tables import Display, write_report

__all__ = ["Display", "ReportError", "write_report"]
