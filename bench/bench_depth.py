"""Flexible Preloading depth sweep: fb and flx with k = 1..L preloaded hops on one graph (not a test).

    python bench/bench_depth.py --vertices 200000 --layers 3 --epochs 5 --out bench-out/depth.md

Builds full preloads of k = 1..L hops for an L-layer model (S=2 x G=2, METIS), then trains, one after
another under `mpirun -n 4`, fb and flx on each, and writes the trade the paper's Fig. 4 describes:
inter-server halo bytes per epoch (exact ledger counts) fall as k grows, to 0 at k = L, while the rows
held and computed per epoch (exact counts from the plans) and the preload's size grow.  Times are this
shared 2-core machine's and only indicative; on one machine "inter-server" is shared memory.
"""
from __future__ import annotations

import argparse
import datetime
import os

from harness import REPO, build, train, write_page


def totals(records):
    """Rows held / computed per epoch, summed over ranks and layers (the plan is the same every epoch)."""
    per_rank = records[-1]["rows_per_layer"]
    return (sum(sum(r["rows_held"]) for r in per_rank), sum(sum(r["rows_computed"]) for r in per_rank))


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(ks, [r["inter_halo"] / 2**20 for r in rows], "o-", color="tab:red", label="inter-server halo (MiB/epoch)")
    ax.set_xlabel("preloaded hops k (0 = fb)")
    ax.set_ylabel("inter-server halo MiB / epoch", color="tab:red")
    ax.set_xticks(ks)
    ax2 = ax.twinx()
    ax2.plot(ks, [r["computed"] / 1e6 for r in rows], "s--", color="tab:blue", label="rows computed (M/epoch)")
    ax2.set_ylabel("rows computed, millions / epoch", color="tab:blue")
    ax.set_title("Flexible Preloading: the trade of k")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=200000)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--generator", choices=("sbm", "local"), default="local",
                   help="synthetic generator: local has the locality of real graphs (docs/performance/locality.md), "
                        "sbm replicates almost everything at 3 hops")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out", "depth"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-depth.md"))
    args = p.parse_args(argv)
    L, log = args.layers, []
    shard_dirs = {k: os.path.join(args.work, f"shards-k{k}") for k in range(1, L + 1)}
    for k, path in shard_dirs.items():
        build(args, path, ["--preload", "full", "--hops", str(k)], log)
    common = ["--model", "sage", "--layers", str(L), "--hidden", "64", "--epochs", str(args.epochs),
              "--eval-every", "0"]
    rows = []
    for k in range(0, L + 1):
        mode, shards = ("fb", shard_dirs[L]) if k == 0 else ("flx", shard_dirs[k])
        summary, records = train(shards, mode, os.path.join(args.work, "runs", f"{mode}-k{k}"), common, log)
        held, computed = totals(records)
        b = summary["bytes_per_epoch"]
        rows.append({"k": k, "mode": mode, "epoch_s": summary["epoch_time_s"], "inter_halo": b["inter_halo"],
                     "intra_halo": b["intra_halo"], "inter_grad": b["inter_grad"], "held": held,
                     "computed": computed, "test": summary["accuracy"]["test"],
                     "peak": summary["peak_memory_bytes"]})
    img = os.path.join(os.path.dirname(args.out), "img", "depth.png")
    os.makedirs(os.path.dirname(img), exist_ok=True)
    plot(rows, img)
    lines = [f"# Flexible Preloading depth sweep ({datetime.date.today()})", "",
             f"Synthetic graph (`--generator {args.generator}`), {args.vertices:,} vertices, {L}-layer SAGE (hidden "
             "64), 2 emulated servers "
             f"x 2 ranks on one 2-core machine. k = 0 is fb; flx with k preloaded hops runs its first k layers on "
             f"the server's preload (intra-server exchange only) and the remaining {L}-k with the world exchange. "
             f"Bytes are exact ledger counts per epoch summed over ranks; rows are exact plan counts per epoch "
             f"summed over ranks and layers; times are medians of the slowest rank, indicative only "
             f"(inter-server links are shared memory here).", "",
             "| k | mode | epoch (s) | inter halo (B) | intra halo (B) | inter grad (B) | rows held | rows computed "
             "| test acc | peak mem/rank (MiB) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['mode']} | {r['epoch_s']:.3f} | {r['inter_halo']:,} | {r['intra_halo']:,} | "
                     f"{r['inter_grad']:,} | {r['held']:,} | {r['computed']:,} | {r['test']:.3f} | "
                     f"{r['peak'] / 2**20:,.0f} |")
    lines += ["", f"![inter-server bytes and rows computed against k](img/{os.path.basename(img)})", "",
              "fb caches its layer-0 input halo (exchanged once at set-up), so per epoch it sends what k = 1 "
              "sends: both exchange the world halo at layers 2..L.", ""]
    write_page(args.out, lines, "bench/bench_depth.py", argv, log)


if __name__ == "__main__":
    main()
