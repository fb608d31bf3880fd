"""Run-directory outputs: the per-epoch line users of PipeGCN/GraNNDis know, metrics.jsonl, summary.json.

Imports no torch, so that `granndis report` reads runs without it (best-model.pt: rundir/best_model.py;
peak memory: engine/peakmem.py)."""
from __future__ import annotations

import json
import os
import statistics
from typing import Dict, List, Optional, Tuple

from granndis_hpc.fsutil import atomic_write_bytes, atomic_write_json
from granndis_hpc.metric_names import metric_of_record, shown, split_keys, summary_key

METRICS_FILE = "metrics.jsonl"


class MetricsError(ValueError):
    """metrics.jsonl is missing, unreadable or holds a line that is not a JSON object."""


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS (an ETA)."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def epoch_line(rec: Dict, eta_s: Optional[float] = None) -> str:
    """The per-epoch line: PipeGCN's and the GraNNDis artifact's fields, then the learning rate the epoch
    trained with and, where given, the time the remaining epochs are expected to take."""
    # Time is the slowest rank's epoch; Comm (halo exchange) and Reduce (gradient all-reduce) are that
    # rank's own parts of it, so they never add up to more than the epoch.
    line = (f"Epoch {rec['epoch']:05d} | Time(s) {rec['time_s']:.4f} | "
            f"Comm(s) {rec['intra_comm_s'] + rec['inter_comm_s']:.4f} | Reduce(s) {rec['grad_sync_s']:.4f} | "
            f"Loss {rec['loss']:.4f}")
    metric = metric_of_record(rec)  # evaluated epochs hold the --metric's values
    if metric is not None:
        keys, name = split_keys(metric), shown(metric)
        line += "".join(f" | {split.capitalize()} {name} {rec[keys[split]]:.4f}" for split in ("train", "val", "test"))
    if rec.get("lr") is not None:
        line += f" | LR {rec['lr']:.3g}"
    if eta_s is not None:
        line += f" | ETA {clock(eta_s)}"
    return line


class MetricsWriter:
    """Rank 0's writer: appends one JSON line per epoch, each with one unbuffered write (so a killed job
    keeps its epochs).  A write that fails (a full disk) is cut back to the end of the previous line, so
    the file never ends with half a record; the OSError propagates."""

    def __init__(self, run_dir: str, append: bool = False):
        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, METRICS_FILE)
        if os.path.isdir(self.path):
            raise IsADirectoryError(21, "is a directory, not the run's metrics file", self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o666)

    def write(self, rec: Dict) -> None:
        data = (json.dumps(rec, sort_keys=True) + "\n").encode()
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_metrics_lines(run_dir: str, skip_bad_lines: bool = False,
                       missing_ok: bool = False) -> List[Tuple[int, Dict]]:
    """(line number, record) of every record of RUN_DIR/metrics.jsonl: the one reader of that file
    (the trainer on resume, `granndis report`, tests).  Blank lines are skipped.  A line that is not a
    JSON object is a MetricsError naming it, or skipped with `skip_bad_lines` (resuming after a kill,
    whose last line may be cut short).  A missing file is a MetricsError, or no records with
    `missing_ok` (a run stopped before its first epoch has none yet)."""
    path = os.path.join(os.fspath(run_dir), METRICS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise MetricsError(f"{METRICS_FILE} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"{METRICS_FILE} cannot be read: {exc}") from None
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if skip_bad_lines:
                continue
            raise MetricsError(f"{METRICS_FILE} line {number} is not valid JSON ({exc}); was the file cut short?") \
                from None
        if not isinstance(record, dict):
            if skip_bad_lines:
                continue
            raise MetricsError(f"{METRICS_FILE} line {number} must be a JSON object")
        out.append((number, record))
    return out


def read_metrics(run_dir: str) -> List[Dict]:
    return [record for _, record in read_metrics_lines(run_dir)]


def truncate_metrics(run_dir: str, epoch: int, note=None) -> List[Dict]:
    """Keep the records of epochs before `epoch` (those a checkpoint after `epoch` epochs includes) and
    drop the rest, so a resumed run appends without duplicates.  Rewritten atomically (a crash leaves
    the old file or the new one); returns the kept records.

    Damage is never dropped silently: a last line cut short (a kill, a full disk)
    is repaired, saying so through `note`; a damaged line before it, or an epoch missing from the
    records the checkpoint includes, is a MetricsError naming the lines, since cutting them would lose
    records.  An empty file is damage too (its records were lost); a file deleted on purpose (the
    way to continue without the old records) is said in one line."""
    path = os.path.join(os.fspath(run_dir), METRICS_FILE)
    if os.path.isdir(path):
        raise MetricsError(f"{path} is a directory, not the run's metrics file; move it away and resume again")
    lines, exists = [], True
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        exists = False
    except OSError as exc:
        raise MetricsError(f"{path} cannot be read: {exc}") from None
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    kept, bad = [], []
    for number, line in numbered:
        try:
            rec = json.loads(line.decode("utf-8"))
            if not isinstance(rec, dict) or isinstance(rec.get("epoch"), bool) or not isinstance(rec.get("epoch"), int):
                raise ValueError("not an epoch record")
        except ValueError:  # UnicodeDecodeError and json's errors are ValueErrors
            bad.append(number)
            continue
        if rec["epoch"] < epoch:
            kept.append(rec)
    last = numbered[-1][0] if numbered else None
    damaged = [n for n in bad if n != last]
    epochs = [rec["epoch"] for rec in kept]
    missing = sorted(set(range(epoch)) - set(epochs)) if exists else []
    if damaged or missing:
        what = []
        if damaged:
            what.append(f"line(s) {', '.join(map(str, damaged[:5]))}{', ...' if len(damaged) > 5 else ''} are not "
                        f"epoch records")
        if missing:
            what.append("the records of epoch(s) "
                        f"{', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''} "
                        f"(before the checkpoint, after {epoch} epochs) are missing")
        raise MetricsError(f"{path}: {'; '.join(what)}: resuming would lose records; restore the file (or delete "
                           f"it to continue without the old records) and resume again")
    if not exists and epoch > 0 and note is not None:
        note(f"{path} is missing: the records of the {epoch} epoch(s) before the checkpoint are not kept; "
             f"the run continues from its checkpoint and the file holds the epochs from {epoch} on")
    if bad and note is not None:
        note(f"{path}: line {bad[0]}, the last, was cut short (the job was killed or the disk was full "
             f"while it was written); dropped it, the run continues from its checkpoint")
    text = "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in kept)
    atomic_write_bytes(path, text.encode())
    return kept


# What summarize reads of an epoch record.  The run keeps only these per epoch (summary_fields): whole
# records (cob's per-rank rows accounting on rank 0 above all) grew rank 0's memory by ~6.6 KB per
# epoch; they are in metrics.jsonl.
SUMMARY_FIELDS = ("epoch", "time_s", "compute_s", "intra_comm_s", "inter_comm_s", "grad_sync_s", "sampling_s",
                  "bytes", "activation_memory_bytes")


def summary_fields(rec: Dict) -> Dict:
    return {k: rec[k] for k in SUMMARY_FIELDS if k in rec}


def summarize(records: List[Dict], config: Dict, accuracy: Optional[Dict], peak_memory: int,
              topology: Dict, total_time_s: float, best: Optional[Dict] = None, metric: str = "accuracy") -> Dict:
    """summary.json: medians over epochs (epoch time is already the slowest rank's).  `accuracy` is the
    last evaluation's values of `metric` (--metric; under "accuracy", "micro_f1" or "rocauc"); `best`
    the best-validation epoch's record (None: none was evaluated), whose test value is what published
    results report (Kipf & Welling, PyG's examples)."""
    keys = split_keys(metric)
    # The per-phase seconds are those of the median epoch (the lower one of an even count), whose parts
    # add up to its time: medians taken part by part need not add up to anything.
    typical = sorted(records, key=lambda r: r["time_s"])[(len(records) - 1) // 2] if records else None

    def part(key):
        return float(typical.get(key, 0.0)) if typical is not None else 0.0

    def med_bytes(key):
        vals = [r["bytes"][key] for r in records]
        return int(statistics.median(vals)) if vals else 0

    return {
        "mode": config["mode"], "model": config["model"], "layers": config["layers"],
        # per-vertex Linear layers among `layers` (--linear-layers; 0: none)
        "linear_layers": int(config.get("linear_layers") or 0),
        # what the model trained and was evaluated on (--inductive: engine/inductive.py)
        "protocol": "inductive" if config.get("inductive") else "transductive",
        "servers": topology["servers"], "ranks_per_server": topology["ranks_per_server"],
        # which machine each server was (and whether servers were emulated on one): a job's record
        "hosts": list(topology.get("hosts", ())), "emulated_servers": bool(topology.get("emulated", False)),
        "epochs": len(records),
        # The median epoch itself (the lower one of an even count), so that the parts below add up to it:
        # the mean of the two middle epochs (statistics.median) did not (`make demo`'s 10 epochs: 1.6287 s
        # against parts summing to 1.6210 s).
        "epoch_time_s": part("time_s"),
        # The slowest rank's own parts of that epoch.
        "seconds_per_epoch": {"compute": part("compute_s"), "intra_comm": part("intra_comm_s"),
                              "inter_comm": part("inter_comm_s"), "grad_sync": part("grad_sync_s"),
                              "sampling": part("sampling_s")},
        "bytes_per_epoch": {k: med_bytes(k) for k in ("intra_halo", "inter_halo", "intra_grad", "inter_grad")},
        "metric": metric,
        summary_key(metric): accuracy or {},
        # the chosen metric's values at the best-validation epoch
        "best_val": None if best is None else {"epoch": int(best["epoch"]),
                                               **{split: float(best[key]) for split, key in keys.items()}},
        "peak_memory_bytes": int(peak_memory),
        "activation_memory_bytes": int(max((r.get("activation_memory_bytes", 0) for r in records), default=0)),
        "total_time_s": float(total_time_s),
    }


def write_summary(run_dir: str, summary: Dict) -> str:
    path = os.path.join(run_dir, "summary.json")
    atomic_write_json(path, summary)
    return path
