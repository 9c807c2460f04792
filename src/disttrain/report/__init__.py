"""Run folders -> plots and one self-contained HTML page (``disttrain report``), also served live."""

from disttrain.report.page import write_report
from disttrain.report.runs import Run, load_run

__all__ = ["Run", "load_run", "write_report"]
