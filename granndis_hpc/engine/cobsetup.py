"""What setting up a co-batch costs on this job's graph, measured at start-up for --mode auto's cost model.

Each co-batch of cob is sampled from the server's preload, split over its GPUs, planned and laid out as
tensors (engine/cobatch.py) before its step can run.  The loader builds the next co-batch while a step
computes, which hides the work where the host has cores to spare; where the ranks already fill the
cores (the emulated cluster of one machine), the step waits for it.  The cost model
(memory_model/epoch_time.py) charges it per co-batch, an upper bound like its other terms:
cobatch_s + cobatch_row_s x the rows of the co-batch's dependency graph (each layer's computed rows,
as the model counts them).  Both are fitted here on the rank's own server graph, every rank at once
(as the run's loaders build): co-batches of TARGETS training vertices (at most half the server's) and
of a quarter as many, each built TRIALS times after an untimed one, the best of each size kept (CPU
starvation only slows a build down); the line through the two sizes gives the fixed seconds and the
seconds per row, and the slowest rank's of each is kept.  --mode auto runs the check only where a
co-batch option wins with the set-up priced at zero (engine/modes.py: the lower bound), and `preprocess
plan --inter-rate` runs the same timing (`time_server_graph`) on each server graph it builds, serially.

auto decides before the run reads its shards, so nothing of the run is at hand yet: the check reads the
server graph's structure (CSR, hops, split, ids: what the sampler and the planner use) and no feature
row, which on a wide set is most of the file.  Where auto then chooses a batched mode on the same shard
set, its loader samples from that structure and reads only the features: the run reads its server
graph once.  The one step the timing leaves out is the host copy of each row's features out of the
server's rows (a gather of F floats a row after the plan: about 0.04 us a row at 100 features, against
the microseconds a row the sampling and planning take).
"""
from __future__ import annotations

import time
from typing import Optional, Tuple

import numpy as np

from granndis_hpc import shards
from granndis_hpc.engine import cobplan, inductive
from granndis_hpc.graph.sampler import CoBatchSampler, SamplerError

TRIALS = 2  # timed builds per co-batch size
TARGETS = 256  # training vertices of the larger timed co-batch, at most: the start-up stays short


def _build_seconds(sampler, index, targets, gpu: int, device) -> tuple:
    """(seconds, rows) of setting up one co-batch of `targets`: sample, split and plan, tensors."""
    start = time.perf_counter()
    draw = sampler.draw(np.sort(targets), 0, 0)
    hp = cobplan.cooperative_plan(index, draw, gpu, {})
    cobplan.layer_graphs(hp, device)
    return time.perf_counter() - start, sum(int(lp.n_dst) for lp in hp.plan.layers)


def fit(small: tuple, large: tuple) -> tuple:
    """(fixed seconds, seconds per row) of the line through two (seconds, rows) builds, neither negative;
    all per row where the two have as many rows."""
    (t0, r0), (t1, r1) = small, large
    if r1 <= r0:
        return 0.0, max(t0, t1) / max(r0, r1, 1)
    row_s = max(0.0, (t1 - t0) / (r1 - r0))
    return max(0.0, t0 - row_s * r0), row_s


def structure_only(graph: dict) -> dict:
    """The server graph as ServerIndex takes it, with features of width 0 in place of the feature rows: a
    co-batch's sampling, split, plan and layout read the structure only, and its features are gathered
    after them (cobplan._finish), per row at the width of the shard set, which this check leaves out."""
    n = int(np.asarray(graph["indptr"]).shape[0]) - 1
    return {**graph, "features": np.zeros((n, 0), dtype=np.float32)}


def _rank_rate(cfg, graph: dict, manifest: dict, topo, device) -> Optional[tuple]:
    """(fixed seconds, seconds per row, rows of the larger co-batch) of this rank's timed co-batches on its
    server's `graph` (its structure: shards.read_server_graph without features); None where the server
    has no training vertex (the cob options are then refused by their own checks)."""
    if cfg.inductive:
        graph = inductive.train_induced_graph(graph)
    exact = manifest["preload"]["kind"] == "full" and cfg.fanout == -1 and cfg.sampler == "sage"
    return time_server_graph(graph, cfg.conv_layers, cfg.sampler, cfg.fanout, cfg.seed, topo.server, topo.local_rank,
                             exact, device)


def time_server_graph(graph: dict, layers: int, sampler: str, fanout: int, seed: int, server: int, gpu: int,
                      exact: bool, device) -> Optional[tuple]:
    """(fixed seconds, seconds per row, rows of the larger co-batch) of GPU `gpu`'s part of co-batches of
    server `server`'s `graph` (the keys of shards.read_server_graph; features are not read), sampled as the
    run samples them (an inductive run's graph: its train-induced edges); None where the server has no
    training vertex.  What --mode auto times on every rank at once, and `preprocess plan --inter-rate`
    (through the batched modes' registry entry, `setup_timer`) one server at a time."""
    graph = structure_only(graph)
    train_ids = np.flatnonzero(graph["train"] & (graph["hop"] == 0))
    if train_ids.shape[0] == 0:
        return None
    draws = CoBatchSampler(graph["indptr"], graph["indices"], train_ids, 1, layers, sampler, fanout, seed, server)
    index = cobplan.ServerIndex(graph, layers, exact)  # built once per run: not a co-batch's cost
    perm = np.random.default_rng([seed, server]).permutation(train_ids)
    large = perm[: max(1, min(TARGETS, perm.shape[0] // 2))]
    small = large[: max(1, large.shape[0] // 4)]
    _build_seconds(draws, index, small, gpu, device)  # untimed: first use of every kernel
    timed = {}
    for name, targets in (("small", small), ("large", large)):
        runs = [_build_seconds(draws, index, targets, gpu, device) for _ in range(TRIALS)]
        timed[name] = (min(t for t, _ in runs), runs[0][1])
    fixed, row_s = fit(timed["small"], timed["large"])
    return fixed, row_s, timed["large"][1]


def measure(cfg, path: str, topo) -> Tuple[dict, Optional[dict]]:
    """({cobatch_s, cobatch_row_s, rows, method}, graph): the slowest rank's fixed seconds and seconds per
    row to set up a co-batch of the shard set at `path` (module docstring), 0 where they could not be
    measured (the method says why), and the rank's server graph as read here: its structure, no feature
    row (None where it could not be read), which a batched mode chosen on `path` samples from, reading
    only the features then (BatchedMode.setup).  Collective over the world."""
    mine: Optional[tuple] = None
    graph: Optional[dict] = None
    error = ""
    try:
        manifest = shards.read_manifest(path)
        graph = shards.read_server_graph(path, manifest, topo.server)
        mine = _rank_rate(cfg, graph, manifest, topo, topo.device)
    except (shards.ShardError, SamplerError, OSError, KeyError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    got = topo.allgather_object((mine, error))
    errors = [e for _, e in got if e]
    rates = [m for m, _ in got if m is not None]
    if errors or not rates:
        why = errors[0] if errors else "no server holds training vertices"
        return ({"cobatch_s": 0.0, "cobatch_row_s": 0.0, "rows": 0, "method": f"co-batch set-up not priced ({why})"},
                graph)
    fixed, row_s = max(r[0] for r in rates), max(r[1] for r in rates)
    rows = int(np.mean([r[2] for r in rates]))
    return ({"cobatch_s": float(fixed), "cobatch_row_s": float(row_s), "rows": rows,
             "method": (f"co-batch set-up {fixed * 1e3:.3g} ms + {row_s * 1e6:.3g} us per row (sampled, split, "
                        f"planned and laid out; fitted on co-batches of up to {rows:,} rows, every rank at once, "
                        f"best of {TRIALS}, the slowest rank's)")}, graph)
