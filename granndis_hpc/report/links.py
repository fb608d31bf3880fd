"""`granndis report --sweep DIR`: speedup over fb against the inter-server link rate, from run directories.

DIR holds run directories (DIR/NAME or DIR/LABEL/NAME), each with its own link.json (the link it ran on,
granndis_hpc/report/linkmodel.py).  Runs are grouped by link.json's label; within a group a run is named by its
directory (a configuration: fb, flx, flx-k1, fb-noovl, ...), and every group must hold the same names,
one of them `fb`, the baseline.  Epoch time is each run's summary.json epoch_time_s.  Beside the speedup
the page gives every run's measured epoch over its overlapped cost-model limit on its link.
"""
from __future__ import annotations

import glob
import os

from granndis_hpc.fsutil import atomic_write_bytes
from granndis_hpc.registry import baseline_mode
from granndis_hpc.report.data import ReportError, load_run, overlap_limit_s
from granndis_hpc.report.outdir import SWEEP_HEADING, prepare_report_dir
from granndis_hpc.report.plots import plot_sweep, sweep_x


def _run_dirs(root):
    found = sorted({os.path.dirname(p) for pattern in ("*/summary.json", "*/*/summary.json")
                    for p in glob.glob(os.path.join(glob.escape(root), pattern))})
    if not found:
        raise ReportError(f"sweep {root}: no run directories (DIR/NAME/summary.json or DIR/LABEL/NAME/summary.json)"
                          + ("" if os.path.isdir(root) else ": not a directory"))
    return found


def load_sweep(root) -> dict:
    """Group the run directories below `root` by link: {"modes": [fb, ...], "rates": [{"label", "rate_bps",
    "bw_Bps", "runs": {name: {"epoch_s", "limit_s", "run_dir"}}}], "graph": {"servers", "ranks_per_server"}}."""
    root = os.fspath(root)
    rates, names, shape = {}, [], None
    for run_dir in _run_dirs(root):
        run = load_run(run_dir)
        if run.link is None:
            raise ReportError(f"run {run_dir}: no link.json, so its link rate is not known (see "
                              f"granndis_hpc/report/linkmodel.py for the format; bench/bench_cluster.py writes it)")
        s = run.summary
        if shape is None:
            shape = (s["servers"], s["ranks_per_server"])
        label = run.link["label"]
        rate = rates.setdefault(label, {"label": label, "rate_bps": run.link.get("rate_bps"),
                                        "bw_Bps": run.link["bw_Bps"], "runs": {}})
        if rate["rate_bps"] != run.link.get("rate_bps"):
            raise ReportError(f"run {run_dir}: link {label!r} has rate_bps {run.link.get('rate_bps')!r} here but "
                              f"{rate['rate_bps']!r} in another run")
        if run.name in rate["runs"]:
            raise ReportError(f"sweep {root}: two runs named {run.name!r} on link {label!r}")
        if s["epoch_time_s"] <= 0:
            raise ReportError(f"run {run_dir}: epoch_time_s must be positive, found {s['epoch_time_s']}")
        rate["runs"][run.name] = {"epoch_s": s["epoch_time_s"], "limit_s": overlap_limit_s(run), "run_dir": run_dir}
        if run.name not in names:
            names.append(run.name)
    base = baseline_mode()
    if base not in names:
        raise ReportError(f"sweep {root}: no run named {base!r} (the baseline), so there is no speedup to draw")
    modes = [base] + sorted(n for n in names if n != base)
    for rate in rates.values():
        missing = [m for m in modes if m not in rate["runs"]]
        if missing:
            raise ReportError(f"sweep {root}: link {rate['label']!r}: no run of {', '.join(map(repr, missing))}")
        rate["runs"] = {m: rate["runs"][m] for m in modes}
    return {"modes": modes, "baseline": base, "rates": list(rates.values()),
            "graph": {"servers": shape[0], "ranks_per_server": shape[1]}}


def _markdown_table(header, rows) -> str:
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)])


def _rate_label(rate):
    return rate["label"] + (" (measured)" if rate.get("rate_bps") is None else "")


def sweep_table(sweep) -> str:
    base = sweep["baseline"]
    others = [m for m in sweep["modes"] if m != base]
    rows = []
    for rate in sorted(sweep["rates"], key=sweep_x):
        t = rate["runs"][base]["epoch_s"]
        rows.append([_rate_label(rate), f"{sweep_x(rate):,.0f}", f"{t:.3f}"]
                    + [f"{t / rate['runs'][m]['epoch_s']:.2f}x" for m in others])
    return _markdown_table(["Link rate", "Mbit/s",
                            f"{base.upper()} epoch (s)"] + [f"{m.upper()} speedup" for m in others],
                           rows)


def limit_table(sweep) -> str:
    """Measured epoch / overlapped limit per run and link ("n/a": no per-server bytes in the run)."""
    def cell(run):
        return "n/a" if run["limit_s"] is None else f"{run['epoch_s'] / run['limit_s']:.2f} ({run['limit_s']:.3f} s)"
    rows = [[_rate_label(rate)] + [cell(rate["runs"][m]) for m in sweep["modes"]]
            for rate in sorted(sweep["rates"], key=sweep_x)]
    return _markdown_table(["Link rate"] + [f"{m} measured / limit" for m in sweep["modes"]], rows)


def render_sweep(root, out_dir) -> dict:
    sweep = load_sweep(root)
    out_dir = prepare_report_dir(out_dir)
    png = plot_sweep(sweep, os.path.join(out_dir, "speedup_vs_rate.png"))
    table, limits = sweep_table(sweep), limit_table(sweep)
    md = os.path.join(out_dir, "speedup_vs_rate.md")
    atomic_write_bytes(md, (SWEEP_HEADING + "\n\n" + table + "\n\n"
                            "## Measured epoch / overlapped cost-model limit\n\n" + limits + "\n\n"
                            "The limit (granndis_hpc/report/linkmodel.py) hides each layer's wire time behind its "
                            "compute "
                            "(the run's own measured compute, on its link.json's measured bandwidth); a measured "
                            "epoch is at or above it.\n\nFrom the runs under `" + os.fspath(root)
                            + "`.\n\n![speedup vs link rate](speedup_vs_rate.png)\n").encode())
    return {"table": table + "\n\n" + limits, "pngs": [png], "markdown": md}
