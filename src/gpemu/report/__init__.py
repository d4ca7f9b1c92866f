"""The run report: per-iteration wall time, data wait, H2D, GPU busy/idle and fetch stall, for any training loop."""

from gpemu.report.collector import EngineLog, RunCollector
from gpemu.report.hooks import RunReport, active_report, install_report, install_report_from_env, reporting
from gpemu.report.summary import iteration_rows, render, report_dict, summarize, write_json

__all__ = [
    "EngineLog",
    "RunCollector",
    "RunReport",
    "active_report",
    "install_report",
    "install_report_from_env",
    "iteration_rows",
    "render",
    "report_dict",
    "reporting",
    "summarize",
    "write_json",
]
