"""Two revisions of the engine side by side on the same shards (not a test).

    python bench/compare_revisions.py --old 23b85fc --vertices 200000 --epochs 5 --reps 2 \\
        --out docs/bench-redesign.md

Checks out OLD into a temporary git worktree, builds the shard sets once with the current tree (the
format is shared), then trains fb, flx, eas and cob with both trees alternately (old, new, old, new, ...) so
that the machine's load drifts over both alike, and writes: the ledger bytes per epoch of each (which
must be identical for a redesign) and the median epoch time of each mode per revision with their ratio.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import tempfile

from harness import REPO, build, train, write_page

MODES = (("fb", "full"), ("flx", "full"), ("eas", "eas"), ("cob", "full"))


def revision_arguments(doc: str, epochs: int, reps: int) -> argparse.ArgumentParser:
    """The options every old-vs-new benchmark takes (this script, bench_cobatch.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="git revision to compare against (e.g. the commit before a redesign)")
    p.add_argument("--vertices", type=int, default=200000)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--reps", type=int, default=reps, help="alternating runs per revision and mode")
    return p


def main(argv=None):
    p = revision_arguments(__doc__, epochs=5, reps=2)
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "compare"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-redesign.md"))
    p.add_argument("--modes", default=",".join(m for m, _ in MODES),
                   help="comma-separated subset of the modes to compare (e.g. fb, to rerun one with more --reps)")
    args = p.parse_args(argv)
    wanted = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(wanted) - {m for m, _ in MODES})
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(m for m, _ in MODES)}")
    modes = [(m, kind) for m, kind in MODES if m in wanted]
    log = []
    old_rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
    new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
    old_tree = tempfile.mkdtemp(prefix="granndis-old-")
    subprocess.run(["git", "worktree", "add", "--detach", old_tree, old_rev], cwd=REPO, check=True)
    try:
        shard_dirs = {"full": os.path.join(args.work, "shards-full"), "eas": os.path.join(args.work, "shards-eas")}
        build(args, shard_dirs["full"], ["--preload", "full"], log)
        build(args, shard_dirs["eas"], ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"], log)
        common = ["--model", "sage", "--layers", str(args.layers), "--hidden", "64", "--epochs", str(args.epochs),
                  "--eval-every", "0"]
        times = {(rev, m): [] for rev in ("old", "new") for m, _ in modes}
        ledger = {}
        for rep in range(args.reps):
            for mode, kind in modes:
                for rev, tree in (("old", old_tree), ("new", REPO)):
                    summary, records = train(shard_dirs[kind], mode, os.path.join(args.work, "runs", f"{rev}-{mode}-{rep}"),
                                             common, log, tree=tree)
                    times[(rev, mode)].append(summary["epoch_time_s"])
                    ledger[(rev, mode)] = [r["bytes"] for r in records]
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old_tree], cwd=REPO, check=False)
    lines = [f"# Redesign check: {old_rev} (old) vs {new_rev} (new), side by side ({datetime.date.today()})", "",
             f"Synthetic DC-SBM graph, {args.vertices:,} vertices, {args.layers}-layer SAGE (hidden 64), 2 emulated "
             f"servers x 2 ranks on one 2-core machine; {args.reps} alternating runs per revision and mode, each "
             f"the median epoch time over {args.epochs} epochs of the slowest rank; the table shows the median "
             f"and the fastest of the runs (the fastest is the least disturbed by other load on the machine). "
             f"Ledger bytes are exact counts per epoch summed over ranks.", "",
             "| mode | ledger bytes identical | old epoch (s), median / fastest | new epoch (s), median / fastest "
             "| new / old, median | new / old, fastest | runs old | runs new |", "|---|---|---:|---:|---:|---:|---|---|"]
    for mode, _ in modes:
        same = ledger[("old", mode)] == ledger[("new", mode)]
        old, new = times[("old", mode)], times[("new", mode)]
        old_t, new_t = statistics.median(old), statistics.median(new)
        lines.append(f"| {mode} | {'yes' if same else 'NO'} | {old_t:.3f} / {min(old):.3f} | {new_t:.3f} / {min(new):.3f} "
                     f"| {new_t / old_t:.3f} | {min(new) / min(old):.3f} | {', '.join(f'{t:.2f}' for t in old)} "
                     f"| {', '.join(f'{t:.2f}' for t in new)} |")
    lines += ["", "Per-epoch bytes (new): " + "; ".join(
        f"{m}: {json.dumps(ledger[('new', m)][-1])}" for m, _ in modes), ""]
    write_page(args.out, lines, "bench/compare_revisions.py", argv, log)


if __name__ == "__main__":
    main()
