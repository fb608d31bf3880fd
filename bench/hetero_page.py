"""The page of bench/bench_hetero.py (docs/performance/hetero.md), made from its records alone, so that
`python bench/bench_hetero.py --stages --work DIR` rewrites it without running anything."""
from __future__ import annotations

import shlex


def gib(n):
    return "" if n is None else f"{n / 2**30:.2f}"


def _runs(rnd, model, modes):
    return {m: rnd["runs"].get(f"{model}/{m}", {"error": "not run"}) for m in modes}


def _graph_lines(records):
    g = records.get("graph")
    if not g:
        return ["The graph was not built (no build stage in the records).", ""]
    L = [f"{g['num_vertices']:,} vertices, {g['num_edges']:,} directed edges after canonicalisation (reverse "
         f"relations included), {g['num_features']} features, {g['num_classes']} classes on the papers; split "
         f"{g['num_train']:,} / {g['num_val']:,} / {g['num_test']:,} by year. Content digest "
         f"`{(g.get('content_sha256') or '')[:16]}...`.", ""]
    types = g.get("types")
    if types:
        L += ["| vertex type | vertices | first id | features |", "|---|---:|---:|---|"]
        L += [f"| {t['name']}{' (target)' if t['name'] == types['target'] else ''} | {t['count']:,} | {t['offset']:,} "
              "| "
              f"{t['features']} |" for t in types["vertex_types"]]
        L += ["", "Relations: " + ", ".join(f"{s}-{n}-{d}" for s, n, d in types["relations"]) + ".", ""]
    builds = records.get("builds", {})
    if builds:
        L += ["Distributed build on the emulated cluster (4 ranks, 2 per server; every rank generates its share): "
              + ", ".join(f"{name} set {b['wall_s']:.0f} s" for name, b in builds.items()) + ".", ""]
    return L


def _epoch_table(rounds, model, modes):
    rest = [m for m in modes if m != "fb"]
    L = ["| link rate | " + " | ".join(f"{m} (s)" for m in modes) + " | " + " | ".join(f"{m} speedup" for m in rest)
         + " | fb inter share |", "|---|" + "---:|" * (len(modes) + len(rest) + 1)]
    for rnd in rounds:
        runs = _runs(rnd, model, modes)
        fb = runs.get("fb", {})
        cells = ["error" if "error" in runs[m] else f"{runs[m]['epoch_s']:.3f}" for m in modes]
        speed = ["" if "error" in runs[m] or "error" in fb else f"**{fb['epoch_s'] / runs[m]['epoch_s']:.2f}x**"
                 for m in rest]
        share = "" if "error" in fb else f"{100 * fb['inter_comm'] / fb['epoch_s']:.0f} %"
        L.append(f"| {rnd['label']} | " + " | ".join(cells + speed) + f" | {share} |")
    return L + [""]


def _breakdown_table(rounds, model, modes):
    L = ["| link rate | mode | epoch | compute | sampling | intra comm | inter comm | grad sync | intra halo (B) | "
         "inter halo (B) | intra grad (B) | inter grad (B) |", "|---|---|" + "---:|" * 10]
    for rnd in rounds:
        for m, x in _runs(rnd, model, modes).items():
            if "error" in x:
                L.append(f"| {rnd['label']} | {m} | {x['error']} |" + " |" * 9)
                continue
            b = x["bytes"]
            L.append(f"| {rnd['label']} | {m} | {x['epoch_s']:.3f} | {x['compute']:.3f} | {x['sampling']:.3f} | "
                     f"{x['intra_comm']:.3f} | {x['inter_comm']:.3f} | {x['grad_sync']:.3f} | {b['intra_halo']:,} | "
                     f"{b['inter_halo']:,} | {b['intra_grad']:,} | {b['inter_grad']:,} |")
    return L + [""]


def _memory_table(rounds, model, modes, plan):
    L = ["| mode | plan estimate per rank (GiB) | measured peak RSS per rank 0..3 (GiB) | max / estimate |",
         "|---|---:|---|---:|"]
    for m, x in _runs(rounds[0], model, modes).items():
        est = plan.get(m, {}).get("peak_bytes")
        peaks = x.get("peak_rss") or []
        ratio = f"{max(peaks) / est:.2f}" if est and peaks and max(peaks) else ""
        L.append(f"| {m} | {gib(est)} | {' / '.join(gib(p) for p in peaks)} | {ratio} |")
    return L + [""]


NAMES = {"rgcn": "R-GCN", "rgat": "R-GAT"}


def _reference_lines(records, modes):
    """The one-process reference epoch (PyG) beside each model's fb and best mode at each rate."""
    refs = records.get("reference") or {}
    if not refs:
        return []
    rounds = records.get("train") or []
    L = ["## One-process reference epoch", "",
         "Each model from PyG's convolutions (R-GCN: `RGCNConv(aggr=\"mean\")`; R-GAT: `HeteroConv` of "
         "`GATConv(add_self_loops=False)` per relation, summed) trained on the same graph, whole in one process "
         "(bench/hetero_pyg.py: same widths, heads and activations, no dropout, one torch thread as each rank has; an "
         "epoch is the forward, the "
         "loss on the training papers, the backward and Adam's step; median over all but the first), beside "
         "the 4 emulated ranks' fb epoch at each rate.", "",
         "| model | one process, PyG (s) | peak RSS (GiB) | " + " | ".join(f"fb at {r['label']} (s)" for r in rounds)
         + " |", "|---|---:|---:|" + "---:|" * len(rounds)]
    for model, ref in sorted(refs.items(), key=lambda kv: list(NAMES).index(kv[0]) if kv[0] in NAMES else 9):
        fb = [_runs(r, model, modes).get("fb", {}) for r in rounds]
        cells = ["" if "error" in x else f"{x['epoch_s']:.3f}" for x in fb]
        head = ([f"error: {ref['error']}", ""] if "error" in ref else
                [f"{ref['epoch_s']:.3f}", gib(ref.get("peak_rss"))])
        L.append(f"| {model} | " + " | ".join(head + cells) + " |")
    return L + [""]


def command(argv):
    """The bench's command line as the page shows it."""
    return f"python bench/bench_hetero.py {shlex.join(argv)}".rstrip()


def render(records):
    modes = records.get("modes", ["fb", "flx", "eas", "cob"])
    title = " and ".join(NAMES.get(m, m) for m in records.get("models", ["rgcn", "rgat"]))
    L = [f"# {title} on a heterogeneous graph with ogbn-mag's statistics", "",
         "Generated by `bench/bench_hetero.py` from its records; do not edit by hand.", "",
         f"The typed synthetic graph with ogbn-mag's statistics (`--source synthetic --generator mag --vertices "
         f"{records.get('vertices', 0):,}`, preprocess/sources/synthetic_mag.py), built by the distributed build "
         f"and trained on the emulated 2-server cluster (2 ranks per server, `tc tbf` on the link between them; "
         f"docs/emulated-cluster.md). {records.get('layers', 3)} layers, hidden {records.get('hidden', 64)}, "
         f"{records.get('epochs', 0)} epochs per rate (median over all but the first). Machine: "
         f"{records.get('machine', 'not recorded')}; times are indicative (one shared machine); bytes are exact "
         "ledger counts, summed over ranks, per epoch.", "",
         "## Graph and build", ""]
    L += _graph_lines(records)
    rounds = records.get("train") or []
    loads = [f"{m} {c['loadavg']:.1f}" for m in records.get("models", []) for c in
             [next((r["checks"][m] for r in rounds if m in r.get("checks", {})), None)] if c]
    if loads:
        L += ["The machine's 1-minute load average at the link checks before each model's runs (2 cores, shared "
              "with other jobs: times scale with the load and vary from run to run): " + ", ".join(loads) + ".", ""]
    if not rounds:
        L += ["## Training", "", "No training stage in the records.", ""]
    for model in records.get("models", []):
        if not rounds:
            break
        plan = records.get("plan", {}).get(model, {})
        L += [f"## {model}", "", "### Epoch time and speedup over fb", ""] + _epoch_table(rounds, model, modes)
        L += ["### Breakdown per epoch (s) and bytes per link class", ""] + _breakdown_table(rounds, model, modes)
        L += ["### Peak memory per rank against `preprocess plan`'s estimate", ""]
        L += _memory_table(rounds, model, modes, plan)
    L += _reference_lines(records, modes)
    # The work directory (--work) is written $WORK: the commands hold no path of the machine they ran on.
    work = records.get("work")

    def portable(line: str) -> str:
        return line.replace(work, "$WORK") if work else line

    # Every bench command that added to the records, then what they ran (each command once).
    L += ["## Commands", "", "```", *dict.fromkeys(map(portable, records.get("commands", []))),
          *dict.fromkeys(map(portable, records.get("log", []))), "```", ""]
    return "\n".join(L)
