"""Reading and checking the run directories `granndis report` draws from, and matching each run with its
fb baseline.  A run directory holds config.json, summary.json and metrics.jsonl (the trainer writes them)
and, optionally, link.json (granndis_hpc/report/linkmodel.py: the link the run ran on, for the overlap limit
and the speedup-against-link-rate page)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Optional

from granndis_hpc.report import linkmodel
from granndis_hpc.registry import baseline_mode
from granndis_hpc.fsutil import read_json_object
from granndis_hpc.metric_names import METRICS, split_keys, summary_key
from granndis_hpc.metrics import MetricsError, read_metrics_lines, summarize, summary_fields

TIME_PHASES = (("compute", "compute"), ("intra_comm", "intra-server comm"), ("inter_comm", "inter-server comm"),
               ("grad_sync", "gradient sync"), ("sampling", "sampling"))
BYTE_CLASSES = (("intra_halo", "intra-server halo"), ("inter_halo", "inter-server halo"),
                ("intra_grad", "intra-server gradient"), ("inter_grad", "inter-server gradient"))
COMM_PHASES = ("intra_comm", "inter_comm", "grad_sync")


class ReportError(ValueError):
    """A run directory is missing a file or holds a malformed one; the message names both."""


@dataclass
class RunData:
    run_dir: str
    config: dict
    summary: dict
    metrics: list
    label: str = ""
    link: Optional[dict] = None  # link.json, when the run directory has one

    @property
    def name(self) -> str:
        """The run directory's own name (a sweep names its runs by configuration: fb, flx-k1, ...)."""
        return os.path.basename(os.path.normpath(self.run_dir))

    @property
    def method(self) -> str:
        head = self.summary.get("linear_layers") or 0  # per-vertex Linear layers among L
        return f"{self.summary['mode'].upper()} {self.summary['model']} L={self.summary['layers']}" + (
            f" ({head} Linear)" if head else "")

    @property
    def shape(self) -> tuple:
        s = self.summary
        return (s["model"], s["layers"], s.get("linear_layers") or 0, s["servers"], s["ranks_per_server"])

    @property
    def comm_s(self) -> float:
        return sum(self.summary["seconds_per_epoch"][k] for k in COMM_PHASES)


# ---------------------------------------------------------------------------------------------
# Loading and checking


def read_run_json(run_dir, name):
    return read_json_object(os.path.join(run_dir, name), ReportError, where=f"run {run_dir}: {name}",
                            not_found_hint=" (is this a granndis run directory, and did the run finish?)")


def check(obj, key, kinds, where, optional=False):
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
        check(summary, key, ["str"], where)
    for key in ("layers", "servers", "ranks_per_server", "epochs"):
        check(summary, key, ["int"], where)
    for key in ("epoch_time_s", "total_time_s"):
        check(summary, key, ["number"], where)
    seconds = check(summary, "seconds_per_epoch", ["dict"], where)
    for key, _ in TIME_PHASES:
        # sampling is absent from exact modes in older summaries: treat as zero
        if check(seconds, key, ["number"], where + " seconds_per_epoch", optional=key == "sampling") is None:
            seconds[key] = 0.0
    byte_counts = check(summary, "bytes_per_epoch", ["dict"], where)
    for key, _ in BYTE_CLASSES:
        check(byte_counts, key, ["number"], where + " bytes_per_epoch")
    # --metric (accuracy where the summary names none): its last values under summary_key(metric), kept
    # for the table as summary["accuracy"] when the metric is accuracy, else as summary[its key]
    metric = summary.get("metric", "accuracy")
    if metric not in METRICS:
        raise ReportError(f"{where}: 'metric' is {metric!r}, not one of {', '.join(METRICS)}")
    summary["metric"] = metric
    accuracy = check(summary, summary_key(metric), ["dict"], where, optional=True) or {}
    for key in ("train", "val", "test"):
        check(accuracy, key, ["number"], where + " " + summary_key(metric), optional=True)
    summary[summary_key(metric)] = accuracy
    best = check(summary, "best_val", ["dict"], where, optional=True)
    if best is not None:
        check(best, "epoch", ["int"], where + " best_val")
        for key in ("val", "test"):
            check(best, key, ["number"], where + " best_val")
    check(summary, "peak_memory_bytes", ["int"], where, optional=True)


def _read_metrics(run_dir):
    try:
        lines = read_metrics_lines(run_dir)
    except MetricsError as exc:
        raise ReportError(f"run {run_dir}: {exc}") from None
    records = []
    for number, record in lines:
        where = f"run {run_dir}: metrics.jsonl line {number}"
        check(record, "epoch", ["int"], where)
        for key in ("time_s", "loss"):
            check(record, key, ["number"], where)
        for metric in METRICS:
            for key in split_keys(metric).values():
                check(record, key, ["number"], where, optional=True)
        records.append(record)
    if not records:
        raise ReportError(f"run {run_dir}: metrics.jsonl has no epoch records")
    return records


def load_run(run_dir) -> RunData:
    """Read and check one run directory."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ReportError(f"run {run_dir}: not a directory")
    config = read_run_json(run_dir, "config.json")
    for key in ("mode", "model", "layers"):
        if key not in config:
            raise ReportError(f"run {run_dir}: config.json has no {key!r}")
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        summary = read_run_json(run_dir, "summary.json")
    else:  # running, stopped or failed: what its epochs so far say
        summary = unfinished_summary(run_dir, config)
    _check_summary(summary, f"run {run_dir}: summary.json")
    for key in ("mode", "model", "layers"):
        if config[key] != summary[key]:
            raise ReportError(f"run {run_dir}: config.json says {key}={config[key]!r} but summary.json says "
                              f"{summary[key]!r}; the files come from different runs")
    link = None
    if os.path.exists(linkmodel.link_path(run_dir)):
        link = linkmodel.check_link(read_run_json(run_dir, linkmodel.LINK_FILE),
                                    f"run {run_dir}: {linkmodel.LINK_FILE}", ReportError)
    return RunData(run_dir, config, summary, _read_metrics(run_dir), link=link)


def _job_shape(run_dir, config, records) -> tuple:
    """(servers, ranks per server) of a run without summary.json: from its shard set's manifest, else its
    records' per-server byte counts and --ranks-per-server."""
    manifest = {}
    try:
        with open(os.path.join(str(config.get("shards") or ""), "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        pass
    per_server = next((r["inter_bytes_per_server"] for r in records if isinstance(r.get("inter_bytes_per_server"),
                                                                                      list)), None)
    servers = manifest.get("servers") or (len(per_server) if per_server else None)
    ranks = config.get("ranks_per_server") or manifest.get("gpus_per_server")
    if not isinstance(servers, int) or not isinstance(ranks, int):
        raise ReportError(f"run {run_dir}: no summary.json, and neither its shard set nor its records say how many "
                          f"servers and ranks per server it ran on; report it when it has finished")
    return servers, ranks


def unfinished_summary(run_dir, config) -> dict:
    """summary.json's figures for a run that has not written one (running, stopped or failed), from the
    epochs metrics.jsonl holds so far; `status` says so and the table marks it."""
    records = _read_metrics(run_dir)
    servers, ranks = _job_shape(run_dir, config, records)
    metric = config.get("metric") if config.get("metric") in METRICS else "accuracy"
    keys = split_keys(metric)
    evaluated = [r for r in records if r.get(keys["val"]) is not None]
    accuracy = {split: evaluated[-1][key] for split, key in keys.items() if key in evaluated[-1]} if evaluated else {}
    best = max(evaluated, key=lambda r: r[keys["val"]], default=None)  # the earliest of equal values
    summary = summarize([summary_fields(r) for r in records], config, accuracy,
                        max((int(r.get("peak_memory_bytes", 0)) for r in records), default=0),
                        {"servers": servers, "ranks_per_server": ranks},
                        sum(float(r["time_s"]) for r in records), best=best, metric=metric)
    summary["status"] = f"unfinished: {len(records)} of {config.get('epochs', '?')} epochs (no summary.json)"
    return summary


def median_record(run) -> dict:
    """The epoch record of the median epoch (the one summary.json's per-phase seconds come from)."""
    return sorted(run.metrics, key=lambda r: r["time_s"])[(len(run.metrics) - 1) // 2]


def overlap_limit_s(run) -> Optional[float]:
    """The run's overlapped cost-model limit on its link (linkmodel.run_limit); None without link.json or
    per-server byte counts."""
    if run.link is None:
        return None
    try:
        return linkmodel.run_limit(run.summary, median_record(run), run.link, run.run_dir)
    except ValueError:
        return None


def assign_labels(runs):
    """Method names, made unique with the run directory's name where two runs share one."""
    counts = {}
    for run in runs:
        counts[run.method] = counts.get(run.method, 0) + 1
    for run in runs:
        run.label = run.method if counts[run.method] == 1 else f"{run.method} [{run.name}]"


# Options besides the shape (model, layers, servers, ranks per server) that change what an epoch costs
# or computes: a speedup against an fb run that differs in one of them is flagged.
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
    out, base = {}, baseline_mode()
    for i, run in enumerate(runs):
        fbs = [j for j, other in enumerate(runs) if other.summary["mode"].lower() == base and other.shape == run.shape]
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


def accuracy_over_time(run) -> list:
    """(seconds since launch, validation metric) at every evaluated epoch of a run: the run's start-up
    (summary.json's startup_s.total: process creation to the first epoch on the slowest rank; 0 where
    the run did not record it) plus the sum of the epoch times (metrics.jsonl's time_s, the slowest
    rank's) up to the end of that epoch.  Evaluation is left out, so runs evaluated at different
    intervals compare alike (the time-to-accuracy view of the GraNNDis paper's Figure 9); start-up is
    in, since a user waits for it too and it is most of a short run's wall time."""
    startup = (run.summary.get("startup_s") or {}).get("total") or 0.0
    seconds, points, key = float(startup), [], split_keys(run.summary.get("metric", "accuracy"))["val"]
    for record in sorted(run.metrics, key=lambda r: r["epoch"]):
        seconds += record["time_s"]
        if record.get(key) is not None:
            points.append((seconds, record[key]))
    return points


def loss_over_time(run) -> list:
    """(seconds since launch, training loss) at every epoch, on accuracy_over_time's clock."""
    seconds, points = float((run.summary.get("startup_s") or {}).get("total") or 0.0), []
    for record in sorted(run.metrics, key=lambda r: r["epoch"]):
        seconds += record["time_s"]
        points.append((seconds, record["loss"]))
    return points


def metric_label(runs) -> str:
    """The runs' metric as the report names it: "accuracy", "micro-f1", "rocauc", or "metric" for a mix."""
    metrics = {run.summary.get("metric", "accuracy") for run in runs}
    return metrics.pop() if len(metrics) == 1 else "metric"
