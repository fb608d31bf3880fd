"""bench_auto.py's page: the options it runs, repeated runs' medians, the verdict on auto's choice, and the
page's text (not a test).

The options (auto's option labels with the shard set and train arguments of each) are listed here, so that
the page can name the options a round did not run.  A round of `--repeats N` runs each option N times:
`record_run` keeps every run's epoch (`measured_runs`) beside their median (`measured`, the value the
verdict judges), and `auto_decision` picks the choice of auto's runs that the verdict judges.
`render(data)` writes the page from bench_auto.py's JSON (bench/results/auto.json); rounds recorded
before repeats (one run each, no `measured_runs`) render as they did, with `-` for their spread.
"""
from __future__ import annotations

import collections
import re
import statistics

from granndis_hpc.cluster.linkcheck import link_check_text

LAYERS = 3

def options(layers):
    """(name = auto's option label, shard set, train arguments): what auto's table lists, one each."""
    out = [("fb", "full", ["--mode", "fb"])]
    # fb with partial aggregates (--halo-payload): auto offers them for the weighted-sum models
    out += [(f"fb payload={p}", "full", ["--mode", "fb", "--halo-payload", p]) for p in ("partial", "smaller")]
    out += [(f"flx k={k}", "full", ["--mode", "flx", "--preloaded-layers", str(k)]) for k in range(1, layers + 1)]
    out += [("eas", "eas", ["--mode", "eas"]), ("cob batches=2", "full", ["--mode", "cob", "--batches-per-epoch", "2"])]
    return out


def verdict(measured, choice):
    """(fastest option, auto's choice's epoch / fastest's, within 10 %, not slower than fb) from the
    options' measured epochs; None where auto's choice was not among the options run."""
    if choice not in measured:
        return None
    fastest = min(measured, key=measured.get)
    ratio = measured[choice] / measured[fastest]
    return {"fastest": fastest, "ratio": ratio, "within_10pct": ratio <= 1.10,
            "not_slower_than_fb": measured[choice] <= measured.get("fb", float("inf"))}


def record_run(g, name, epoch_s, epochs, key="measured"):
    """One more run of `name` in round `g`: its epoch joins g[key + "_runs"][name], g[key][name] becomes the
    median over its runs so far, and its per-epoch times join g["run_epochs"][name] (one list per run)."""
    runs = g.setdefault(key + "_runs", {}).setdefault(name, [])
    runs.append(epoch_s)
    g.setdefault(key, {})[name] = statistics.median(runs)
    g.setdefault("run_epochs", {}).setdefault(name, []).append(epochs)


def auto_decision(auto_runs):
    """Of auto's runs in a round (each {"choice", "epoch_s", ...}; each run checks the link and decides
    anew): the choice the verdict judges, the one most of them made (on a tie, the one made first), the
    first run that made it (its predictions go on the page), and the median of their epochs."""
    choice = collections.Counter(r["choice"] for r in auto_runs).most_common(1)[0][0]
    first = next(r for r in auto_runs if r["choice"] == choice)
    return choice, first, statistics.median(r["epoch_s"] for r in auto_runs)


def runs_of(g, name):
    """Every run's epoch of `name` in round `g`; None for a round that kept one value per option."""
    return (g.get("measured_runs") or {}).get(name) or (g.get("other_runs") or {}).get(name)


def overlap(a, b):
    """Whether the ranges (min to max) of two lists of run epochs overlap."""
    return max(min(a), min(b)) <= min(max(a), max(b))


def spread(runs):
    return "-" if not runs else f"{fmt(min(runs))}-{fmt(max(runs))}"


def ranges_overlap(g, v):
    """Whether auto's choice's runs and the fastest option's runs, min to max, overlap: "same option",
    "yes" (the difference between their medians is within this machine's spread between runs), "no",
    or "-" where either has fewer than two runs."""
    if v is None:
        return "-"
    if v["fastest"] == g["choice"]:
        return "same option"
    a, b = runs_of(g, g["choice"]), runs_of(g, v["fastest"])
    if not a or not b or len(a) < 2 or len(b) < 2:
        return "-"
    return "yes" if overlap(a, b) else "no"


def repeats_text(data):
    """The page's sentence on the runs per option, or "" for rounds recorded before repeats."""
    per = collections.defaultdict(set)
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            if "repeats" in g:
                per[graph].add(g["repeats"])
    if not per:
        return ""
    counts = {graph: "once" if ns == {1} else "/".join(str(n) for n in sorted(ns)) + " times"
              for graph, ns in per.items()}
    runs = (next(iter(counts.values())) if len(set(counts.values())) == 1 else
            "; ".join(f"{graph}: {c}" for graph, c in counts.items()) + ",")
    return (f" Each option, auto included, ran {runs} per (graph, rate), the options in turn and then again "
            "(auto, every option once, auto, ...), so that a change of the machine's load reaches all alike; an "
            "option's measured epoch is the median of its runs' epochs and the verdicts judge these medians; the "
            "tables give also the range (min-max) of its runs.")


MODEL = (
    "auto prices each option's epoch (memory_model/epoch_time.py, docs/concepts.md) as the sum of: compute (per "
    "rank and layer, the rows its Linears project (the halo rows too where a layer projects before it "
    "aggregates, as fb's world layers do, except the halo rows that come as partial aggregates) and the edges' "
    "aggregation at rates timed at start-up, times the "
    "calibration of the model's real training step (every rank stepping at once, on a random graph of the "
    "in-degree of the graph the run trains on), on the world view's overlapped path for the layers a run "
    "computes that way (fb's and flx's world layers; calibrated at the halo rows and the rows computed first "
    "per row of fb's epoch); between two world exchanges the slowest rank's), "
    "inter-server seconds (the busiest server's halo and gradient bytes over the measured link; what crosses "
    "both ways at once, as the halo exchanges and the gradient all-reduce do, at the rate the start-up check "
    "measured with both leaders sending; the gradient's seconds, where the run overlaps the gradient with "
    "the backward, charged only beyond the backward's share of the compute, except the last bucket's, the first "
    "layer's, charged whole), intra-server seconds, and fixed "
    "seconds (every exchange round, forward and backward, at the cost the start-up check measured on the "
    "run's own exchange paths: with fb's and flx's per-server route, a relay round inside the server after "
    "every world round of rows, and a world round of partials where a layer sends partial aggregates; and "
    "every optimizer step: the calibration's fixed part (and the overlapped path's extra, where a layer is on "
    "it) and a gradient "
    "all-reduce round, overlapped as the run makes it; per co-batch for cob, and each co-batch's "
    "set-up, fixed and per row, timed at start-up on the job's graph). fb is kept unless another option is "
    "predicted more than 10 % faster. Runs of an earlier version have no calibration and no fixed term: "
    "their page shows `-` there.")


RESHAPED = ("the link re-shaped to the next rate after every few epochs, bench_products.Reshaper; the first epoch at "
            "each rate is left out of its median")


def products_note(n):
    """The page's note on the products-size graph, whose rounds ran `n` runs per option (None: before repeats)."""
    auto, each = ("once per rate", "once over every rate") if n in (None, 1) else (
        f"{n} times per rate, one after another", f"{n} times over every rate, the options in turn and then again")
    return ("products: bench_products.py's graph (`--generator local`, ogbn-products' statistics) built with "
            "configs/products.build.toml (inductive, 3 hops) and trained as configs/products.toml (inductive, 3 SAGE "
            f"+ 1 Linear, LayerNorm, hidden 64, dropout and input dropout 0.3); auto runs {auto} (its link check "
            f"runs at start-up), each option {each} ({RESHAPED}), under the memory guard"
            + ("" if n in (None, 1) else "; the runs made for their bytes alone once") + ". Its final "
            "evaluation is not in the epoch time.")


def bytes_section(data):
    """Per graph with recorded ledger bytes: each run's inter- and intra-server bytes of one epoch."""
    out = []
    for graph in data["config"]["graphs"]:
        g = next((r["graphs"][graph] for r in data["rates"] if r["graphs"].get(graph, {}).get("bytes")), None)
        if g is None:
            continue
        out += [f"## {graph}: bytes of one training epoch (ledger, summed over ranks)", "",
                "Exact, the same at every rate. fb's default route sends a remote row once per server (to one of "
                "its ranks, which shares it inside the server); `route=direct` once per reading rank; the "
                "payloads send partial aggregates where they are fewer bytes (`smaller`) or always (`partial`).",
                "", "| run | inter-server halo B | inter-server gradient B | intra-server halo B | "
                "intra-server gradient B | inter-server halo / fb's | auto's count of the inter-server halo B |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        fb = g["bytes"].get("fb", {}).get("inter_halo")
        for n, b in g["bytes"].items():
            ratio = f"{b['inter_halo'] / fb:.3f}" if fb else "-"
            model = (g.get("inter_server_bytes", {}).get(n) or {}).get("halo")
            out.append(f"| {n} | {b['inter_halo']:,} | {b['inter_grad']:,} | {b['intra_halo']:,} | "
                       f"{b['intra_grad']:,} | {ratio} | {'-' if model is None else f'{model:,}'} |")
        out.append("")
    return out


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}g}"


def run_count(runs):
    return "-" if not runs else f"{len(runs)}, {spread(runs)}"


def choice_share(g):
    """" (k of n runs)" where auto's runs in round `g` did not all make the choice the verdict judges."""
    runs = g.get("auto_runs") or []
    k = sum(r["choice"] == g.get("choice") for r in runs)
    return "" if k == len(runs) else f" ({k} of {len(runs)} runs)"


def auto_runs_text(g):
    """The page's words on auto's own runs in round `g`: one run's epoch, or several runs' median, range and
    (where they differ) their choices."""
    runs = g.get("auto_runs") or []
    if len(runs) < 2:
        return f"its own run's epoch: {fmt(g.get('auto_epoch_s'))} s. "
    choices = collections.Counter(r["choice"] for r in runs)
    differ = "" if len(choices) == 1 else (" They chose " + ", ".join(f"{c} in {k}" for c, k in choices.items())
                                           + "; the verdict judges the choice most of them made (on a tie, the "
                                           "first run's).")
    return (f"its own {len(runs)} runs' epoch: median {fmt(g.get('auto_epoch_s'))} s, "
            f"{spread([r['epoch_s'] for r in runs])} s.{differ} ")


def page_log(log) -> list:
    """The commands for the page, each once: a run's directory as runs/RATE/... and a repeated run's as
    `-runK`, which the page's first line explains."""
    lines = dict.fromkeys(re.sub(r"-run\d+\b", "-runK", re.sub(r"/runs/[^/ ]+/", "/runs/RATE/", line))
                          for line in log)
    return ["(each train line runs once per round: RATE is the round's rate, which `emu-cluster shape --rate RATE` "
            "set the link to, and runK the round's K-th run of it)", *lines]


def epochs_text(data) -> str:
    """'N epochs per run', with the graphs whose rounds (merged from another sweep) ran another count."""
    other = {}
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            for runs in (g.get("run_epochs") or {}).values():
                other.update({graph: len(run) for run in runs if len(run) != data["config"]["epochs"]})
    return f"{data['config']['epochs']} epochs per run" + (
        " (" + ", ".join(f"{g}'s rounds: {n}" for g, n in sorted(other.items())) + ")" if other else "")


def render(data):
    names = [n for n, _, _ in options(LAYERS)]
    cfg = data["config"]
    L = ["# Does --mode auto pick the fastest option? (emulated 2 x 2 cluster)", "",
         f"Written by `bench/bench_auto.py` ({data['date']}); raw results: `bench/results/auto.json`.", "",
         f"Machine: {cfg['cores']} cores, {cfg['mem_gib']:.0f} GiB, no GPU, Python {cfg['python']}, shared with other "
         f"jobs: load average {data['loadavg_start'][0]:.1f} at the start, "
         f"{(data.get('loadavg_end') or [0])[0]:.1f} at the end "
         f"(per run below). 3-layer SAGE, hidden {cfg['hidden']}, {epochs_text(data)} (the epoch time is "
         f"the median of the epochs after the first), 2 emulated servers x 2 ranks (docs/emulated-cluster.md); "
         f"auto with `--memory-per-gpu {cfg['memory_per_gpu']}` (every option fits). Graphs: "
         + ", ".join(f"{g}" + (f" (bench/demo.sh's graph: its generator, seed and feature noise; "
                               f"{cfg['vertices']:,} vertices)" if g == "synthetic" else "")
                     + (f" ({cfg.get('products_vertices', 0):,} vertices)" if g == "products" else "")
                     for g in cfg["graphs"])
         + ". Rounds run (rate: graphs): "
         + "; ".join(r["rate"] + ": " + ", ".join(r["graphs"]) for r in data["rates"])
         + f". Whole sweep {data.get('wall_s', 0) / 60:.1f} min." + repeats_text(data),
         ""]
    if "products" in cfg["graphs"]:
        n = next((g.get("repeats") for r in data["rates"] for graph, g in r["graphs"].items() if graph == "products"),
                 None)
        L[-1:] = [products_note(n), ""]
    L += ["## The model", "", MODEL, ""]
    if data.get("findings"):  # the reading of these numbers, kept with them in the JSON (--from-json)
        L += ["## What it found", "", *[f"- {f}" for f in data["findings"]], ""]
    L += ["## Summary", "", "| graph | rate | auto chose | fastest measured | chosen / fastest | within 10 % | "
          "not slower than fb | auto's own run / fastest | runs of chosen; fastest (s, min-max) | ranges overlap |",
          "|---|---|---|---|---:|---|---|---:|---|---|"]
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            v, best = g.get("verdict"), min(g["measured"].values()) if g["measured"] else None
            if v is None and "choice" in g:  # a sweep stopped part-way: among the options measured so far
                v = verdict(g["measured"], g["choice"])
            own = g.get("auto_epoch_s") / best if best and g.get("auto_epoch_s") else None
            planned = len(g.get("options") or options(LAYERS))
            part = "" if len(g["measured"]) == planned else f" (stopped: {len(g['measured'])} of {planned} options run)"
            L.append(f"| {graph} | {r['rate']}{part} | {g.get('choice', 'failed')}{choice_share(g)} | "
                     + (f"{v['fastest']} | {v['ratio']:.2f} | {'yes' if v['within_10pct'] else 'no'} | "
                        f"{'yes' if v['not_slower_than_fb'] else 'no'} |" if v else "- | - | - | - |")
                     + f" {fmt(own)} | "
                     + (f"{spread(runs_of(g, g['choice']))}; {spread(runs_of(g, v['fastest']))} | "
                        if v else "- | ") + f"{ranges_overlap(g, v)} |")
    L.append("")
    if repeats_text(data):
        L += ["Ranges overlap: whether the runs of auto's choice and those of the fastest option, min to max, "
              "overlap, i.e. whether the difference between their medians is within the spread between runs of "
              "one option on this machine (`-`: fewer than two runs of either). The 10 % verdict judges the "
              "medians alone.", ""]
    L += bytes_section(data)
    for r in data["rates"]:
        for graph, g in r["graphs"].items():
            link = g.get("link") or r  # the graph's own link check (rounds merged from another sweep)
            L += [f"## {graph}, {r['rate']} (ping-pong {link['inter_Bps'] / 1e6:.3g} MB/s between servers; "
                  f"load {g['loadavg_start']:.1f} -> {g.get('loadavg_end', 0):.1f})", ""]
            n_runs = g.get("repeats") or 1
            if "options" in g:
                L += [f"Each option's epochs: its {'one run' if n_runs == 1 else f'{n_runs} runs'} over every rate "
                      f"({RESHAPED}); auto's: its own {'run' if n_runs == 1 else 'runs'} at this rate.", ""]
            L += [
                  "| option | measured epoch (s) | auto's prediction (s) | predicted / measured | "
                  "predicted compute / inter / intra / fixed (s) | runs, min-max (s) |", "|---|---:|---:|---:|---|---|"]
            pred = g.get("predicted", {})
            other = g.get("other", {})  # runs for their bytes, not among auto's options
            unrun = []
            # auto's other options by predicted time, ties in its table's order (a set's would vary from run to run)
            extra = sorted((n for n in pred if n not in names), key=lambda n: pred[n].get("total_s", 0))
            for n in names + extra + list(other):
                p = pred.get(n) or {}
                if n not in g["measured"] and n not in other and n != g.get("choice"):
                    if p:  # predicted, not run: listed below the table
                        unrun.append(f"{n} {fmt(p.get('total_s'))}")
                    continue
                mark = " **(auto)**" if n == g.get("choice") else (" (not an option of auto)" if n in other else "")
                meas = g["measured"].get(n, other.get(n))
                ratio = p["total_s"] / meas if meas and p.get("total_s") else None
                L.append(f"| {n}{mark} | {fmt(meas)} | {fmt(p.get('total_s'))} | {fmt(ratio, 2)} | "
                         f"{fmt(p.get('compute_s'))} / {fmt(p.get('inter_s'))} / {fmt(p.get('intra_s'))} / "
                         f"{fmt(p.get('fixed_s'))} | {run_count(runs_of(g, n))} |")
            v = g.get("verdict") or (verdict(g["measured"], g["choice"]) if "choice" in g else None)
            L.append("")
            if unrun:
                L += [f"Predicted, not run (s): {', '.join(unrun)}.", ""]
            if "choice" in g:
                L.append(f"auto chose **{g['choice']}**; {auto_runs_text(g)}" + (
                    f"Fastest measured: {v['fastest']}; auto's choice / fastest = {v['ratio']:.2f} "
                    f"({'within' if v['within_10pct'] else 'NOT within'} 10 %), "
                    f"{'not slower' if v['not_slower_than_fb'] else 'SLOWER'} than fb." if v else
                    "Its choice is not among the options run, so no verdict.") + {
                    "yes": " Their runs' ranges overlap: the difference is within this machine's spread.",
                    "no": " Their runs' ranges do not overlap."}.get(ranges_overlap(g, v), ""))
                cr = g.get("compute_rate") or {}
                rt = g["rates"]
                fixed = (f", compute x{fmt(rt['compute_scale'])}, step {fmt(rt.get('step_s'))} s, round world "
                         f"{fmt(rt.get('world_round_s'))} s / server {fmt(rt.get('server_round_s'))} s"
                         if "compute_scale" in rt else "")
                if rt.get("overlap_scale") is not None:
                    fixed += (f", overlapped path x{fmt(rt['overlap_scale'])} (+{fmt(rt.get('overlap_step_s'))} s "
                              f"a step)")
                if "cobatch_row_s" in rt:
                    fixed += (f", co-batch set-up {fmt(rt['cobatch_s'])} s + {fmt(rt['cobatch_row_s'])} s "
                              f"per row")
                if rt.get("targets_round_s"):
                    fixed += f", target-count all-reduce {fmt(rt['targets_round_s'])} s per co-batch"
                both = (f" ({fmt(rt['inter_both_Bps'] / 1e6)} MB/s each way both ways at once)"
                        if rt.get("inter_both_Bps") else "")
                L.append(f"Rates auto priced with: inter {fmt((rt.get('inter_Bps') or 0) / 1e6)} MB/s{both}, "
                         f"intra {fmt((rt.get('intra_Bps') or 0) / 1e6)} MB/s, row_s {fmt(rt.get('row_s'))}, "
                         f"edge_s {fmt(rt.get('edge_s'))}{fixed}" + (f" ({cr['method']})" if cr else "") + ".")
                if g.get("link_check"):
                    L.append(f"Its {link_check_text(g['link_check'], g['link_check'].get('rounds'))}.")
            for n, e in g.get("errors", {}).items():
                L.append(f"{n}: failed ({e}).")
            peaks = {n: max(x["peak_rss"]) for n, x in g.get("runs", {}).items() if x.get("peak_rss")}
            if peaks:
                L.append("Largest rank's peak RSS per run (GiB): " + ", ".join(
                    f"{n} {v / 2**30:.2f}" for n, v in peaks.items()) + ".")
            L.append("")
    return L


def command_args(data):
    """The page's command line: the sweep's arguments (several sweeps of one --json: joined by `&&`)."""
    runs = data["argv"] if data["argv"] and not isinstance(data["argv"][0], str) else [data["argv"]]
    return [" && python bench/bench_auto.py ".join(" ".join(a) for a in runs)]
