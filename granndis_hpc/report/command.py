"""`granndis report RUN_DIR [RUN_DIR ...] [--out DIR]`: plots and an AE1-style table from run directories.

Each run directory holds ``config.json`` (resolved options), ``metrics.jsonl`` (one record per epoch) and
``summary.json`` (per-epoch figures and totals), written by the trainer.  A run that is still running, or
stopped or failed before writing summary.json, is reported from the epochs its metrics.jsonl holds,
marked "unfinished".  The report makes four PNGs and
``report.md``:

- time_breakdown.png: seconds per epoch from summary.json (the trainer writes medians over epochs),
  stacked by phase (compute, intra-server comm, inter-server comm, gradient sync, sampling when used,
  and "other" = epoch time not in any timed phase);
- accuracy.png: validation and test accuracy over the evaluated epochs of every run;
- time_to_accuracy.png: validation accuracy against the seconds since launch (the run's start-up, then
  the sum of the epoch times so far, evaluation excluded), one line per run;
- bytes.png: bytes per epoch for each link class (halo and gradient, intra- and inter-server);
- learning_rate.png: the learning rate of every epoch (runs whose metrics.jsonl records it);
- report.md: the table below plus the plots, and for a run on a heterogeneous shard set its per-type
  table (vertices, feature bytes, the target type's split: granndis_hpc/report/types.py).

Table columns follow the GraNNDis artifact's AE1 table, with honest units: the artifact printed mean
milliseconds per epoch under "Total Time (sec)"; here "Epoch time (s)" is summary.json's seconds per
epoch (a median over epochs), "Total time (s)" the measured wall time of the whole run, and
"Comm (s/epoch)" counts every communication phase (intra-server, inter-server and gradient sync; the artifact left
gradient sync out)
of the same rank and epoch as the epoch time (the slowest rank of the median epoch), so it is a part of it.
"Test acc" is the last epoch's; "Test acc at best val (epoch)" the test accuracy of the evaluated epoch
with the best validation accuracy (summary.json's best_val, what published GCN figures report).  Runs
evaluated with another --metric (micro-f1, rocauc) show it instead, in these columns and in the plots.
Speedup = epoch time of the matching FB run / epoch time of this run, where the matching FB run is the
first `fb` run given with the same model, layers, servers and ranks per server (a speedup across
different models or cluster shapes would not mean anything), preferring one with the same settings
(COMPARED_SETTINGS); a speedup against an fb run with other settings is marked "*" and explained
below the table; else "n/a".

"Epoch / overlap limit" = the measured epoch over the overlapped cost-model limit of the run on its link
(granndis_hpc/report/linkmodel.py), for a run directory that holds a link.json (the link it ran on); else "n/a".

`granndis report --sweep DIR [--out DIR]` reads the run directories below DIR, each with its link.json
(granndis_hpc/report/links.py), and writes ``speedup_vs_rate.png`` (speedup over fb against the
inter-server link rate, log scale; an unshaped link is drawn at its measured ping-pong bandwidth) and
``speedup_vs_rate.md`` (the same numbers as a table, and each run's measured epoch / limit), and prints them.

Loading and checking: granndis_hpc/report/data.py; plots: granndis_hpc/report/plots.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from granndis_hpc import options
from granndis_hpc.fsutil import atomic_write_bytes
from granndis_hpc.options.report import REPORT_DESCRIPTION, REPORT_EPILOG, REPORT_PROG, ReportOptions
from granndis_hpc import link_classes
from granndis_hpc.report.data import (ReportError, RunData, assign_labels, baseline_notes, find_baselines, load_run,
                                      metric_label, overlap_limit_s, setting_differences)
from granndis_hpc.metric_names import summary_key
from granndis_hpc.report.links import load_sweep, render_sweep
from granndis_hpc.report.outdir import REPORT_HEADING, prepare_report_dir
from granndis_hpc.report.types import types_table
from granndis_hpc.report.plots import (plot_accuracy, plot_bytes, plot_learning_rate, plot_time_breakdown,
                                       plot_time_to_accuracy)

__all__ = ["ReportError", "RunData", "load_run", "render_report", "format_table", "load_sweep",
           "render_sweep", "main"]


# ---------------------------------------------------------------------------------------------
# Table


TABLE_HEADER = ("Method", "Servers x GPUs", "Epochs", "Epoch time (s)", "Comm (s/epoch)", "Total time (s)",
                "Speedup vs FB", "Epoch / overlap limit", "Test acc", "Test acc at best val (epoch)")


def format_table(runs, baselines) -> str:
    rows = []
    for i, run in enumerate(runs):
        s = run.summary
        speedup = "n/a"
        if i in baselines and s["epoch_time_s"] > 0:
            speedup = f"{runs[baselines[i]].summary['epoch_time_s'] / s['epoch_time_s']:.2f}x"
            if setting_differences(run, runs[baselines[i]]):
                speedup += "*"  # see baseline_notes
        test, best, limit = s[summary_key(s["metric"])].get("test"), s.get("best_val"), overlap_limit_s(run)
        epochs = str(s["epochs"]) + (" (unfinished)" if s.get("status") else "")
        rows.append((run.label, f"{s['servers']}x{s['ranks_per_server']}", epochs,
                     f"{s['epoch_time_s']:.4f}", f"{run.comm_s:.4f}", f"{s['total_time_s']:.2f}", speedup,
                     "n/a" if limit is None else f"{s['epoch_time_s'] / limit:.2f} ({limit:.4f} s)",
                     "n/a" if test is None else f"{test:.4f}",
                     "n/a" if best is None else f"{best['test']:.4f} ({best['epoch']})"))
    header = table_header(metric_label(runs))
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def table_header(metric: str) -> tuple:
    """TABLE_HEADER with the runs' metric in its last two columns ("Test acc" for accuracy)."""
    if metric == "accuracy":
        return TABLE_HEADER
    return TABLE_HEADER[:-2] + (f"Test {metric}", f"Test {metric} at best val (epoch)")


# ---------------------------------------------------------------------------------------------
# Report


def _markdown(runs, baselines, table, pngs, out_dir):
    lines = [REPORT_HEADING, "", table, "",
             "Epoch time is the median over epochs of the slowest rank's epoch; Comm = intra-server + "
             "inter-server + gradient sync of that same rank in the median epoch (a part of the epoch time).",
             "Speedup = FB epoch time / epoch time, against the FB run with the same model, layers and "
             "cluster shape (and, where one was given, the same settings).",
             "Epoch / overlap limit: the measured epoch over the cost model's limit with every layer's wire time "
             "hidden behind its compute (granndis_hpc/report/linkmodel.py), on the link of the run's link.json; n/a "
             "without one.", *baseline_notes(runs, baselines)]
    used = sorted(set(baselines.values()))
    if used:
        lines.append("FB baseline(s): " + "; ".join(f"{runs[i].label} ({runs[i].run_dir})" for i in used) + ".")
    else:
        lines.append("No matching `fb` run was given, so there is no speedup.")
    lines += ["", "Runs:", ""]
    for r in runs:
        lines.append(f"- {r.label}: `{r.run_dir}`" + (f" ({r.summary['status']})" if r.summary.get("status") else ""))
        if isinstance(r.summary.get("links"), dict):  # measured at the run's start-up
            lines.append(f"  - {link_classes.verdict(r.summary['links'])}")
    lines.append("")
    for r in runs:
        lines += types_table(r)
    for png in pngs:
        rel = os.path.relpath(png, out_dir)
        lines += [f"![{os.path.splitext(os.path.basename(png))[0]}]({rel})", ""]
    return "\n".join(lines)


def render_report(run_dirs, out_dir) -> dict:
    """Load the runs, write the PNGs and report.md into out_dir; return {table, pngs, markdown}."""
    if not run_dirs:
        raise ReportError("no run directories given")
    runs = [load_run(d) for d in run_dirs]
    assign_labels(runs)
    baselines = find_baselines(runs)
    out_dir = prepare_report_dir(out_dir)
    pngs = [plot_time_breakdown(runs, os.path.join(out_dir, "time_breakdown.png")),
            plot_accuracy(runs, os.path.join(out_dir, "accuracy.png")),
            plot_time_to_accuracy(runs, os.path.join(out_dir, "time_to_accuracy.png")),
            plot_bytes(runs, os.path.join(out_dir, "bytes.png"))]
    if any(m.get("lr") is not None for run in runs for m in run.metrics):  # runs that record their rates
        pngs.append(plot_learning_rate(runs, os.path.join(out_dir, "learning_rate.png")))
    table = format_table(runs, baselines)
    md_path = os.path.join(out_dir, "report.md")
    atomic_write_bytes(md_path, _markdown(runs, baselines, table, pngs, out_dir).encode())
    return {"table": table, "pngs": pngs, "markdown": md_path, "notes": baseline_notes(runs, baselines)}


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser(ReportOptions, REPORT_PROG, REPORT_DESCRIPTION, REPORT_EPILOG)


def main(argv=None) -> int:
    args = options.parse_options(ReportOptions, argv, REPORT_PROG, REPORT_DESCRIPTION, REPORT_EPILOG)
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else "report")
    try:
        result = render_sweep(args.sweep, out) if args.sweep else render_report(args.run_dirs, out)
    except ReportError as exc:
        print(f"granndis report: error: {exc}", file=sys.stderr)
        return 2
    print(result["table"])
    if not args.sweep:
        print("Epoch time: the slowest rank's epoch (median over epochs); Comm: that rank's communication "
              "in that epoch, a part of it.")
    for note in result.get("notes", []):
        print(note)
    print()
    for png in result["pngs"]:
        print(f"plot: {png}")
    print(f"report: {result['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
