"""The PNGs of `granndis report`: time per phase, accuracy, learning rate, bytes per link class, and speedup over fb
against link rate.  matplotlib's object API on the Agg canvas: no pyplot, no global backend switch, no
display."""
from __future__ import annotations

from granndis_hpc.fsutil import atomic_path
from granndis_hpc.metric_names import split_keys
from granndis_hpc.report.data import BYTE_CLASSES, TIME_PHASES, accuracy_over_time, loss_over_time, metric_label

# Runs whose lines coincide (fb and flx are exact: the same losses and accuracies) stay visible: each run
# gets its own line style and marker shape, markers spaced so that at most MARKERS_PER_LINE show.
LINE_STYLES = ("-", "--", ":", "-.")
MARKER_SHAPES = ("o", "s", "^", "v", "D", "x", "+", "*")
MARKERS_PER_LINE = 12
MINUTES_AFTER_S = 600.0  # time-to-accuracy axis in minutes beyond this many seconds of training
LOG_SCALE_RATIO = 1e3  # bytes plot switches to log scale when the largest/smallest nonzero value exceed this


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


def run_style(i: int, n_points: int) -> dict:
    """matplotlib keywords of run i's line: a colour, a line style and a marker shape of its own."""
    return {"color": f"C{i % 10}", "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
            "marker": MARKER_SHAPES[i % len(MARKER_SHAPES)], "markersize": 4, "fillstyle": "none",
            "markevery": max(1, n_points // MARKERS_PER_LINE)}


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
    drawn = False
    for i, run in enumerate(runs):
        keys = split_keys(run.summary.get("metric", "accuracy"))  # --metric's values (accuracy by default)
        for key, style, name in ((keys["val"], "-", "val"), (keys["test"], "--", "test")):
            points = [(m["epoch"], m[key]) for m in run.metrics if m.get(key) is not None]
            if points:
                epochs, acc = zip(*points)
                look = run_style(i, len(points))
                look["linestyle"] = style
                ax.plot(epochs, acc, label=f"{run.label} {name}", **look)
                drawn = True
    if drawn:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no evaluated epochs in these runs", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("epoch")
    metric = metric_label(runs)
    ax.set_ylabel(metric)
    ax.set_title(f"Validation (solid) and test (dashed) {metric}")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_time_to_accuracy(runs, path):
    """Validation metric (left) and training loss (right) against the seconds since launch, one line per
    run (data.accuracy_over_time, data.loss_over_time): the loss has a point every epoch, so a run
    evaluated rarely still shows its course.  In minutes, as the paper's figure, once a run lasts more
    than MINUTES_AFTER_S seconds."""
    fig = _new_figure(11.0, 4.5)
    ax, ax_loss = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    curves = [(i, run, accuracy_over_time(run), loss_over_time(run)) for i, run in enumerate(runs)]
    longest = max((points[-1][0] for *_, points in curves if points), default=0.0)
    unit, scale = ("min", 60.0) if longest > MINUTES_AFTER_S else ("s", 1.0)
    for i, run, acc_points, loss_points in curves:
        for axis, points in ((ax, acc_points), (ax_loss, loss_points)):
            if points:
                seconds, values = zip(*points)
                axis.plot([t / scale for t in seconds], values, label=run.label, **run_style(i, len(points)))
    if any(points for _, _, points, _ in curves):
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no evaluated epochs in these runs", ha="center", va="center", transform=ax.transAxes)
    sparse = [run.label for _, run, points, _ in curves if 0 < len(points) < 3]
    if sparse:
        ax.text(0.02, 0.02, "evaluated at fewer than 3 epochs: " + ", ".join(sparse) + "\n(--eval-every N for more "
                                                                                       "points)",
                fontsize=7, transform=ax.transAxes, va="bottom")
    for axis in (ax, ax_loss):
        axis.set_xlabel(f"time since launch ({unit}): start-up + epochs")
        axis.grid(alpha=0.3)
    ax.set_ylabel(f"validation {metric_label(runs)}")
    ax.set_title("Time to accuracy")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_title("Training loss over time")
    return _save(fig, path)


def plot_learning_rate(runs, path):
    """The learning rate of every epoch (metrics.jsonl's lr: --lr-schedule with its warm-up and decays),
    on an axis from 0; where every run kept one constant rate, the plot says so instead of drawing flat
    lines on an axis zoomed onto rounding."""
    fig = _new_figure()
    ax = fig.add_subplot()
    series = [(i, run, [(m["epoch"], m["lr"]) for m in run.metrics if m.get("lr") is not None])
              for i, run in enumerate(runs)]
    rates = {lr for _, _, points in series for _, lr in points}
    if len(rates) == 1:
        ax.text(0.5, 0.5, f"constant learning rate {rates.pop():g} in every run", ha="center", va="center",
                transform=ax.transAxes)
    elif not rates:
        ax.text(0.5, 0.5, "no learning rate recorded in these runs", ha="center", va="center", transform=ax.transAxes)
    else:
        for i, run, points in series:
            if points:
                epochs, lr = zip(*points)
                ax.plot(epochs, lr, label=run.label, **run_style(i, len(points)))
        ax.set_ylim(bottom=0.0, top=max(rates) * 1.1)
        ax.legend(fontsize="small")
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    ax.set_title("Learning rate per epoch")
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


def sweep_x(rate) -> float:
    """Link rate in Mbit/s for the x axis: the configured one, or the measured one when unshaped."""
    bps = rate["rate_bps"] if rate.get("rate_bps") is not None else rate["bw_Bps"] * 8
    return bps / 1e6


def plot_sweep(sweep, path):
    rates = sorted(sweep["rates"], key=sweep_x)
    xs = [sweep_x(r) for r in rates]
    fig = _new_figure()
    ax = fig.add_subplot()
    base = sweep["baseline"]
    for i, m in enumerate(sweep["modes"]):
        if m == base:
            continue
        ys = [r["runs"][base]["epoch_s"] / r["runs"][m]["epoch_s"] for r in rates]
        ax.plot(xs, ys, marker="o", color=f"C{i % 10}", label=m)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label=f"{base} (= 1)")
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
