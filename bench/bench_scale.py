"""Products-size benchmark: the 2.45M-vertex build and one epoch per mode on it (not a test).

    python bench/bench_scale.py --work bench-out/scale --out bench-out/scale.md

1. build: two shard sets of the `--generator local` graph (2.45M vertices, ~54.5M directed edges) with
   ParMETIS on 2 ranks, each in a fresh `mpirun -n 2` job (bench/bench_preprocess.py's run_config):
   full 3-hop preload (fb, flx) and EAS h=1 f=15 (eas).  Per build: wall time, the phase log, peak RSS
   and CPU seconds of each rank (getrusage), load average at start and end.
2. verify: `granndis preprocess verify` on each set (wall, peak RSS).
3. train: fb, flx k=3 (= L), flx k=2 and k=1 (`--preloaded-layers`, k < L on the 3-hop set) and eas,
   3-layer SAGE, hidden 64, 2 emulated servers x 2 ranks (`mpirun -n 4`, one machine), --epochs 2;
   the table reports the LAST epoch's record of metrics.jsonl (the first one pays one-off costs).

Every stage appends its records to WORK/records.json, so stages can run separately (`--stages build`,
then `--stages verify train`) and the page is written from everything recorded so far.  --clean
deletes WORK's shard sets and runs at the end.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

from bench_preprocess import run_config
from harness import ENV, REPO, Watcher, mib, train, write_page

# (name, shard set, mode, extra train arguments)
RUNS = (("fb", "full", "fb", []),
        ("flx k=3", "full", "flx", []),
        ("flx k=2", "full", "flx", ["--preloaded-layers", "2"]),
        ("flx k=1", "full", "flx", ["--preloaded-layers", "1"]),
        ("eas", "eas", "eas", []))
VERIFY = ("import json, resource, sys, time; from granndis_hpc.preprocess.__main__ import main; t = "
          "time.perf_counter(); "
          "rc = main(['verify', sys.argv[1]]); ru = resource.getrusage(resource.RUSAGE_SELF); "
          "print('BENCH ' + json.dumps({'rc': rc, 'wall_s': time.perf_counter() - t, 'peak_rss_mib': "
          "ru.ru_maxrss / 1024, 'cpu_s': ru.ru_utime + ru.ru_stime}))")


def load_records(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"builds": {}, "verify": {}, "train": {}}


def add_run_arguments(parser, timeout: int, run_timeout: int, timeout_help: str) -> None:
    """The options every link-rate sweep takes for its runs: the memory guard, reused shard sets, timeouts."""
    parser.add_argument("--min-available-gib", type=float, default=1.5,
                        help="stop a training run when the machine's MemAvailable falls below this")
    parser.add_argument("--reuse-shards", action="store_true", help="keep shard sets already built in --work")
    parser.add_argument("--timeout", type=int, default=timeout, help=timeout_help)
    parser.add_argument("--run-timeout", type=int, default=run_timeout, help="seconds per training run")


def sweep_records(parser, args, modes, fb_first=True):
    """A link-rate sweep's arguments checked (fb first unless fb_first is False, at least 2 epochs: the
    first is left out; --rates and --modes as lists) and its records in --work: (path, records, log of
    every command run)."""
    args.rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if (fb_first and args.modes[:1] != ["fb"]) or not args.modes or any(m not in modes for m in args.modes):
        parser.error(f"--modes: start with fb (the baseline), then any of {', '.join(modes)}")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is left out)")
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "records.json")
    records = load_records(path)
    return path, records, records.setdefault("log", [])  # saved with the records after each stage


def save_records(path, records):
    with open(path + ".tmp", "w") as f:
        json.dump(records, f, indent=1)
    os.replace(path + ".tmp", path)


def shard_dir(records, kind):
    return records["builds"][kind]["out"]


def stage_build(args, records, path):
    for kind in ("full", "eas"):
        rec = run_config(args.vertices, kind, "parmetis", 2, args.work, args.timeout, "local", keep=True)
        records["builds"][kind] = rec
        save_records(path, records)
        print(json.dumps(rec), flush=True)


def stage_verify(args, records, path):
    for kind in ("full", "eas"):
        res = subprocess.run([sys.executable, "-c", VERIFY, shard_dir(records, kind)], cwd=REPO, env=ENV,
                             capture_output=True, text=True)
        rec = {"stdout": res.stdout[-2000:], "rc": res.returncode}
        for line in res.stdout.splitlines():
            if line.startswith("BENCH "):
                rec.update(json.loads(line[6:]))
        records["verify"][kind] = rec
        save_records(path, records)
        print(kind, json.dumps(rec), flush=True)


class MemoryGuard(Watcher):
    """Stops this driver's training job (its child `mpirun`, which stops its ranks) when the machine's
    MemAvailable falls under `min_gib`, before the kernel's OOM killer picks a process of another job
    on a shared machine.  `fired`: the MemAvailable (GiB) that triggered it, else None."""

    def __init__(self, min_gib: float):
        super().__init__()
        self.min_gib, self.fired = float(min_gib), None

    def poll(self) -> bool:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 2**20
        if avail >= self.min_gib:
            return False
        self.fired = avail
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            for pid in f.read().split():
                os.kill(int(pid), signal.SIGTERM)
        return True


def stage_train(args, records, path):
    common = ["--model", "sage", "--layers", "3", "--hidden", str(args.hidden), "--epochs", str(args.epochs),
              "--eval-every", "0"]
    by_name = {r[0]: r for r in RUNS}
    for name in args.runs or by_name:  # in the order given
        _, kind, mode, extra = by_name[name]
        log, load = [], os.getloadavg()[0]
        t0 = time.perf_counter()
        with MemoryGuard(args.min_available_gib) as guard:
            try:
                summary, recs = train(shard_dir(records, kind), mode,
                                      os.path.join(args.work, "runs", name.replace(" ", "")), common + extra, log)
                rec = {"summary": summary, "first_epoch": recs[0], "last_epoch": recs[-1], "epochs": len(recs)}
            except subprocess.CalledProcessError as exc:  # record it, keep going with the next run
                rec = {"error": f"exit status {exc.returncode}"}
        if guard.fired is not None:
            rec["error"] = (f"stopped by the memory guard: MemAvailable {guard.fired:.2f} GiB < "
                            f"{args.min_available_gib} GiB")
        rec.update(command=log[0], wall_s=time.perf_counter() - t0, loadavg_start=load, loadavg_end=os.getloadavg()[0])
        records["train"][name] = rec
        save_records(path, records)
        print(name, json.dumps({k: v for k, v in rec.items() if k != "summary"}), flush=True)


def page(args, records):
    b, lines = records["builds"], []
    lines += [f"## Results ({datetime.date.today()}, written by bench/bench_scale.py)", "",
              f"Machine: {os.cpu_count()} cores, "
              f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
              f"GiB, no GPU, Python {platform.python_version()}, shared with other jobs (load averages below). "
              "Wall times are this machine's under that load; CPU seconds per rank say what an idle core per rank "
              "would take. Peak RSS does not depend on the load.", ""]
    if b:
        lines += ["### Build: ParMETIS on 2 ranks (`mpirun -n 2`), 2 servers x 2 GPUs, 3 layers", "",
                  "| shard set | vertices | directed edges | wall (s) | load | partition | halos+write | commit | "
                  "CPU s / rank | peak RSS / rank (MiB) | load avg start / end | edge cut | rows/vertex | shards "
                  "(MiB) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|"]
        for kind, r in b.items():
            if "error" in r:
                lines.append(f"| {kind} | {r['vertices']:,} | | failed: see records.json | | | | | | | | | | |")
                continue
            lines.append(
                f"| {kind} | {r['vertices']:,} | {r['edges']:,} | {r['wall_s']:.0f} | {r.get('load_s', 0):.0f} | "
                f"{r.get('partition_s', 0):.0f} | {r.get('halos+write_s', 0):.0f} | {r.get('commit_s', 0):.1f} | "
                f"{' / '.join(f'{c:.0f}' for c in r['cpu_s'])} | {' / '.join(f'{p:,.0f}' for p in r['peak_rss_mib'])} "
                "| "
                f"{r['loadavg_start']:.1f} / {r['loadavg_end']:.1f} | {100 * r['edge_cut_fraction']:.2f} % | "
                f"{r['replication']:.3f} | {r['shard_mib']:,.0f} |")
        lines += ["", "Phase logs (rank 0):", ""]
        for kind, r in b.items():
            lines += [f"{kind}: `{r['command']}`", "", "```", *r.get("phase_log", []), "```", ""]
    if records["verify"]:
        lines += ["### Verify (`granndis preprocess verify`, one process)", "",
                  "| shard set | result | wall (s) | CPU s | peak RSS (MiB) |", "|---|---|---:|---:|---:|"]
        for kind, r in records["verify"].items():
            ok = "OK" if r.get("rc") == 0 else f"FAILED (rc {r.get('rc')})"
            lines.append(f"| {kind} | {ok} | {r.get('wall_s', 0):.0f} | {r.get('cpu_s', 0):.0f} | "
                         f"{r.get('peak_rss_mib', 0):,.0f} |")
        lines.append("")
    if records["train"]:
        lines += [f"### One epoch per mode: 3-layer SAGE, hidden {args.hidden}, 2 emulated servers x 2 ranks "
                  "(`mpirun -n 4`, GRANNDIS_RANKS_PER_SERVER=2 on one machine)", "",
                  "Numbers of the last epoch's metrics.jsonl record (*epoch* says which): epoch "
                  "time of the slowest rank and its breakdown (*epoch 1* is the first epoch's time, which builds "
                  "the cached normalised adjacencies), bytes per link class summed over the ranks (exact "
                  "ledger counts), peak RSS of the largest rank (includes the test-accuracy evaluation after the "
                  "last epoch). *run wall* is the whole `mpirun` (start-up, reading the shards, both epochs, "
                  "evaluation).", "",
                  "| run | epoch | epoch (s) | epoch 1 (s) | compute (s) | intra comm (s) | inter comm (s) | grad "
                  "sync (s) | intra halo (B) | "
                  "inter halo (B) | intra grad (B) | inter grad (B) | peak RSS / rank (MiB) | test acc | run wall (s) "
                  "| "
                  "load avg start / end |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for name, r in records["train"].items():
            if "error" in r:
                lines.append(f"| {name} | {r['error']} | | | | | | | | | | | | | {r['wall_s']:.0f} | |")
                continue
            e, s = r["last_epoch"], r["summary"]
            by = e["bytes"]
            first = f"{r['first_epoch']['time_s']:.1f}" if "first_epoch" in r else ""
            lines.append(
                f"| {name} | {e['epoch'] + 1} of {r['epochs']} | {e['time_s']:.1f} | {first} | {e['compute_s']:.1f} | "
                f"{e['intra_comm_s']:.1f} | "
                f"{e['inter_comm_s']:.1f} | {e['grad_sync_s']:.1f} | {by['intra_halo']:,} | {by['inter_halo']:,} | "
                f"{by['intra_grad']:,} | {by['inter_grad']:,} | {mib(s['peak_memory_bytes'])} | "
                f"{s['accuracy'].get('test', float('nan')):.3f} | {r['wall_s']:.0f} | "
                f"{r['loadavg_start']:.1f} / {r['loadavg_end']:.1f} |")
        lines.append("")
    return lines


BEGIN, END = "<!-- bench_scale.py results: begin -->", "<!-- bench_scale.py results: end -->"


def write_results(path, lines, argv, log):
    """Write the generated tables between the BEGIN/END markers of `path`, keeping the hand-written
    text around them (the reading of the numbers); a page without the markers is written whole."""
    tmp = path + ".generated"
    write_page(tmp, lines, "bench/bench_scale.py", argv, log)
    with open(tmp) as f:
        generated = f.read()
    os.remove(tmp)
    text = f"{BEGIN}\n{generated}{END}\n"
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if BEGIN in old and END in old:
            text = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END) + 1:]
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=2_450_000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stages", nargs="*", default=["build", "verify", "train"], choices=("build", "verify", "train"),
                   help="what to run (none: only rewrite --out from WORK/records.json)")
    p.add_argument("--runs", nargs="*", default=None, choices=[r[0] for r in RUNS],
                   help="train only these runs, in this order (default: all of RUNS)")
    p.add_argument("--timeout", type=int, default=7200, help="seconds per build")
    p.add_argument("--min-available-gib", type=float, default=1.5,
                   help="stop a training run when the machine's MemAvailable falls below this")
    p.add_argument("--work", default="bench-out/scale", help="shard sets, runs and records.json (bench-out/ is not "
                                                             "tracked)")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-scale.md"))
    p.add_argument("--clean", action="store_true", help="delete WORK's shard sets and runs at the end")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "records.json")
    records = load_records(path)
    for stage in args.stages:
        {"build": stage_build, "verify": stage_verify, "train": stage_train}[stage](args, records, path)
    log = [r["command"] for r in records["builds"].values()]
    log += [r["command"] for r in records["train"].values() if "command" in r]
    # The page names the one command that reproduces all of it, whatever stages this call ran.
    write_results(args.out, page(args, records), ["--work", args.work, "--clean"], log)
    shutil.copy(path, os.path.splitext(args.out)[0] + ".json")
    if args.clean:
        for name in os.listdir(args.work):
            if name != "records.json":
                shutil.rmtree(os.path.join(args.work, name), ignore_errors=True)


if __name__ == "__main__":
    main()
