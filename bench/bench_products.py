"""The paper's products workload at products' size on the emulated 2 x 2 cluster (not a test).

    python bench/bench_products.py --work bench-out/products --out docs/performance/products.md  # root

A synthetic graph with ogbn-products' statistics (bench/products_ref.py PRODUCTS: 2.45 M vertices, ~62 M
directed edges, 100 features, 47 classes, the products split sizes; `--generator local`: power-law
degrees with locality) is built once by the distributed build with the products build preset
(configs/products.build.toml: inductive, self loops added, 3 hops), as two shard sets: the full 3-hop
preload (fb, flx, cob) and the EAS set (h = 1, f = 15).  Then, per stage (--stages, each recorded in
WORK/records.json so stages can run apart):

1. plan: `preprocess plan` of the same graph and model, its per-rank memory estimate of every mode; a
   mode whose 4 ranks would need more than --memory-budget is not trained (the page says so with the
   estimate; run a smaller --vertices, the largest that fits).
2. build: the two shard sets (kept and reused with --reuse-shards).
3. train: the AE setting (configs/products.toml: inductive, 3 SAGE + 1 Linear, LayerNorm, hidden 64)
   in fb, flx, eas and cob (one co-batch per epoch, fanout 25, the artifact's) on the emulated cluster
   (emucluster/, an instance of its own), one run per mode, back to back: every link is checked first
   (MPI ping-pong), then each run trains --epochs epochs at each rate in turn, the link re-shaped
   between them (a products-size run spends minutes reading its shards and in its final evaluation;
   one run per rate would repeat both).  Per rate: median epoch time over its epochs but the first,
   and its breakdown (metrics.jsonl), exact ledger bytes; per run: every rank's peak RSS (VmHWM,
   polled) and the final evaluation's time (the train-, train+validation-induced and full graph).
   With the evaluate stage: one timed evaluation pass over the full graph (bench/products_ref.py
   evaluate) with fb's trained model, at the first rate.
4. reference: the training graph in one process, plain torch CSR SAGE (bench/products_ref.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time

from harness import ENV, REPO, own_instance, Watcher  # noqa: E402
from bench_scale import MemoryGuard, add_run_arguments, save_records, sweep_records  # noqa: E402
from products_ref import PRODUCTS, graph_args  # noqa: E402
import products_page  # noqa: E402

from emucluster import cluster as emucluster, costmodel  # noqa: E402

SETS = {"full": ["--preload", "full"], "eas": ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"]}
# mode -> (shard set, train arguments, `preprocess plan`'s label of its estimate)
MODES = {"fb": ("full", ["--mode", "fb"], "fb"),
         "flx": ("full", ["--mode", "flx"], "flx k=3"),
         "eas": ("eas", ["--mode", "eas"], "eas"),
         "cob": ("full", ["--mode", "cob", "--batches-per-epoch", "1", "--fanout", "25"], "cob batches=1")}
EMU_MPIRUN = os.path.join(REPO, "emucluster", "emu-mpirun")


def run(cmd, log, timeout, capture=False):
    """`cmd` under `timeout`, stopped with this driver (emucluster.run_bounded); raises on failure."""
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    log.append(" ".join(cmd).replace(REPO + os.sep, ""))
    p = emucluster.run_bounded(["timeout", "--kill-after=15", str(int(timeout)), *cmd], env=dict(os.environ, **ENV),
                               capture=capture, cwd=REPO)
    if p.returncode != 0:
        tail = ((p.stdout or "") + (p.stderr or ""))[-3000:] if capture else ""
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{tail}")
    return p


class RankPeaks(Watcher):
    """Every rank's peak RSS (VmHWM of /proc/PID/status) of the processes whose command line holds
    `marker`, polled every second while a job runs; the rank is the process's OMPI_COMM_WORLD_RANK."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker, self.peaks = marker, {}

    def poll(self) -> bool:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.marker.encode() not in f.read():
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                if b"OMPI_COMM_WORLD_RANK" not in env:  # mpirun / the launcher itself
                    continue
                with open(f"/proc/{pid}/status") as f:
                    hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
            except (OSError, StopIteration):  # the process ended meanwhile
                continue
            rank = int(env[b"OMPI_COMM_WORLD_RANK"])
            self.peaks[rank] = max(self.peaks.get(rank, 0), hwm)
        return False


def stage_plan(args, records, path, log):
    out = os.path.join(args.work, "plan.json")
    # --hops 3 (configs/products.build.toml's layers): the estimates of the two sets the runs read, the
    # full 3-hop set (fb, flx, cob) and the EAS set (eas).
    run(["mpirun", "-n", "2", sys.executable, "-m", "granndis_hpc.preprocess", "plan", "--config",
         "configs/products.build.toml",
         *graph_args(args.vertices), "--servers", "2", "--gpus-per-server", "2", "--device", "cpu", "--hops", "3",
         "--cob-batches", "1", "--cob-fanout", "25", "--json", out], log, args.timeout)
    with open(out) as f:
        plan = json.load(f)
    by_label = {(o["label"], o["source"]): o for o in plan["options"]}
    sources = {"full": "--hops 3", "eas": "--preload eas"}
    records["plan"] = {m: {"label": lab, "peak_bytes": o["peak_bytes"], "peak_rank": o["peak_rank"],
                           "breakdown": o["breakdown"], "inter_server_bytes": o["inter_server_bytes"]}
                       for m, (name, _, lab) in MODES.items() for o in [by_label.get((lab, sources[name]))] if o}
    records["plan_partition"] = plan.get("partition")
    save_records(path, records)


def shard_dir(args, name):
    return os.path.join(args.work, f"shards-{name}")


def stage_build(args, records, path, log):
    for name, extra in SETS.items():
        out = shard_dir(args, name)
        cmd = ["mpirun", "-n", "2", sys.executable, "-m", "granndis_hpc.preprocess", "build", "--config",
               "configs/products.build.toml",
               *graph_args(args.vertices), "--servers", "2", "--gpus-per-server", "2", *extra, "--out", out,
               "--overwrite"]
        if args.reuse_shards and os.path.exists(os.path.join(out, "manifest.json")):  # the caller's word: same graph
            log.append(f"{' '.join(map(str, cmd))}   # reused: already built".replace(REPO + os.sep, ""))
            continue
        t = time.perf_counter()
        run(cmd, log, args.timeout)
        records["builds"][name] = {"wall_s": time.perf_counter() - t}
        save_records(path, records)


def graph_record(args):
    """The built graph's sizes, from the full set's manifest."""
    with open(os.path.join(shard_dir(args, "full"), "manifest.json")) as f:
        ds = json.load(f)["dataset"]
    keys = ("num_vertices", "num_edges", "num_features", "num_classes", "content_sha256")
    return {k: ds.get(k) for k in keys}


def fits(args, records, mode):
    """(fits, 4-rank estimate in bytes) of a mode by `plan`'s estimate and --memory-budget."""
    est = records.get("plan", {}).get(mode, {}).get("peak_bytes")
    return (est is None or 4 * est <= args.memory_budget * 2**30), est


class Reshaper(Watcher):
    """Watches a run's metrics.jsonl and re-shapes the link to the next rate after every `per_rate`
    epochs, so one run measures every rate (a products-size run's start-up and final evaluation take
    minutes; one run per rate would repeat them).  `seen`: when each epoch's line appeared (wall clock)."""

    interval = 0.1

    def __init__(self, metrics, rates, per_rate):
        super().__init__()
        self.metrics, self.rates, self.per_rate, self.seen = metrics, rates, per_rate, []

    def __enter__(self):
        emucluster.shape(emucluster.parse_rate(self.rates[0]))
        return super().__enter__()

    def poll(self) -> bool:
        try:
            with open(self.metrics) as f:
                n = sum(1 for line in f if line.strip())
        except OSError:
            return False
        while len(self.seen) < n:
            self.seen.append(time.time())
            k = len(self.seen) // self.per_rate
            if len(self.seen) % self.per_rate == 0 and k < len(self.rates):
                emucluster.shape(emucluster.parse_rate(self.rates[k]))
        return False


def train_one(args, records, mode, log):
    """One run of `mode` over every rate (Reshaper): {rate label: that rate's record}.  The first epoch
    at each rate is left out of its median (the first of the run pays one-off costs, a later one may
    have started before the link changed)."""
    name, extra, _ = MODES[mode]
    run_dir = os.path.join(args.work, "runs", mode)
    shutil.rmtree(run_dir, ignore_errors=True)
    ok, est = fits(args, records, mode)
    over = None if ok else (f"plan estimates {est / 2**30:.2f} GiB per rank, 4 ranks > --memory-budget "
                            f"{args.memory_budget} GiB")
    if over and not args.over_estimate:
        return {label: {"error": f"not run: {over}"} for label in args.rates}
    t, load = time.perf_counter(), os.getloadavg()[0]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    out = {}
    with MemoryGuard(args.min_available_gib) as guard, RankPeaks(run_dir) as peaks, \
            Reshaper(metrics, args.rates, args.epochs) as reshaper:
        try:
            run([EMU_MPIRUN, "-n", "4", "--emu-timeout", args.run_timeout, sys.executable, "-m", "granndis_hpc.cli",
                 "train", "--config", "configs/products.toml", "--shards", shard_dir(args, name), *extra,
                 "--epochs", args.epochs * len(args.rates), "--eval-every", "0", "--quiet", "--out", run_dir],
                log, args.run_timeout + 60)
            with open(metrics) as f:
                recs = [json.loads(line) for line in f if line.strip()]
            with open(os.path.join(run_dir, "summary.json")) as f:
                summary = json.load(f)
            # The last epoch's line is written after the final evaluation (three passes: the train-,
            # the train+validation-induced and the full graph): its delay over the epoch is that evaluation.
            seen = reshaper.seen
            final_eval = seen[-1] - seen[-2] - recs[-1]["time_s"] if len(seen) >= 2 else None
            for k, label in enumerate(args.rates):
                part = recs[k * args.epochs:(k + 1) * args.epochs]
                out[label] = dict(costmodel.summarize_run(part), first_epoch_s=part[0]["time_s"],
                                  accuracy=summary.get("accuracy"), protocol=summary.get("protocol"),
                                  peak_rss_max=summary["peak_memory_bytes"], final_evaluation_s=final_eval)
        except RuntimeError as exc:  # recorded; the next run goes on
            out = {label: {"error": str(exc).splitlines()[0][:300]} for label in args.rates}
    for label in args.rates:
        rec = out.setdefault(label, {"error": "no record"})
        if guard.fired is not None:
            rec["error"] = (f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < "
                            f"{args.min_available_gib} GiB")
        if over:
            rec["over_estimate"] = over + " (run under the memory guard, --over-estimate)"
        rec.update(peak_rss=[peaks.peaks.get(r, 0) for r in range(4)], estimate=est,
                   run_wall_s=time.perf_counter() - t, loadavg_start=load, run_dir=run_dir)
    return out


def stage_evaluate(args, records, path, log, label):
    model = os.path.join(args.work, "runs", "fb")
    out = os.path.join(args.work, "evaluate.json")
    with RankPeaks("products_ref.py") as peaks:
        run([EMU_MPIRUN, "-n", "4", "--emu-timeout", args.run_timeout, sys.executable,
             os.path.join(REPO, "bench", "products_ref.py"), "evaluate", "--shards", shard_dir(args, "full"),
             "--model", model, "--out", out], log, args.run_timeout + 60)
    with open(out) as f:
        records["evaluate"] = dict(json.load(f), rate=label,
                                   polled_peak_rss=[peaks.peaks.get(r, 0) for r in range(4)])
    save_records(path, records)


def stage_train(args, records, path, log):
    emucluster.preflight()
    os.environ.update(ENV)  # the self-check's mpirun reads os.environ (root needs OMPI_ALLOW_RUN_AS_ROOT)
    emucluster.install_signal_teardown()
    records["graph"] = graph_record(args)
    rounds = []
    try:
        emucluster.setup(2, None, quiet=True)
        log.append("emucluster/emu-cluster --instance prod setup --servers 2")
        for label in args.rates:  # every link checked before the runs
            bps = emucluster.parse_rate(label)
            emucluster.shape(bps)
            log.append(f"emucluster/emu-cluster --instance prod shape --rate {label} && "
                       "emucluster/emu-cluster --instance prod selfcheck")
            pp = emucluster.selfcheck(2, python=sys.executable)
            print(emucluster.format_selfcheck(pp), flush=True)
            if pp["fatal"]:
                raise RuntimeError(f"{label}: the emulated link is not what it should be: {'; '.join(pp['problems'])}")
            # A link slower than its rate on a busy machine (CPU-starved TCP) is kept, and said on the page.
            rounds.append({"label": label, "rate_bps": bps, "bw_Bps": pp["inter_Bps"]["1"],
                           "loadavg": os.getloadavg()[0], "link_problems": pp["problems"], "runs": {}})
        records["train"] = rounds
        log.append(f"(each run re-shapes the link to the next of {', '.join(args.rates)} after every "
                   f"{args.epochs} epochs)")
        for mode in args.modes:
            per_rate = train_one(args, records, mode, log)
            for rnd in rounds:
                rnd["runs"][mode] = per_rate[rnd["label"]]
            print(mode, json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("layer_compute", "layer_counts")}
                                    for k, v in per_rate.items()}), flush=True)
            save_records(path, records)
        if "evaluate" in args.stages and "error" not in rounds[0]["runs"].get("fb", {"error": 1}):
            emucluster.shape(rounds[0]["rate_bps"])
            stage_evaluate(args, records, path, log, rounds[0]["label"])
    finally:
        emucluster.teardown(quiet=True)


def stage_reference(args, records, path, log):
    out = os.path.join(args.work, "reference.json")
    run([sys.executable, os.path.join(REPO, "bench", "products_ref.py"), "reference", "--vertices", args.vertices,
         "--epochs", args.epochs - 1, "--out", out], log, args.timeout)
    with open(out) as f:
        records["reference"] = json.load(f)
    save_records(path, records)


def main(argv=None):
    own_instance("prod", "10.215.0")  # never touches a cluster another job set up
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=PRODUCTS["vertices"],
                   help="graph size (the other statistics scale with it; smaller where the full size does not fit)")
    p.add_argument("--epochs", type=int, default=3,
                   help="per rate (a run has this many for each of --rates); the first at each rate is left out")
    p.add_argument("--rates", default="1gbit,100mbit", help="link rates, in this order within every run")
    p.add_argument("--modes", default="fb,flx,eas,cob", help=f"from {', '.join(MODES)}; fb first (the baseline)")
    p.add_argument("--stages", nargs="*", default=["plan", "build", "train", "evaluate", "reference"],
                   choices=("plan", "build", "train", "evaluate", "reference"),
                   help="what to run (evaluate runs inside train's first round); none: rewrite --out from records")
    p.add_argument("--memory-budget", type=float, default=15.0,
                   help="GiB the 4 ranks of one run may use by plan's estimate; a mode above it is not run")
    p.add_argument("--over-estimate", action="store_true",
                   help="run a mode over --memory-budget by plan's estimate anyway, stopped by the memory guard "
                        "if the machine runs short (plan's estimate is not a bound: measured within 25 %% of the "
                        "peak resident memory per rank, docs/performance/products.md)")
    add_run_arguments(p, 1800, 900, "seconds per build, plan or reference")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "products"))
    p.add_argument("--out", default=os.path.join(REPO, "bench-out", "products", "products.md"))
    p.add_argument("--results", default=None,
                   help="also copy the records (JSON) here, e.g. bench/results/products.json")
    args = p.parse_args(argv)
    path, records, log = sweep_records(p, args, MODES)
    started = time.monotonic()
    for stage in args.stages:
        if stage != "evaluate":  # evaluate runs inside train, on its first round's link
            {"plan": stage_plan, "build": stage_build, "train": stage_train,
             "reference": stage_reference}[stage](args, records, path, log)
    records.update(date=str(datetime.date.today()), vertices=args.vertices, epochs=args.epochs,
                   loadavg_end=list(os.getloadavg()))
    records.setdefault("wall_s", {})[" ".join(args.stages)] = time.monotonic() - started
    save_records(path, records)
    page = products_page.render(records, argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    text = products_page.keep_reading(page, args.out)  # read before the page is rewritten
    with open(args.out + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.out + ".tmp", args.out)
    if args.results:
        shutil.copy(path, args.results)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
