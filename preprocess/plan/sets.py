"""The shard sets `preprocess plan` would build, counted without being written, and their options.

The build's own steps -- the same partitioners (preprocess/partition/twolevel.py), the same halo expansion and
owner assignment (preprocess/build/pipeline.py `build_server`, with the feature columns left out) -- give each
set's arrays; every mode then estimates its options on a set with its own `estimate` (the modes'
registry entries, granndis_hpc/memory_model/mode_estimates.py), exactly as --mode auto does on the sets on disk,
so the two rank the same options the same way.

Two questions, two sets of builds:
- which build? (default): one full build per preloaded depth k (flx k on a k-hop build; fb on the
  world view every build shares) and the EAS build (eas and cob);
- this build (`--hops H`, PlanConfig.hops): the one full build of H hops with every option it serves
  (fb, flx k <= H, cob when H >= L), and the EAS build: what `--mode auto --shards FULL,EAS` sees.
Collective over the communicator like the build (server s is handled by rank s % P).

On a sliced.GraphSlice (a sliced source: no rank holds the graph) `plan_options_sliced` counts the
same sets with the distributed build's steps instead (preprocess/plan/halo_counts.py): the same options.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np

from granndis_hpc import memory_model as mm
from granndis_hpc import registry
from granndis_hpc.cluster.group import as_group
from granndis_hpc.memory_model.induced_sets import train_induced_edges
from granndis_hpc.memory_model.typed_widths import held_width

from granndis_hpc.preprocess.build.pipeline import BuildConfig, build_server, validate_config
from granndis_hpc.preprocess.plan import cobatch_setup
from granndis_hpc.preprocess.plan.build_memory import ServerLoad
from granndis_hpc.preprocess.plan.halo_counts import count_build, full_preload_rows, prepare
from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
from granndis_hpc.preprocess.partition.twolevel import WholeGraphAccess, partition_servers
from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks
from granndis_hpc.preprocess.plan.induced_counts import InducedCounter
from granndis_hpc.preprocess.build.sliced import GraphSlice
from granndis_hpc.preprocess.build.slices import vtxdist_for


def _counting_graph(graph):
    """The graph with zero feature columns: build_server then gathers no feature rows (counts only)."""
    return dataclasses.replace(graph, features=np.zeros((graph.num_vertices, 0), dtype=np.float32))


def _partition(group, graph, cfg):
    """The build's two-level partition (run_build's first half): server, GPU and locality block (the
    files' row order, which the co-batch sampler draws in) of every vertex."""
    sp = partition_servers(group, graph, cfg.servers, cfg.partitioner, cfg.seed)
    mine = list(range(group.rank, cfg.servers, group.size))
    access = WholeGraphAccess(group, graph)
    G = cfg.gpus_per_server
    gpu_of, _ = split_servers_over_gpus(group, access, sp.parts, graph.train_mask, G, cfg.partitioner, cfg.seed)
    block = row_blocks(group, access, part_of(sp.parts, gpu_of, G), cfg.servers * G, cfg.row_block_rows)
    return sp, mine, gpu_of, block


def _load(a: mm.ServerArrays) -> ServerLoad:
    return ServerLoad(server=int(a.server), rows=int(a.hop.shape[0]), fetched_edges=int(a.graph["in_degree"].sum()))


def model_spec(graph, cfg) -> mm.ModelSpec:
    """The model the plan is for, with its extra constructor options (cfg.model_options, NAME=VALUE), and
    the message widths of fb's and flx's partial payloads where its layers allow them (for a run without
    --input-dropout, which they refuse; a typed model built with the graph's types)."""
    options = registry.model_options(cfg.model, cfg.model_options)
    return mm.with_payloads(mm.ModelSpec(cfg.model, graph.num_features, cfg.hidden, int(graph.num_classes), cfg.layers,
                        cfg.dropout, cfg.norm, cfg.checkpoint_activations, tuple(options.items()),
                        linear_layers=cfg.linear_layers or 0, inductive=cfg.inductive,
                        multilabel=np.ndim(graph.labels) == 2, precision=cfg.precision, halo_route=cfg.halo_route,
                        resident=cfg.device == "cpu",
                        **({"relations": graph.types.num_relations, "relation_rows": graph.types.relations_per_vertex(),
                            "type_widths": tuple(graph.types.width_of(graph.num_features)),
                            "type_counts": tuple(graph.types.count(t) for t in graph.types.names)}
                           if getattr(graph, "types", None) else {})), types=getattr(graph, "types", None))


def _checked(group, graph, cfg):
    """(the build's config, the model, the candidate depths) of a plan, checked on every rank alike."""
    bcfg = BuildConfig(out="", servers=cfg.servers, gpus_per_server=cfg.gpus_per_server, layers=cfg.layers,
                       partitioner=cfg.partitioner, seed=cfg.seed, fanout=cfg.fanout, select=cfg.eas_select,
                       row_block_rows=cfg.row_block_rows)
    L = cfg.layers
    with group.errors("checking the plan options", catch=(ValueError, mm.MemoryModelError)):
        validate_config(bcfg, graph.num_vertices)
        m = model_spec(graph, cfg)
        # default: every depth the set serves (--hops H < L: flx k <= H; before, k = H+1..L were refused)
        ks = (list(range(0, min(L, cfg.hops or L) + 1)) if cfg.ks is None
              else sorted(set(int(k) for k in cfg.ks)))
        bad = [k for k in ks if not 0 <= k <= min(L, cfg.hops or L)]
        if bad:
            raise ValueError(f"k = {bad[0]} preloaded hops is outside 0..{min(L, cfg.hops or L)} for a {L}-layer "
                             f"model" + (f" on a {cfg.hops}-hop preload" if cfg.hops else ""))
        if cfg.hops is not None and not 1 <= cfg.hops <= L:
            raise ValueError(f"--hops {cfg.hops}: a full preload of 1 to --layers {L} hops")
    return bcfg, m, ks


def whole_graph_slice(group, graph) -> GraphSlice:
    """This rank's GraphSlice of a graph every rank holds whole (contiguous, balanced rows)."""
    vtxdist = vtxdist_for(graph.num_vertices, group.size)
    lo, hi = int(vtxdist[group.rank]), int(vtxdist[group.rank + 1])
    e_lo, e_hi = int(graph.indptr[lo]), int(graph.indptr[hi])
    return GraphSlice(name=str(getattr(graph, "name", "")), num_vertices=int(graph.num_vertices),
                      num_edges=int(graph.indices.shape[0]), num_classes=int(graph.num_classes), vtxdist=vtxdist,
                      lo=lo, hi=hi, edge_offset=e_lo, indptr=np.asarray(graph.indptr[lo:hi + 1], np.int64) - e_lo,
                      indices=np.asarray(graph.indices[e_lo:e_hi], np.int64), features=graph.features[lo:hi],
                      labels=graph.labels[lo:hi], train_mask=graph.train_mask[lo:hi], val_mask=graph.val_mask[lo:hi],
                      test_mask=graph.test_mask[lo:hi])


@dataclasses.dataclass
class CountedSet(mm.SetArrays):
    """A set known by its ranks' row counts only (preprocess/plan/halo_counts.py): the modes' estimates read
    it through `rows` and `cobatches`, as they read a SetArrays."""

    counted: Optional[Dict[int, List[mm.RankRows]]] = None  # k -> every rank's rows
    cob: Optional[Dict[int, Dict[int, tuple]]] = None  # b -> memory_model.cobatch_counts

    def rows(self, layers: int, k: int, m: mm.ModelSpec) -> List[mm.RankRows]:
        return self.counted[k]

    def cobatches(self, layers: int, batches, sampling) -> Dict[int, Dict[int, tuple]]:
        return {int(b): self.cob[int(b)] for b in batches}


def plan_options_sliced(group, part: GraphSlice, cfg) -> Dict[str, object]:
    """plan_options from the build ranks' slices, with no rank holding the graph (halo_counts.py): the
    full preloads (one build per k in cfg.ks; fb for k = 0) or the one build of --hops H, and the EAS
    build; what `build --hops auto` ranks and `plan` prints on a sliced source.  The same options in
    the same order, partition entry and server loads as plan_options on the whole graph for the same
    cfg; every rank gets them all (no gather)."""
    bcfg, m, ks = _checked(group, part, cfg)
    L = cfg.layers
    sampling = mm.Sampling(tuple(int(b) for b in cfg.cob_batches), cfg.cob_fanout, cfg.cob_sampler, cfg.seed)
    # Collective all through (no errors block around it: a rank's local failure ends the job, fail()).
    prep = prepare(group, part, cfg.servers, cfg.gpus_per_server, cfg.partitioner, cfg.seed, cfg.row_block_rows)
    min_train = prep.min_train()
    # The counts cob estimates (memory_model/mode_estimates.py)
    batches = [b for b in sampling.batches if b <= min_train]
    features, classes = m.features, m.num_classes
    # --inductive: every view counted on its induced graph (preprocess/plan/induced_counts.py).
    ind = (InducedCounter.count(group, part, prep, classes if m.multilabel else 0) if cfg.inductive else None)
    hook = dict(induced=ind.server_counts) if ind else {}

    def rows_of(counts, derived, k):
        if ind is None:
            return prep.rows(counts, L, k, features, classes)
        return ind.rows(derived.get(k) if derived else None, counts, L, k, features, classes, held_width(m))

    def counted_set(build, kind, hops, source, depths, **kw):
        rows = {k: rows_of(build.counts, build.induced, k) for k in depths}
        return CountedSet([], kind, hops, L, source=source, min_train=min_train, counted=rows, cob=build.cobatches,
                          **kw)

    counted, sets, loads = None, [], {}
    setup: Dict[tuple, object] = {}  # (build, server) -> its co-batch set-up timed (cfg.time_setup)
    sampled = dict(sampled_graph=train_induced_edges) if ind else {}
    if cfg.hops is None:
        counted = full_preload_rows(group, part, cfg.servers, cfg.gpus_per_server, L, ks, cfg.partitioner, cfg.seed,
                                    features, classes, prep=prep, **hook)
        if ind is not None:  # fb's slice: of the 1-hop set plan recommends for it, else of the shallowest
            shallowest = counted.counts[min(counted.counts)] if counted.counts else None
            counted.rows = {k: rows_of(counted.counts.get(k, shallowest), counted.induced, k) for k in ks}
        sets = ([CountedSet([], "full", 1, L, ks=[0], sample_cobatches=False,
                            counted=counted.rows)] if 0 in ks else []) + [
            CountedSet([], "full", k, L, ks=[k], sample_cobatches=False, counted=counted.rows) for k in ks if k > 0]
        loads = {f"flx k={k}": (False, lst) for k, lst in counted.loads.items()}
    else:
        H = cfg.hops
        full = count_build(group, part, prep, dataclasses.replace(bcfg, preload="full", hops=H), L,
                           batches if H >= L else (), sampling, induced_ks=range(1, min(H, L) + 1), **hook, **sampled,
                           time_setup=cobatch_setup.timer(cfg, "full"))
        setup.update({(f"--hops {H}", s): t for s, t in (full.setup or {}).items()})
        sets.append(counted_set(full, "full", H, f"--hops {H}", range(0, min(H, L) + 1), ks=ks))
        loads[f"flx k={H}"] = (False, full.loads)
    if cfg.eas:
        eas = count_build(group, part, prep, dataclasses.replace(bcfg, preload="eas", hops=cfg.eas_hops), L,
                          batches, sampling, induced_ks=(L,), **hook, **sampled,
                          time_setup=cobatch_setup.timer(cfg, "eas"))
        setup.update({("--preload eas" if cfg.hops else "eas", s): t for s, t in (eas.setup or {}).items()})
        sets.append(counted_set(eas, "eas", cfg.eas_hops, "--preload eas" if cfg.hops else "", (0, L)))
        loads["eas"] = (True, eas.loads)
    with group.errors("counting rows"):
        groups = [g for s in sets for g in mm.row_groups(s, L, m, sampling)]
        options = mm.options(groups, m, cfg.servers, cfg.device)
    # "counted" (rows, server and GPU of every vertex) for tests/mpi/test_hops_auto_sliced.py; "groups":
    # every option's rows of every rank.
    return {"options": options, "model": m, "partition": prep.partition.manifest_entry(), "server_loads": loads,
            "counted": counted, "prepared": prep, "groups": groups, "setup": setup}


def plan_options(group, graph, cfg) -> Dict[str, object]:
    """Collective: every option's estimate.  Returns (on every rank) {"options": [Option], "model":
    ModelSpec, "partition": manifest entry, "server_loads"}.  `group`: a cluster Group or an mpi4py
    communicator; `cfg`: a granndis_hpc.preprocess.plan.command.PlanConfig."""
    group = as_group(group)
    if isinstance(graph, GraphSlice):
        return plan_options_sliced(group, graph, cfg)
    if cfg.inductive:  # the induced graphs' views are counted from slices (preprocess/plan/induced_counts.py)
        return plan_options_sliced(group, whole_graph_slice(group, graph), cfg)
    bcfg, m, ks = _checked(group, graph, cfg)
    L = cfg.layers
    sp, mine, gpu_of, block = _partition(group, graph, cfg)
    counting = _counting_graph(graph)
    with group.errors("expanding the halos"):
        # One build per preloaded depth (owners and GPU row balance depend on the preload), or the one
        # build of --hops H.
        full: Dict[int, List[mm.ServerArrays]] = {}
        last: Dict[int, tuple] = {}  # server -> (depth built, its arrays)
        for k in ([cfg.hops] if cfg.hops else [k for k in ks if k > 0]):
            full[k] = []
            for s in mine:
                depth, arrays = last.get(s, (0, None))
                # Once the expansion stops growing (the BFS frontier emptied before `depth` hops), a
                # deeper preload is the same build: deep models do not pay L full expansions.
                if arrays is None or int(arrays.hop.max(initial=0)) >= depth:
                    arrays = mm.server_arrays_from_build(build_server(
                        counting, s, sp.parts, gpu_of, block, dataclasses.replace(bcfg, preload="full", hops=k))[0], s)
                last[s] = (k, arrays)
                full[k].append(arrays)
        any_arrays = next(iter(full.values())) if full else [mm.server_arrays_from_build(build_server(
            counting, s, sp.parts, gpu_of, block, dataclasses.replace(bcfg, preload="full", hops=1))[0],
                                                                                         s) for s in mine]
        eas = ([mm.server_arrays_from_build(build_server(
            counting, s, sp.parts, gpu_of, block, dataclasses.replace(bcfg, preload="eas", hops=cfg.eas_hops))[0], s)
            for s in mine] if cfg.eas else [])
        reads = mm.world_reads(any_arrays, cfg.servers * cfg.gpus_per_server)
        reads_once = mm.world_reads(any_arrays, cfg.servers * cfg.gpus_per_server, once=True)
    sent = group.allreduce_sum(reads)  # every rank's world send list: what all readers ask of it
    sent_once = group.allreduce_sum(reads_once)  # and on the per-server route
    if cfg.hops:
        sets = [mm.SetArrays(full[cfg.hops], "full", cfg.hops, L, source=f"--hops {cfg.hops}", ks=ks)]
    else:
        sets = ([mm.SetArrays(any_arrays, "full", 1, L, ks=[0], sample_cobatches=False)] if 0 in ks else []) + [
            mm.SetArrays(full[k], "full", k, L, ks=[k], sample_cobatches=False) for k in ks if k > 0]
    if cfg.eas:
        sets.append(mm.SetArrays(eas, "eas", cfg.eas_hops, L, source="--preload eas" if cfg.hops else ""))
    for s in sets:
        s.world_sent, s.world_sent_once = sent, sent_once
        # A server cannot make more co-batches than it has training vertices (the sampler refuses):
        # every rank must skip the same counts, so take the smallest server's over all ranks.
        mine_train = [int(np.count_nonzero(a.graph["train"] & (a.hop == 0))) for a in s.servers]
        s.min_train = int(group.allreduce_min(np.array([min(mine_train, default=1 << 62)], dtype=np.int64))[0])
    sampling = mm.Sampling(tuple(int(b) for b in cfg.cob_batches), cfg.cob_fanout, cfg.cob_sampler, cfg.seed)
    with group.errors("counting rows"):
        groups = [g for s in sets for g in mm.row_groups(s, L, m, sampling)]
    setup = _time_setup(group, sets, cfg) if cfg.time_setup and any(g.mode == "cob" for g in groups) else {}
    # What each server's writer would fetch in the distributed build (preprocess/plan/build_memory.py): the
    # in-edges of its rows.  EAS fetches the rows of every candidate it scores: the full h-hop ball.
    # label -> (an EAS build, its servers' loads)
    loads = {f"flx k={k}": (False, [_load(a) for a in arrays]) for k, arrays in full.items()}
    if cfg.eas:
        loads["eas"] = (True, [_load(a) for a in eas])  # the EAS files' own rows (prep2: the writer's block)
    all_loads = group.gather_object(loads)
    gathered = group.gather_object(groups)
    options = server_loads = None
    if group.rank == 0:
        merged: Dict[tuple, mm.RowGroup] = {}
        for part in gathered:
            for g in part:
                key = (g.mode, g.k, g.batches, g.source, g.payload)
                if key in merged:
                    merged[key].rows.extend(g.rows)
                else:
                    merged[key] = dataclasses.replace(g, rows=list(g.rows))
        for g in merged.values():
            g.rows.sort(key=lambda r: r.rank)
        options = mm.options(list(merged.values()), m, cfg.servers, cfg.device)
        server_loads = {}
        for part in all_loads:
            for key, (is_eas, lst) in part.items():
                server_loads.setdefault(key, (is_eas, []))[1].extend(lst)
    options = group.bcast_object(options)
    return {"options": options, "model": m, "partition": sp.manifest_entry(), "server_loads": server_loads,
            "setup": setup}


def _time_setup(group, sets, cfg) -> Dict[tuple, object]:
    """Collective: the co-batch set-up timed on every server graph of the sets that sample co-batches
    (plan/cobatch_setup.py), one rank after the other (each its own servers in turn): {(set, server): timing}
    on every rank."""
    mine: Dict[tuple, object] = {}
    for r in range(group.size):  # the block's exit is collective: rank r + 1 starts once rank r is done
        with group.errors("timing a co-batch's set-up", catch=(ValueError, RuntimeError)):
            for s in sets if r == group.rank else ():
                if s.sample_cobatches and (s.kind == "eas" or int(s.hops) >= cfg.layers):
                    time_setup = cobatch_setup.timer(cfg, s.kind)
                    mine.update({(s.source or s.kind, a.server): time_setup(a.server, a.graph) for a in s.servers})
    out: Dict[tuple, object] = {}
    for part in group.allgather_object(mine):
        out.update(part)
    return out
