"""Batched modes (cob, mb) against flx, this tree against an older revision, side by side (not a test).

    python bench/bench_cobatch.py --old main --vertices 200000 --epochs 3 --reps 1 --out docs/bench-cobatch.md

Builds the full 3-hop preload once (S=2 x G=2, METIS; the format is shared), checks OLD out into a
temporary git worktree, then runs every configuration with both trees alternately (old, new, old,
new, ...) so that the shared machine's load drifts over both alike:

  flx; cob and mb with --batches-per-epoch 1 --fanout -1 (cob: exactly flx's rows), 1 / 25 (the
  artifact's AE setting) and 8 / 10; 3-layer SAGE, hidden 64.

It records, per run: the median epoch time (and the first epoch's), the host work left on the critical
path (`sampling_s`: the wait for the co-batch loader), compute, intra-server halo bytes, every epoch's
loss (identical losses = identical training), and for revisions that record them the host CPU seconds
per co-batch by phase (sample, split, plan, to_torch, matrices).  Results go to OUT and OUT's .json
after every run, so an interrupted sweep keeps what it measured.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import tempfile

from harness import REPO, build, write_page
from compare_revisions import revision_arguments
from harness import train as train_run

CONFIGS = (("flx", None, None), ("cob", 1, -1), ("cob", 1, 25), ("cob", 8, 10), ("mb", 1, 25), ("mb", 8, 10))


def label(mode, batches, fanout):
    return mode if batches is None else f"{mode} b={batches} f={fanout}"


DEEP = ("cob", 4, 10)  # the deep table of docs/bench-modes.md: 56-layer ResSAGE+ with cob on an EAS set


def train(tree, shards, mode, batches, fanout, run_dir, common, log):
    extra = [] if batches is None else ["--batches-per-epoch", str(batches), "--fanout", str(fanout)]
    _, records = train_run(shards, mode, run_dir, common + extra, log, tree=tree)
    med = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
    out = {"epoch_s": med("time_s"), "first_epoch_s": records[0]["time_s"], "critical_host_s": med("sampling_s"),
           "compute_s": med("compute_s"), "intra_halo_bytes": int(statistics.median(r["bytes"]["intra_halo"] for r in records)),
           "losses": [r["loss"] for r in records],
           "epochs": [[r["time_s"], r["sampling_s"], r["compute_s"]] for r in records]}
    phases = [r["cobatch_host_s"] for r in records if "cobatch_host_s" in r]
    if phases:  # epochs that built co-batches (a reused plan costs 0 and is left out of the median)
        built = [p for p in phases if sum(p.values()) > 0] or phases
        out["host_s_per_cobatch"] = {k: statistics.median(p[k] for p in built) for k in built[0]}
    return out


def page(results, args, old_rev, new_rev, log):
    def cell(rev, name, key):
        runs = results.get(rev, {}).get(name, [])
        return statistics.median(r[key] for r in runs) if runs else float("nan")

    lines = [f"# Batched modes: {old_rev} (old) vs {new_rev} (new), side by side ({datetime.date.today()})", "",
             f"Synthetic DC-SBM graph, {args.vertices:,} vertices, full 3-hop preload, 3-layer SAGE (hidden 64), "
             f"2 emulated servers x 2 ranks on one shared 2-core machine (other jobs ran at the same time: read "
             f"ratios, not absolute times); runs alternate old/new per configuration, {args.reps} per revision, "
             f"each the median over {args.epochs} epochs of the slowest rank. `critical host` = host work left on "
             f"the critical path (the step waiting for its co-batch: sampling and planning), as a share of the "
             f"epoch. `x flx` = epoch time over the same revision's flx epoch.", "",
             "| run | old epoch (s) | new epoch (s) | new / old | old x flx | new x flx | old critical host | "
             "new critical host | new first epoch (s) | intra halo B old / new | losses identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    if getattr(args, "old_for", None) is not None:
        lines[2] += (f" OLD ran only for {', '.join(args.old_for)} (`--old-for`); the other rows have no old "
                     f"columns (nan).")
    flx = {rev: cell(rev, "flx", "epoch_s") for rev in ("old", "new")}
    for cfg in CONFIGS:
        name = label(*cfg)
        o, n = cell("old", name, "epoch_s"), cell("new", name, "epoch_s")
        oc, nc = cell("old", name, "critical_host_s"), cell("new", name, "critical_host_s")
        ob, nb = results.get("old", {}).get(name, [{}])[0], results.get("new", {}).get(name, [{}])[0]
        same = ob.get("losses") == nb.get("losses") if ob and nb else None
        lines.append(f"| {name} | {o:.2f} | {n:.2f} | {n / o:.2f} | {o / flx['old']:.2f} | {n / flx['new']:.2f} | "
                     f"{oc / o:.0%} | {nc / n:.0%} | {cell('new', name, 'first_epoch_s'):.2f} | "
                     f"{ob.get('intra_halo_bytes', 0):,} / {nb.get('intra_halo_bytes', 0):,} | "
                     f"{'yes' if same else ('no' if same is False else '-')} |")
    lines += ["", "Host CPU seconds per co-batch by phase (new; median over the epochs that built a co-batch, "
              "slowest rank; the loader thread does all of it, off the critical path unless the step waits):", "",
              "| run | sample | split | plan | to_torch | matrices | total |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cfg in CONFIGS[1:]:
        runs = results.get("new", {}).get(label(*cfg), [])
        if runs and "host_s_per_cobatch" in runs[0]:
            h = runs[0]["host_s_per_cobatch"]
            lines.append(f"| {label(*cfg)} | " + " | ".join(f"{h.get(k, 0):.3f}" for k in
                         ("sample", "split", "plan", "to_torch", "matrices")) + f" | {sum(h.values()):.3f} |")
    lines += ["", "Every epoch (time s / waiting for the co-batch s / compute s; slowest rank):", "",
              "| run | epoch 1 | epoch 2 | epoch 3 |", "|---|---|---|---|"]
    for which in ("new", "old"):
        for cfg in CONFIGS:
            runs = results.get(which, {}).get(label(*cfg), [])
            if runs and "epochs" in runs[0]:
                lines.append(f"| {label(*cfg)} ({which}) | " + " | ".join(
                    f"{t:.1f} / {w:.1f} / {c:.1f}" for t, w, c in runs[0]["epochs"]) + " |")
    lines.append("")
    deep = {rev: results.get(rev, {}).get("deep", []) for rev in ("old", "new")}
    if deep["old"] and deep["new"]:
        o, n = (statistics.median(r["epoch_s"] for r in deep[rev]) for rev in ("old", "new"))
        same = deep["old"][0]["losses"] == deep["new"][0]["losses"]
        lines += [f"Deep model: {args.deep_layers}-layer ResSAGE+ (hidden 64), cob --batches-per-epoch {DEEP[1]} "
                  f"--fanout {DEEP[2]} on an EAS set (h=1, f=15) of a {args.deep_vertices:,}-vertex graph, "
                  f"{args.deep_epochs} epochs: old {o:.2f} s, new {n:.2f} s per epoch (new / old {n / o:.2f}); "
                  f"critical host old {statistics.median(r['critical_host_s'] for r in deep['old']) / o:.0%}, new "
                  f"{statistics.median(r['critical_host_s'] for r in deep['new']) / n:.0%}; losses identical: "
                  f"{'yes' if same else 'no'}.", ""]
    return lines


def main(argv=None):
    p = revision_arguments(__doc__, epochs=3, reps=1)
    p.add_argument("--only", nargs="*", default=None, help="labels of the configurations to run (default all)")
    p.add_argument("--old-for", nargs="*", default=None,
                   help="labels of the configurations that also run OLD (default all; the others run this tree only)")
    p.add_argument("--deep", action="store_true", help="also the 56-layer ResSAGE+ cob run on an EAS set")
    p.add_argument("--deep-layers", type=int, default=56)
    p.add_argument("--deep-vertices", type=int, default=10000)
    p.add_argument("--deep-epochs", type=int, default=3)
    p.add_argument("--reuse-shards", action="store_true",
                   help="keep the shard set already built in WORK/shards-full (same options: the caller's responsibility)")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "cobatch"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-cobatch.md"))
    p.add_argument("--from-json", default=None,
                   help="no runs: comma-separated result files of earlier (e.g. --only) sweeps, merged into one page")
    args = p.parse_args(argv)
    log = []
    if args.from_json:  # a sweep split over several runs (each under the bench lock): one page
        results, revs = {"old": {}, "new": {}}, None
        for path in args.from_json.split(","):
            with open(path) as f:
                saved = json.load(f)
            revs = (saved["old"], saved["new"])
            for which in ("old", "new"):
                results[which].update(saved["results"][which])
            log += saved.get("log", [])
        write_page(args.out, page(results, args, *revs, log), "bench/bench_cobatch.py", argv, log)
        return
    rev = lambda r: subprocess.run(["git", "rev-parse", "--short", r], cwd=REPO, check=True,  # noqa: E731
                                   capture_output=True, text=True).stdout.strip()
    old_rev, new_rev = rev(args.old), rev("HEAD")
    old_tree = tempfile.mkdtemp(prefix="granndis-old-")
    subprocess.run(["git", "worktree", "add", "--detach", old_tree, old_rev], cwd=REPO, check=True)
    results = {"old": {}, "new": {}}
    try:
        shards = os.path.join(args.work, "shards-full")
        if not (args.reuse_shards and os.path.exists(os.path.join(shards, "manifest.json"))):
            build(args, shards, ["--preload", "full"], log)
        common = ["--model", "sage", "--layers", str(args.layers), "--hidden", "64", "--epochs", str(args.epochs),
                  "--eval-every", "0"]
        for rep in range(args.reps):
            for cfg in CONFIGS:
                if args.only and label(*cfg) not in args.only:
                    continue
                for which, tree in (("old", old_tree), ("new", REPO)):
                    if which == "old" and args.old_for is not None and label(*cfg) not in args.old_for:
                        continue
                    run_dir = os.path.join(args.work, "runs", f"{which}-{label(*cfg).replace(' ', '-')}-{rep}")
                    results[which].setdefault(label(*cfg), []).append(
                        train(tree, shards, *cfg, run_dir, common, log))
                    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                        json.dump({"old": old_rev, "new": new_rev, "results": results, "log": log}, f, indent=1)
        if args.deep:
            eas = os.path.join(args.work, "shards-eas-deep")
            build(args, eas, ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"], log, layers=args.deep_layers,
                  vertices=args.deep_vertices)
            deep = ["--model", "ressage", "--layers", str(args.deep_layers), "--hidden", "64", "--epochs",
                    str(args.deep_epochs), "--eval-every", "0"]
            for rep in range(args.reps):
                for which, tree in (("old", old_tree), ("new", REPO)):
                    results[which].setdefault("deep", []).append(train(
                        tree, eas, *DEEP, os.path.join(args.work, "runs", f"{which}-deep-{rep}"), deep, log))
                    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                        json.dump({"old": old_rev, "new": new_rev, "results": results, "log": log}, f, indent=1)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old_tree], cwd=REPO, check=False)
    write_page(args.out, page(results, args, old_rev, new_rev, log), "bench/bench_cobatch.py", argv, log)


if __name__ == "__main__":
    main()
