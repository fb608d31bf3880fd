"""`granndis report RUN_DIR [RUN_DIR ...] [--out DIR]`: plots and an AE1-style table from run directories.

Each run directory holds ``config.json`` (resolved options), ``metrics.jsonl`` (one record per epoch) and
``summary.json`` (per-epoch figures and totals), written by the trainer.  The report makes three PNGs and
``report.md``:

- time_breakdown.png: seconds per epoch from summary.json (the trainer writes medians over epochs),
  stacked by phase (compute, intra-server comm, inter-server comm, gradient sync, sampling when used,
  and "other" = epoch time not in any timed phase);
- accuracy.png: validation and test accuracy over the evaluated epochs of every run;
- bytes.png: bytes per epoch for each link class (halo and gradient, intra- and inter-server);
- report.md: the table below plus the plots.

Table columns follow the GraNNDis artifact's AE1 table, with honest units: the artifact printed mean
milliseconds per epoch under "Total Time (sec)"; here "Epoch time (s)" is summary.json's seconds per
epoch (a median over epochs), "Total time (s)" the measured wall time of the whole run, and
"Comm (s/epoch)" counts every communication phase (intra-server, inter-server and gradient sync; the artifact left gradient sync out)
of the same rank and epoch as the epoch time (the slowest rank of the median epoch), so it is a part of it.
"Test acc" is the last epoch's; "Test acc at best val (epoch)" the test accuracy of the evaluated epoch
with the best validation accuracy (summary.json's best_val, what published GCN figures report).
Speedup = epoch time of the matching FB run / epoch time of this run, where the matching FB run is the
first `fb` run given with the same model, layers, servers and ranks per server (a speedup across
different models or cluster shapes would not mean anything), preferring one with the same settings
(COMPARED_SETTINGS); a speedup against an fb run with other settings is marked "*" and explained
below the table; else "n/a".

`granndis report --sweep SWEEP.json [--out DIR]` reads the output of bench/bench_cluster.py (every mode at
several link rates of the emulated cluster) and writes ``speedup_vs_rate.png`` (speedup over fb against
the inter-server link rate, log scale; the unshaped run is drawn at its measured ping-pong bandwidth) and
``speedup_vs_rate.md`` (the same numbers as a table), and prints the table.

Plots use matplotlib's object API on the Agg canvas: no pyplot, no global backend switch, no display.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

from granndis_hpc import options
from granndis_hpc.fsutil import atomic_path, atomic_write_bytes, read_json_object
from granndis_hpc.metrics import MetricsError, read_metrics_lines
from granndis_hpc.options import ConfigError, Options, option

__all__ = ["ReportError", "RunData", "load_run", "render_report", "format_table", "load_sweep",
           "render_sweep", "main"]

TIME_PHASES = (("compute", "compute"), ("intra_comm", "intra-server comm"), ("inter_comm", "inter-server comm"),
               ("grad_sync", "gradient sync"), ("sampling", "sampling"))
BYTE_CLASSES = (("intra_halo", "intra-server halo"), ("inter_halo", "inter-server halo"),
                ("intra_grad", "intra-server gradient"), ("inter_grad", "inter-server gradient"))
COMM_PHASES = ("intra_comm", "inter_comm", "grad_sync")
LOG_SCALE_RATIO = 1e3  # bytes plot switches to log scale when the largest/smallest nonzero value exceed this


class ReportError(ValueError):
    """A run directory is missing a file or holds a malformed one; the message names both."""


@dataclass
class RunData:
    run_dir: str
    config: dict
    summary: dict
    metrics: list
    label: str = ""

    @property
    def method(self) -> str:
        return f"{self.summary['mode'].upper()} {self.summary['model']} L={self.summary['layers']}"

    @property
    def shape(self) -> tuple:
        s = self.summary
        return (s["model"], s["layers"], s["servers"], s["ranks_per_server"])

    @property
    def comm_s(self) -> float:
        return sum(self.summary["seconds_per_epoch"][k] for k in COMM_PHASES)


# ---------------------------------------------------------------------------------------------
# Loading and checking


def _read_json(run_dir, name):
    return read_json_object(os.path.join(run_dir, name), ReportError, where=f"run {run_dir}: {name}",
                            not_found_hint=" (is this a granndis run directory, and did the run finish?)")


def _check(obj, key, kinds, where, optional=False):
    """Return obj[key] if it has one of `kinds` ("int", "number", "str", "dict"); else ReportError."""
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise ReportError(f"{where}: missing {key!r}")
    value = obj[key]
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
    }
    if not any(ok[k](value) for k in kinds):
        raise ReportError(f"{where}: {key!r} must be {' or '.join(kinds)}, found {value!r}")
    return value


def _check_summary(summary, where):
    for key in ("mode", "model"):
        _check(summary, key, ["str"], where)
    for key in ("layers", "servers", "ranks_per_server", "epochs"):
        _check(summary, key, ["int"], where)
    for key in ("epoch_time_s", "total_time_s"):
        _check(summary, key, ["number"], where)
    seconds = _check(summary, "seconds_per_epoch", ["dict"], where)
    for key, _ in TIME_PHASES:
        # sampling is absent from exact modes in older summaries: treat as zero
        if _check(seconds, key, ["number"], where + " seconds_per_epoch", optional=key == "sampling") is None:
            seconds[key] = 0.0
    byte_counts = _check(summary, "bytes_per_epoch", ["dict"], where)
    for key, _ in BYTE_CLASSES:
        _check(byte_counts, key, ["number"], where + " bytes_per_epoch")
    accuracy = _check(summary, "accuracy", ["dict"], where, optional=True) or {}
    for key in ("train", "val", "test"):
        _check(accuracy, key, ["number"], where + " accuracy", optional=True)
    summary["accuracy"] = accuracy
    best = _check(summary, "best_val", ["dict"], where, optional=True)
    if best is not None:
        _check(best, "epoch", ["int"], where + " best_val")
        for key in ("val", "test"):
            _check(best, key, ["number"], where + " best_val")
    _check(summary, "peak_memory_bytes", ["int"], where, optional=True)


def _read_metrics(run_dir):
    try:
        lines = read_metrics_lines(run_dir)
    except MetricsError as exc:
        raise ReportError(f"run {run_dir}: {exc}") from None
    records = []
    for number, record in lines:
        where = f"run {run_dir}: metrics.jsonl line {number}"
        _check(record, "epoch", ["int"], where)
        for key in ("time_s", "loss"):
            _check(record, key, ["number"], where)
        for key in ("val_acc", "test_acc", "train_acc"):
            _check(record, key, ["number"], where, optional=True)
        records.append(record)
    if not records:
        raise ReportError(f"run {run_dir}: metrics.jsonl has no epoch records")
    return records


def load_run(run_dir) -> RunData:
    """Read and check one run directory."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ReportError(f"run {run_dir}: not a directory")
    config = _read_json(run_dir, "config.json")
    for key in ("mode", "model", "layers"):
        if key not in config:
            raise ReportError(f"run {run_dir}: config.json has no {key!r}")
    summary = _read_json(run_dir, "summary.json")
    _check_summary(summary, f"run {run_dir}: summary.json")
    for key in ("mode", "model", "layers"):
        if config[key] != summary[key]:
            raise ReportError(f"run {run_dir}: config.json says {key}={config[key]!r} but summary.json says "
                              f"{summary[key]!r}; the files come from different runs")
    return RunData(run_dir, config, summary, _read_metrics(run_dir))


def _assign_labels(runs):
    """Method names, made unique with the run directory's name where two runs share one."""
    counts = {}
    for run in runs:
        counts[run.method] = counts.get(run.method, 0) + 1
    for run in runs:
        base = os.path.basename(os.path.normpath(run.run_dir))
        run.label = run.method if counts[run.method] == 1 else f"{run.method} [{base}]"


# Options besides the shape (model, layers, servers, ranks per server) that change what an epoch costs
# or computes: a speedup against an fb run that differs in one of them is flagged (issue 21, item 11).
COMPARED_SETTINGS = ("hidden", "dropout", "input_dropout", "norm", "weight_decay", "checkpoint_activations",
                     "device", "intra_transport", "lr", "seed")


def setting_differences(run, baseline) -> list:
    """"name a vs b" for each of COMPARED_SETTINGS the two runs' config.json give different values."""
    out = []
    for key in COMPARED_SETTINGS:
        a, b = run.config.get(key), baseline.config.get(key)
        if a != b:
            out.append(f"{key} {a!r} vs {b!r}")
    return out


def find_baselines(runs) -> dict:
    """{index of run: index of its FB baseline run} for runs with a matching `fb` run (same shape),
    preferring one whose settings (COMPARED_SETTINGS) are also the same."""
    out = {}
    for i, run in enumerate(runs):
        fbs = [j for j, other in enumerate(runs) if other.summary["mode"].lower() == "fb" and other.shape == run.shape]
        alike = [j for j in fbs if not setting_differences(run, runs[j])]
        if alike or fbs:
            out[i] = (alike or fbs)[0]
    return out


def baseline_notes(runs, baselines) -> list:
    """One line per run whose FB baseline differs in settings (its speedup is marked with *)."""
    notes = []
    for i, j in sorted(baselines.items()):
        diff = setting_differences(runs[i], runs[j])
        if diff:
            notes.append(f"* {runs[i].label}: its speedup compares against {runs[j].label}, whose settings differ "
                         f"({', '.join(diff)}): not like with like; give an fb run with the same settings")
    return notes


# ---------------------------------------------------------------------------------------------
# Table


TABLE_HEADER = ("Method", "Servers x GPUs", "Epochs", "Epoch time (s)", "Comm (s/epoch)", "Total time (s)",
                "Speedup vs FB", "Test acc", "Test acc at best val (epoch)")


def format_table(runs, baselines) -> str:
    rows = []
    for i, run in enumerate(runs):
        s = run.summary
        speedup = "n/a"
        if i in baselines and s["epoch_time_s"] > 0:
            speedup = f"{runs[baselines[i]].summary['epoch_time_s'] / s['epoch_time_s']:.2f}x"
            if setting_differences(run, runs[baselines[i]]):
                speedup += "*"  # see baseline_notes
        test, best = s["accuracy"].get("test"), s.get("best_val")
        rows.append((run.label, f"{s['servers']}x{s['ranks_per_server']}", str(s["epochs"]),
                     f"{s['epoch_time_s']:.4f}", f"{run.comm_s:.4f}", f"{s['total_time_s']:.2f}",
                     speedup, "n/a" if test is None else f"{test:.4f}",
                     "n/a" if best is None else f"{best['test']:.4f} ({best['epoch']})"))
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(TABLE_HEADER)]

    def line(cells):
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(TABLE_HEADER), sep, *(line(r) for r in rows)])


# ---------------------------------------------------------------------------------------------
# Plots


def _new_figure(width=7.5, height=4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path):
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    return path


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n} B"  # unreachable


def plot_time_breakdown(runs, path):
    import numpy as np
    phases = [(k, name) for k, name in TIME_PHASES
              if k != "sampling" or any(r.summary["seconds_per_epoch"]["sampling"] > 0 for r in runs)]
    values = np.array([[r.summary["seconds_per_epoch"][k] for k, _ in phases] for r in runs], dtype=float)
    epoch = np.array([r.summary["epoch_time_s"] for r in runs], dtype=float)
    other = np.clip(epoch - values.sum(axis=1), 0.0, None)  # phases may overlap; never negative
    if np.any(other > 0.01 * np.maximum(epoch, 1e-12)):
        phases.append(("other", "other (not in a timed phase)"))
        values = np.column_stack([values, other])
    fig = _new_figure(max(5.0, 1.6 * len(runs) + 3), 4.5)
    ax = fig.add_subplot()
    x = np.arange(len(runs))
    bottom = np.zeros(len(runs))
    for j, (_, name) in enumerate(phases):
        ax.bar(x, values[:, j], bottom=bottom, label=name, width=0.6)
        bottom += values[:, j]
    ax.set_xticks(x)
    ax.set_xticklabels([r.label for r in runs], rotation=15, ha="right")
    ax.set_ylabel("seconds per epoch (summary.json)")
    ax.set_title("Epoch time by phase")
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_accuracy(runs, path):
    fig = _new_figure()
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    drawn = False
    for run, color in zip(runs, colors):
        for key, style, name in (("val_acc", "-", "val"), ("test_acc", "--", "test")):
            points = [(m["epoch"], m[key]) for m in run.metrics if m.get(key) is not None]
            if points:
                epochs, acc = zip(*points)
                ax.plot(epochs, acc, style, color=color, marker="." if len(points) < 30 else None,
                        label=f"{run.label} {name}")
                drawn = True
    if drawn:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no evaluated epochs in these runs", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.set_title("Validation (solid) and test (dashed) accuracy")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_bytes(runs, path):
    import numpy as np
    values = np.array([[r.summary["bytes_per_epoch"][k] for k, _ in BYTE_CLASSES] for r in runs], dtype=float)
    fig = _new_figure(max(6.0, 1.8 * len(runs) + 3), 4.5)
    ax = fig.add_subplot()
    x = np.arange(len(runs))
    width = 0.8 / len(BYTE_CLASSES)
    for j, (_, name) in enumerate(BYTE_CLASSES):
        bars = ax.bar(x + (j - (len(BYTE_CLASSES) - 1) / 2) * width, values[:, j], width, label=name)
        ax.bar_label(bars, labels=[human_bytes(v) for v in values[:, j]], fontsize=6, rotation=90, padding=2)
    positive = values[values > 0]
    log = positive.size > 0 and positive.max() / positive.min() > LOG_SCALE_RATIO
    if log:
        ax.set_yscale("log")
        ax.set_ylim(bottom=positive.min() / 3, top=positive.max() * 30)  # room for the labels
    else:
        ax.set_ylim(top=max(values.max(), 1.0) * 1.3)
    ax.set_xticks(x)
    ax.set_xticklabels([r.label for r in runs], rotation=15, ha="right")
    ax.set_ylabel("bytes per epoch" + (" (log scale)" if log else ""))
    ax.set_title("Traffic per link class")
    ax.legend(fontsize="small")
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------
# Report


def _markdown(runs, baselines, table, pngs, out_dir):
    lines = ["# granndis report", "", table, "",
             "Epoch time is the median over epochs of the slowest rank's epoch; Comm = intra-server + "
             "inter-server + gradient sync of that same rank in the median epoch (a part of the epoch time).",
             "Speedup = FB epoch time / epoch time, against the FB run with the same model, layers and "
             "cluster shape (and, where one was given, the same settings).", *baseline_notes(runs, baselines)]
    used = sorted(set(baselines.values()))
    if used:
        lines.append("FB baseline(s): " + "; ".join(f"{runs[i].label} ({runs[i].run_dir})" for i in used) + ".")
    else:
        lines.append("No matching `fb` run was given, so there is no speedup.")
    lines += ["", "Runs:", ""]
    lines += [f"- {r.label}: `{r.run_dir}`" for r in runs]
    lines.append("")
    for png in pngs:
        rel = os.path.relpath(png, out_dir)
        lines += [f"![{os.path.splitext(os.path.basename(png))[0]}]({rel})", ""]
    return "\n".join(lines)


def render_report(run_dirs, out_dir) -> dict:
    """Load the runs, write the PNGs and report.md into out_dir; return {table, pngs, markdown}."""
    if not run_dirs:
        raise ReportError("no run directories given")
    runs = [load_run(d) for d in run_dirs]
    _assign_labels(runs)
    baselines = find_baselines(runs)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    pngs = [plot_time_breakdown(runs, os.path.join(out_dir, "time_breakdown.png")),
            plot_accuracy(runs, os.path.join(out_dir, "accuracy.png")),
            plot_bytes(runs, os.path.join(out_dir, "bytes.png"))]
    table = format_table(runs, baselines)
    md_path = os.path.join(out_dir, "report.md")
    atomic_write_bytes(md_path, _markdown(runs, baselines, table, pngs, out_dir).encode())
    return {"table": table, "pngs": pngs, "markdown": md_path, "notes": baseline_notes(runs, baselines)}


# ---------------------------------------------------------------------------------------------
# Link-rate sweeps (bench/bench_cluster.py)


def load_sweep(path) -> dict:
    """Read and check a sweep.json: modes (fb first), rates with their measured bandwidth and epoch times."""
    where = f"sweep {path}"
    sweep = read_json_object(path, ReportError, where=where,
                             not_found_hint=" (bench/bench_cluster.py writes it, by default to bench-out/cluster/)")
    modes = sweep.get("modes")
    if not isinstance(modes, list) or not modes or not all(isinstance(m, str) for m in modes):
        raise ReportError(f"{where}: 'modes' must be a non-empty list of mode names")
    if "fb" not in modes:
        raise ReportError(f"{where}: no 'fb' mode, so there is no speedup to draw")
    rates = sweep.get("rates")
    if not isinstance(rates, list) or not rates:
        raise ReportError(f"{where}: 'rates' must be a non-empty list; did the sweep finish?")
    for i, rate in enumerate(rates):
        w = f"{where}: rates[{i}]"
        if not isinstance(rate, dict):
            raise ReportError(f"{w} must be an object")
        _check(rate, "label", ["str"], w)
        _check(rate, "rate_bps", ["int", "number"], w, optional=True)
        _check(rate, "bw_Bps", ["number"], w)
        runs = _check(rate, "runs", ["dict"], w)
        for m in modes:
            if m not in runs or not isinstance(runs[m], dict):
                raise ReportError(f"{w} ({rate['label']}): no run of mode {m!r}")
            _check(runs[m], "epoch_s", ["number"], f"{w} runs[{m}]")
            if runs[m]["epoch_s"] <= 0:
                raise ReportError(f"{w} runs[{m}]: epoch_s must be positive, found {runs[m]['epoch_s']}")
    return sweep


def _sweep_x(rate) -> float:
    """Link rate in Mbit/s for the x axis: the configured one, or the measured one when unshaped."""
    bps = rate["rate_bps"] if rate.get("rate_bps") is not None else rate["bw_Bps"] * 8
    return bps / 1e6


def sweep_table(sweep) -> str:
    modes = sweep["modes"]
    others = [m for m in modes if m != "fb"]
    header = ["Link rate", "Mbit/s", "FB epoch (s)"] + [f"{m.upper()} speedup" for m in others]
    rows = []
    for rate in sorted(sweep["rates"], key=_sweep_x):
        fb = rate["runs"]["fb"]["epoch_s"]
        label = rate["label"] + (" (measured)" if rate.get("rate_bps") is None else "")
        rows.append([label, f"{_sweep_x(rate):,.0f}", f"{fb:.3f}"]
                    + [f"{fb / rate['runs'][m]['epoch_s']:.2f}x" for m in others])
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)])


def plot_sweep(sweep, path):
    rates = sorted(sweep["rates"], key=_sweep_x)
    xs = [_sweep_x(r) for r in rates]
    fig = _new_figure()
    ax = fig.add_subplot()
    for i, m in enumerate(sweep["modes"]):
        if m == "fb":
            continue
        ys = [r["runs"]["fb"]["epoch_s"] / r["runs"][m]["epoch_s"] for r in rates]
        ax.plot(xs, ys, marker="o", color=f"C{i % 10}", label=m)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="fb (= 1)")
    for r, x in zip(rates, xs):
        if r.get("rate_bps") is None:
            ax.annotate("unshaped", (x, 1.0), textcoords="offset points", xytext=(0, -14), ha="center",
                        fontsize="small")
    ax.set_xscale("log")
    ax.set_xlabel("inter-server link rate per direction (Mbit/s, log scale)")
    ax.set_ylabel("speedup over fb (epoch time)")
    g = sweep.get("graph", {})
    ax.set_title(f"Speedup over fb vs link rate ({g.get('servers', '?')} servers x {g.get('ranks_per_server', '?')} "
                 f"ranks, emulated)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return _save(fig, path)


def render_sweep(path, out_dir) -> dict:
    sweep = load_sweep(path)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    png = plot_sweep(sweep, os.path.join(out_dir, "speedup_vs_rate.png"))
    table = sweep_table(sweep)
    md = os.path.join(out_dir, "speedup_vs_rate.md")
    atomic_write_bytes(md, ("# Speedup over fb against link rate\n\n" + table + "\n\nFrom `" + os.fspath(path)
                            + "`.\n\n![speedup vs link rate](speedup_vs_rate.png)\n").encode())
    return {"table": table, "pngs": [png], "markdown": md}


@dataclass
class ReportOptions(Options):
    """`granndis report`'s options (granndis_hpc/options/ derives the parser and --config)."""
    run_dirs: List[str] = option([], positional=True, nargs="*", metavar="RUN_DIR",
                                 help="run directories written by granndis-train")
    sweep: Optional[str] = option(None, metavar="SWEEP_JSON",
                                  help="a link-rate sweep from bench/bench_cluster.py: plot speedup over fb against "
                                       "link rate")
    out: Optional[str] = option(None, help="output directory (default: the run directory when there is one run, "
                                           "else ./report)")

    def __post_init__(self):
        super().__post_init__()
        if self.sweep is not None and self.run_dirs:
            raise ConfigError("give either run directories or --sweep, not both")
        if self.sweep is None and not self.run_dirs:
            raise ConfigError("give one or more run directories (or --sweep SWEEP_JSON)")


REPORT_PROG = "granndis report"
REPORT_DESCRIPTION = "Plots and a comparison table for one or more granndis-train run directories."
REPORT_EPILOG = ("examples:\n  granndis report runs/fb-123 runs/flx-124 --out reports/cora\n"
                 "  granndis report --sweep bench-out/cluster/sweep.json --out reports/cluster")


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
