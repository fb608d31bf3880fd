"""Side-by-side benchmark of the training modes on one synthetic graph (not a test).

    python bench/bench_modes.py --vertices 200000 --epochs 5 --out bench-out/modes.md

Builds the shards once (full 3-hop preload and EAS h=1 f=15, S=2 x G=2, METIS), then runs, in one
session, one after another under `mpirun -n 4`:
  static: fb, flx, eas   (3-layer SAGE, hidden 64)
  batched: cob and mb with the same targets and fanout (--batches-per-epoch, --fanout)
  overlap: cob with the next co-batch sampled in a background thread vs after the step, and cob
           without sampling vs flx
  deep: ressage (56 layers) with cob on the EAS shards, with and without activation checkpointing
and writes one markdown file with the commands, the tables (median epoch time, bytes per link class
from the ledger, accuracy, peak memory, redundancy) and the fb/flx inter-server byte ratio.
Bytes are exact ledger counts; times are this shared 2-core machine's and only indicative.
"""
from __future__ import annotations

import argparse
import datetime
import os

from harness import REPO, build, mib, train, write_page


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=200000)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batches-per-epoch", type=int, default=4)
    p.add_argument("--fanout", type=int, default=10)
    p.add_argument("--deep-layers", type=int, default=56)
    p.add_argument("--deep-epochs", type=int, default=20)
    p.add_argument("--deep-vertices", type=int, default=20000,
                   help="graph size for the deep model (a 56-layer model on 2 shared cores needs a small one)")
    p.add_argument("--skip", nargs="*", default=[], help="parts to skip: static batched overlap deep")
    p.add_argument("--work", default=os.path.join(REPO, "bench-out"))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "bench-modes.md"))
    args = p.parse_args(argv)
    log, lines = [], []
    full, eas = os.path.join(args.work, "shards-full"), os.path.join(args.work, "shards-eas")
    build(args, full, ["--preload", "full"], log)
    build(args, eas, ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"], log)
    common = ["--model", "sage", "--layers", str(args.layers), "--hidden", "64", "--epochs", str(args.epochs),
              "--eval-every", "0"]
    runs = os.path.join(args.work, "runs")
    lines += [f"# Training modes side by side ({datetime.date.today()})", "",
              f"Synthetic DC-SBM graph, {args.vertices:,} vertices, 2 emulated servers x 2 ranks on one "
              f"2-core machine (4 ranks oversubscribed, gloo/MPI on loopback). Bytes are exact ledger counts "
              f"(summed over ranks, per epoch); times are medians over {args.epochs} epochs of the slowest "
              f"rank and only indicative here. Activation memory = growth of resident memory over a training "
              f"step's forward pass (what autograd keeps for backward), largest rank; peak RSS includes the "
              f"process itself (~300 MiB of torch).", ""]
    if "static" not in args.skip:
        res = {m: train(eas if m == "eas" else full, m, os.path.join(runs, m), common, log)[0]
               for m in ("fb", "flx", "eas")}
        lines += [f"## Full-graph modes: {args.layers}-layer SAGE, hidden 64", "",
                  "| mode | epoch (s) | compute (s) | intra comm (s) | inter comm (s) | grad sync (s) | "
                  "intra halo (B) | inter halo (B) | intra grad (B) | inter grad (B) | test acc | "
                  "peak mem/rank (MiB) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, s in res.items():
            t, b = s["seconds_per_epoch"], s["bytes_per_epoch"]
            lines.append(f"| {m} | {s['epoch_time_s']:.3f} | {t['compute']:.3f} | {t['intra_comm']:.3f} | "
                         f"{t['inter_comm']:.3f} | {t['grad_sync']:.3f} | {b['intra_halo']:,} | {b['inter_halo']:,} | "
                         f"{b['intra_grad']:,} | {b['inter_grad']:,} | {s['accuracy']['test']:.3f} | "
                         f"{mib(s['peak_memory_bytes'])} |")
        fb_inter = res["fb"]["bytes_per_epoch"]["inter_halo"] + res["fb"]["bytes_per_epoch"]["inter_grad"]
        flx_inter = res["flx"]["bytes_per_epoch"]["inter_halo"] + res["flx"]["bytes_per_epoch"]["inter_grad"]
        lines += ["", f"Inter-server bytes per epoch, fb / flx = {fb_inter:,} / {flx_inter:,} = "
                  f"**{fb_inter / max(flx_inter, 1):.1f}x** (halo + gradients).", ""]
    if "batched" not in args.skip:
        batch = common + ["--batches-per-epoch", str(args.batches_per_epoch), "--fanout", str(args.fanout)]
        lines += [f"## Cooperative batching vs per-GPU mini-batches: {args.batches_per_epoch} co-batches "
                  f"per epoch, fanout {args.fanout}, same targets", "",
                  "| mode | epoch (s) | sampling (s) | intra halo (B) | rows computed / rank (layer 1) | "
                  "redundancy | activation mem/rank (MiB) | peak RSS/rank (MiB) |",
                  "|---|---:|---:|---:|---|---:|---:|---:|"]
        for m in ("cob", "mb"):
            s, recs = train(full, m, os.path.join(runs, m), batch, log)
            rows = [r["rows_computed"][0] for r in recs[-1].get("rows_per_layer", [])]
            lines.append(f"| {m} | {s['epoch_time_s']:.3f} | {s['seconds_per_epoch']['sampling']:.3f} | "
                         f"{s['bytes_per_epoch']['intra_halo']:,} | {rows} | "
                         f"{sum(r['redundancy'] for r in recs) / len(recs):.3f} | "
                         f"{mib(s['activation_memory_bytes'])} | {mib(s['peak_memory_bytes'])} |")
        lines.append("")
    if "overlap" not in args.skip:
        batch = common + ["--batches-per-epoch", str(args.batches_per_epoch), "--fanout", str(args.fanout)]
        lines += ["## Cooperative batching: sampling overlapped with compute, and cob without sampling vs flx", "",
                  f"cob with {args.batches_per_epoch} co-batches, fanout {args.fanout}: the next co-batch sampled "
                  f"in a background thread (default) or after the step (`--sequential-sampling`); sampling (s) is "
                  f"the sampling left on the critical path. cob with one co-batch and all neighbours computes "
                  f"exactly what flx computes (tests/mpi/test_cobatch.py).", "",
                  "| run | epoch (s) | sampling on the critical path (s) | compute (s) | intra halo (B) | loss after "
                  "last epoch |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, mode, extra in (("cob, prefetched", "cob", batch), ("cob, sequential", "cob",
                                                                      batch + ["--sequential-sampling"]),
                                  ("cob, 1 co-batch, fanout -1", "cob", common + ["--batches-per-epoch", "1",
                                                                                  "--fanout", "-1"]),
                                  ("flx", "flx", common)):
            s_, recs = train(full, mode, os.path.join(runs, name.replace(" ", "").replace(",", "-")), extra, log)
            lines.append(f"| {name} | {s_['epoch_time_s']:.3f} | {s_['seconds_per_epoch']['sampling']:.3f} | "
                         f"{s_['seconds_per_epoch']['compute']:.3f} | {s_['bytes_per_epoch']['intra_halo']:,} | "
                         f"{recs[-1]['loss']:.4f} |")
        lines.append("")
    if "deep" not in args.skip:
        eas = os.path.join(args.work, "shards-eas-deep")
        build(args, eas, ["--preload", "eas", "--hops", "1", "--eas-fanout", "15"], log, layers=args.deep_layers,
              vertices=args.deep_vertices)
        deep = ["--model", "ressage", "--layers", str(args.deep_layers), "--hidden", "64", "--epochs",
                str(args.deep_epochs), "--eval-every", "0", "--batches-per-epoch", str(args.batches_per_epoch),
                "--fanout", str(args.fanout)]
        lines += [f"## Deep model: {args.deep_layers}-layer ResSAGE+ with CoB-EAS, {args.deep_epochs} epochs, "
                  f"synthetic graph of {args.deep_vertices:,} vertices", "",
                  "| activation checkpointing | epoch (s) | loss first -> last | activation mem/rank (MiB) | "
                  "peak RSS/rank (MiB) |", "|---|---:|---|---:|---:|"]
        for ckpt in (False, True):
            name = "deep-ckpt" if ckpt else "deep"
            s, recs = train(eas, "cob", os.path.join(runs, name),
                            deep + (["--checkpoint-activations"] if ckpt else []), log)
            lines.append(f"| {'on' if ckpt else 'off'} | {s['epoch_time_s']:.3f} | {recs[0]['loss']:.4f} -> "
                         f"{recs[-1]['loss']:.4f} | {mib(s['activation_memory_bytes'])} | "
                         f"{mib(s['peak_memory_bytes'])} |")
        lines.append("")
    write_page(args.out, lines, "bench/bench_modes.py", argv, log)


if __name__ == "__main__":
    main()
