"""Where `granndis report` writes: --out (default: the run directory of a single run).  The report is a few
named files in a directory that may hold other things (a run's); it replaces them only where they are an
earlier report's, recognised by the heading report writes into its Markdown file (granndis_hpc/outputs.py:
links, devices and files are refused too).  report has no overwrite option: its own earlier report is
always replaced, as the plots of a run are refreshed by running it again."""
from __future__ import annotations

import os

from granndis_hpc.outputs import OutputKind, check_output_place
from granndis_hpc.report.data import ReportError

REPORT_HEADING = "# granndis report"
SWEEP_HEADING = "# Speedup over fb against link rate"
MARKDOWN = {"report.md": REPORT_HEADING, "speedup_vs_rate.md": SWEEP_HEADING}
PLOTS = ("time_breakdown.png", "accuracy.png", "time_to_accuracy.png", "bytes.png", "learning_rate.png",
         "speedup_vs_rate.png")


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n")
    except OSError:
        return ""


def is_report(out_dir: str) -> bool:
    """Whether the directory holds a report of granndis report: one of its Markdown files with its heading."""
    return any(_first_line(os.path.join(out_dir, name)) == heading for name, heading in MARKDOWN.items())


REPORT = OutputKind(tool="granndis report", what="a report", recognise=is_report, overwrite="",
                    members=(*MARKDOWN, *PLOTS))


def prepare_report_dir(out_dir) -> str:
    """Refuse an --out the report may not write (ReportError), then create it; returns its path."""
    out_dir = os.fspath(out_dir)
    check_output_place(out_dir, REPORT, overwrite=True, error=ReportError)
    os.makedirs(out_dir, exist_ok=True)
    return out_dir
