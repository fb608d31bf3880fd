"""`granndis report`'s options (the command itself: granndis_hpc/report/command.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .declare import ConfigError, Options, option


@dataclass
class ReportOptions(Options):
    """`granndis report`'s options (granndis_hpc/options/ derives the parser and --config)."""
    run_dirs: List[str] = option([], positional=True, nargs="*", metavar="RUN_DIR",
                                 help="run directories written by granndis-train")
    sweep: Optional[str] = option(None, metavar="DIR",
                                  help="run directories below DIR, each with its link.json (the link it ran on): "
                                       "plot speedup over fb against link rate")
    out: Optional[str] = option(None, help="output directory (default: the run directory when there is one run, "
                                           "else ./report)")

    def __post_init__(self):
        super().__post_init__()
        if self.sweep is not None and self.run_dirs:
            raise ConfigError("give either run directories or --sweep, not both")
        if self.sweep is None and not self.run_dirs:
            raise ConfigError("give one or more run directories (or --sweep DIR)")


REPORT_PROG = "granndis report"
REPORT_DESCRIPTION = "Plots and a comparison table for one or more granndis-train run directories."
REPORT_EPILOG = ("examples:\n  granndis report runs/fb-123 runs/flx-124 --out reports/cora\n"
                 "  granndis report --sweep bench-out/cluster/runs --out reports/cluster")
