"""The results page of bench/bench_products.py, rendered from its records (WORK/records.json)."""
from __future__ import annotations

import os
import platform
import statistics

# The artifact's AE1 on ogbn-products (2 servers x 4 A6000, 10 GbE; the numbers docs/paper-experiments.md
# quotes): speedup over Opt_FB.
AE_SPEEDUP = {"flx": 3.98, "cob": 3.65, "eas": 4.37}


def gib(n):
    return f"{n / 2**30:.2f}"


def _speedups(rnd):
    fb = rnd["runs"].get("fb", {})
    if "epoch_s" not in fb:
        return {}
    return {m: fb["epoch_s"] / r["epoch_s"] for m, r in rnd["runs"].items() if r.get("epoch_s")}


def _epoch_table(rounds, modes):
    L = ["| link rate | " + " | ".join(f"{m} (s)" for m in modes) + " | "
         + " | ".join(f"{m} speedup (AE 10 GbE)" for m in modes if m != "fb") + " | fb inter-server share |",
         "|---|" + "---:|" * (2 * len(modes))]
    for rnd in rounds:
        sp, runs = _speedups(rnd), rnd["runs"]
        cells = [f"{runs[m]['epoch_s']:.3f}" if "epoch_s" in runs.get(m, {}) else "not run" for m in modes]
        cells += [(f"**{sp[m]:.2f}x**" if m in sp else "-") + (f" ({AE_SPEEDUP[m]:.2f}x)" if m in AE_SPEEDUP else "")
                  for m in modes if m != "fb"]
        fb = runs.get("fb", {})
        share = f"{fb['inter_comm'] / fb['epoch_s'] * 100:.0f} %" if fb.get("epoch_s") else "-"
        L.append(f"| {rnd['label']} ({rnd['bw_Bps'] * 8 / 1e6:,.0f} Mbit/s measured) | " + " | ".join(cells)
                 + f" | {share} |")
    return L


def _breakdown_table(rounds, modes):
    L = ["| link rate | mode | epoch | first epoch | compute | sampling | intra comm | inter comm | grad sync | "
         "intra halo (B) | inter halo (B) | intra grad (B) | inter grad (B) | test acc |",
         "|---|---|" + "---:|" * 12]
    for rnd in rounds:
        for m in modes:
            x = rnd["runs"].get(m)
            if x is None:
                continue
            if "epoch_s" not in x:
                L.append(f"| {rnd['label']} | {m} | {x.get('error', 'failed')} |" + " |" * 11)
                continue
            b, acc = x["bytes"], (x.get("accuracy") or {}).get("test")
            L.append(f"| {rnd['label']} | {m} | {x['epoch_s']:.3f} | {x['first_epoch_s']:.2f} | {x['compute']:.3f} | "
                     f"{x['sampling']:.3f} | {x['intra_comm']:.3f} | {x['inter_comm']:.3f} | {x['grad_sync']:.3f} | "
                     f"{b['intra_halo']:,} | {b['inter_halo']:,} | {b['intra_grad']:,} | {b['inter_grad']:,} | "
                     f"{'' if acc is None else f'{acc:.3f}'} |")
    return L


def _memory_table(records, modes):
    L = ["| mode | plan estimate, largest rank (GiB) | peak RSS rank 0 / 1 / 2 / 3 (GiB) | "
         "largest / estimate | within 25 % |", "|---|---:|---|---:|---|"]
    for m in modes:
        est = records.get("plan", {}).get(m, {}).get("peak_bytes")
        runs = {r["runs"][m].get("run_dir"): r["runs"][m] for r in records.get("train", [])
                if m in r["runs"] and any(r["runs"][m].get("peak_rss", []))}  # a run covers every rate
        runs = list(runs.values())
        if not runs:
            continue
        rss = "; ".join(" / ".join(gib(b) for b in x["peak_rss"]) for x in runs)
        largest = max(max(x["peak_rss"]) for x in runs)
        ratio = largest / est if est else None
        L.append(f"| {m} | {gib(est) if est else '-'} | {rss} | {'' if ratio is None else f'{ratio:.2f}'} | "
                 f"{'' if ratio is None else ('yes' if abs(ratio - 1) <= 0.25 else 'no')} |")
    return L


def render(records, argv):
    train, g = records.get("train", []), records.get("graph", {})
    modes = [m for m in ("fb", "flx", "eas", "cob") if any(m in r["runs"] for r in train)]
    L = ["# The products workload at products' size on the emulated 2 x 2 cluster", "",
         "What it measures: the GraNNDis artifact's products setting (configs/products.toml: inductive, 3 SAGE "
         "layers + 1 Linear, LayerNorm, hidden 64, dropout 0.3) in fb, flx, eas and cob on a synthetic graph with "
         "ogbn-products' statistics, built by the distributed build with configs/products.build.toml, on two "
         "emulated servers of two ranks each joined by a shaped link (docs/emulated-cluster.md). Written by "
         f"bench/bench_products.py; latest run {records.get('date', '?')}.", ""]
    if g:
        L += [f"Graph: {g['num_vertices']:,} vertices, {g['num_edges']:,} directed edges (a self loop per vertex "
              f"included, as the build preset adds them), {g['num_features']} features, {g['num_classes']} classes, "
              "the products split sizes (8.0 % train, 1.6 % validation, the rest test), `--generator local` "
              "(power-law degrees, locality). ogbn-products: 2,449,029 vertices, 61,859,140 edges without self loops.",
              ""]
    L += [f"Machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
          "GiB, "
          f"no GPU, Python {platform.python_version()}, loaded by parallel work of other jobs throughout (load "
          "average per round below): times are this machine's under that load; bytes are exact ledger counts, "
          "peak RSS does not depend on the load. One run per mode trains "
          f"{records.get('epochs', '?')} epochs at each link rate in turn (the link re-shaped between them); "
          "the epoch time at a rate is the median over its epochs but the first. The last epoch evaluates "
          "(not in the epoch time).", ""]
    if train:
        L += ["## Epoch time and speedup over fb", "",
              "Beside each speedup, in brackets, the artifact's on ogbn-products (AE1: 2 servers x 4 A6000, 10 GbE). "
              "fb's inter-server share: its inter-server halo time over its epoch time.", ""]
        L += _epoch_table(train, modes)
        L += [f"\nLink check of {r['label']}: {'; '.join(r['link_problems'])}."
              for r in train if r.get("link_problems")]
        L += ["", "Load average (1 min) at each link check: "
              + ", ".join(f"{r['label']} {r['loadavg']:.1f}" for r in train) + "; at the end: "
              + f"{records.get('loadavg_end', [0])[0]:.1f}.", ""]
        L += ["## Breakdown per epoch (s) and bytes per epoch (exact ledger counts, summed over ranks)", "",
              "compute / comm as the engine's per-epoch metrics give them (the slowest rank's parts); "
              "*first epoch* is the first epoch's time (it builds the cached adjacencies).", ""]
        L += _breakdown_table(train, modes) + [""]
        L += ["## Peak memory per rank against `preprocess plan`'s estimate", "",
              "Peak RSS (VmHWM) of every rank, polled while the run ran (the final evaluation on the full graph "
              "included); the estimate is `preprocess plan --device cpu`'s for the same graph, model and mode "
              "(its largest rank). The target is within 25 %.", ""]
        L += _memory_table(records, modes) + [""]
    final = {m: x["runs"][m]["final_evaluation_s"] for m in modes for x in train[:1]
             if x["runs"].get(m, {}).get("final_evaluation_s")}
    if final:
        L += ["## Evaluation", "",
              "The final evaluation of each run (after its last epoch: one exact pass over each of the "
              "train-induced, the train+validation-induced and the full graph, the full graph's the largest; "
              "docs/inductive.md), timed as the delay of the last epoch's metrics line after the epoch: "
              + ", ".join(f"{m} {s:.0f} s" for m, s in final.items()) + ".", ""]
    ev = records.get("evaluate")
    if ev:
        L += ["## One evaluation pass on the full graph", "",
              f"An exact forward of fb's trained model over the full graph's world view (what the test accuracy "
              f"of an inductive run is measured on), 4 ranks at {ev['rate']}, timed between barriers: "
              f"first pass {ev['pass_s'][0]:.2f} s (builds the cached adjacencies), second "
              f"{ev['pass_s'][-1]:.2f} s; set-up (reading the shards, planning the view) {ev['set_up_s']:.1f} s; "
              f"peak RSS per rank {' / '.join(gib(b) for b in ev['peak_rss_bytes'])} GiB; test accuracy "
              f"{ev['test_acc']:.3f}.", ""]
    ref = records.get("reference")
    if ref:
        med = statistics.median(ref["epoch_s"])
        L += ["## One-machine reference", "",
              f"The same training graph (the subgraph induced by the {ref['train_vertices']:,} training vertices, "
              f"{ref['train_edges']:,} edges) in one process with {ref['kind']} ({ref['threads']} "
              f"thread{'s' if ref['threads'] != 1 else ''}): "
              f"epoch {med:.3f} s (median of {len(ref['epoch_s'])} after a warm-up of {ref['warmup_s']:.2f} s), "
              f"peak RSS {gib(ref['peak_rss_bytes'])} GiB. The graph it generated in-process is the shard set's: "
              + ("the same vertex and edge counts." if (ref["full_graph"]["vertices"], ref["full_graph"]["edges"])
                 == (g.get("num_vertices"), g.get("num_edges")) else
                 f"NOT the same counts ({ref['full_graph']} against the manifest's).")]
        for r in train:
            cells = [f"{m} {r['runs'][m]['epoch_s']:.3f} s" for m in modes if "epoch_s" in r["runs"].get(m, {})]
            L.append(f"Distributed at {r['label']}: {', '.join(cells)}.")
        L.append("")
    L += ["## Commands", "", "```", f"python bench/bench_products.py {' '.join(argv)}".rstrip(),
          *records.get("log", []), "```", ""]
    return "\n".join(L)


BEGIN, END = "<!-- reading: begin -->", "<!-- reading: end -->"


def keep_reading(page: str, path: str) -> str:
    """`page` with the hand-written reading of the numbers (between BEGIN and END in the page at `path`,
    if there is one) put back after its first paragraph block, so a rerun does not drop it."""
    if not os.path.exists(path):
        return page
    with open(path) as f:
        old = f.read()
    if BEGIN not in old or END not in old:
        return page
    reading = old[old.index(BEGIN): old.index(END) + len(END)]
    head, sep, rest = page.partition("\n## ")
    return f"{head}\n{reading}\n{sep}{rest}" if sep else f"{page}\n{reading}\n"
