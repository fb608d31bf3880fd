"""Cooperative Batching (`cob`) and the conventional per-GPU mini-batch baseline (`mb`).

cob: every iteration each server takes its next co-batch; its dependency graph (sampled inside the
server's preloaded subgraph, identically on every rank of the server) is split over the server's
ranks by the shard's owners and planned by the same planner as static training; halo rows move over
the intra-server transport.

mb: each rank builds the whole dependency graph of its own share of the co-batch's targets (the
targets its GPU owns) from the server's preload, with no exchange: what CoB saves is the overlap
between these per-GPU graphs.  Its features are read per iteration from the server's shard file, as
a per-GPU loader reading from the server's host store would.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict

import numpy as np
import torch

from granndis_hpc import shards
from granndis_hpc.engine import views
from granndis_hpc.engine.modes import Step, rows_accounting
from granndis_hpc.graph.csr import csr_rows, owner_of, position_lookup
from granndis_hpc.graph.sampler import CoBatchSampler, SampledGraph


class BatchedSteps:
    """The steps of a batched epoch: a sampler (which vertices and edges a co-batch needs) composed
    with a split (which of them this rank computes, and how it gets the rest), planned by the one
    planner.  One optimizer step per co-batch; every server runs the same number of co-batches.

    prefetch: sample and build the rows of co-batch i+1 in a background thread while step i computes
    (as SALIENT pipelines its sampling), so host-side sampling leaves the critical path.  Samples
    depend only on (seed, server, epoch, iteration), so the result is the same either way.  Planning
    stays on the main thread: it talks to the server's other ranks, in step order."""

    def __init__(self, ctx, sampler: CoBatchSampler, split, prefetch: bool = True):
        self.ctx, self.sampler, self.split, self.prefetch = ctx, sampler, split, prefetch

    def steps(self, epoch: int):
        batches = self.sampler.epoch_targets(epoch)
        if not self.prefetch:
            for iteration, targets in enumerate(batches):
                yield self._step(*self._sample(targets, epoch, iteration))
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cobatch-sampler") as pool:
            pending = pool.submit(self._sample, batches[0], epoch, 0)
            for iteration in range(len(batches)):
                waited = time.perf_counter()
                rows, ids, _ = pending.result()
                waited = time.perf_counter() - waited  # the part of sampling left on the critical path
                if iteration + 1 < len(batches):
                    pending = pool.submit(self._sample, batches[iteration + 1], epoch, iteration + 1)
                yield self._step(rows, ids, waited)

    def _sample(self, targets, epoch: int, iteration: int):
        """Host-only work of one co-batch: its dependency graph and this rank's rows of it."""
        start = time.perf_counter()
        sg = self.sampler.sample(self.split.targets(targets), epoch, iteration)
        rows, ids = self.split.rows(sg)
        return rows, ids, time.perf_counter() - start

    def _step(self, rows, ids, sampling_s: float) -> Step:
        """Plan one co-batch (collective on the server) into a Step.  sampling_s is the sampling time on
        the critical path: all of it without prefetching, the wait for the sampler thread with it."""
        ctx = self.ctx
        view = self.split.plan(rows, ids)
        n_targets = int((rows.hop == 0).sum())
        local = ids[:n_targets] - ctx.slice.row_offset
        computed = [ids[: lp.n_dst] for lp in view.plan.layers]
        return Step(view=view, rows=torch.arange(n_targets, device=ctx.device),
                    labels=torch.as_tensor(ctx.slice.labels[local], device=ctx.device),
                    num_targets=int(ctx.comm.allreduce_scalar(n_targets, "sum")), sampling_s=sampling_s,
                    accounting=lambda: self._accounting(view, computed))

    def _accounting(self, view, computed_ids) -> Dict:
        """Collective: rows held / computed per layer per rank and the server's redundancy factor."""
        topo = self.ctx.topo
        rows = rows_accounting(topo, view)
        factors = topo.gather_object(redundancy(topo, computed_ids))
        if topo.rank != 0:
            return {}
        return {**rows, "redundancy": float(np.mean(factors))}


class CooperativeSplit:
    """cob: the server's ranks share one co-batch; each computes the rows its GPU owns and receives
    the others' rows over the intra-server transport."""

    def __init__(self, ctx, server_graph, exact: bool):
        self.ctx, self.exact = ctx, exact
        self.offsets = ctx.slice.server_offsets.astype(np.int64)
        self.server_degree = server_graph["in_degree"]

    def targets(self, targets):
        return targets

    def rows(self, sg: SampledGraph):
        sl = self.ctx.slice
        gpu = sl.gpu
        owner = owner_of(self.offsets, sg.vertices)
        mine = np.flatnonzero(owner == gpu)
        ids = sg.vertices[mine]
        ip, src = csr_rows(sg.indptr, sg.indices, mine)
        src_owner = owner_of(self.offsets, src)
        find_mine = position_lookup(ids)
        degree = self.server_degree[ids] if self.exact else np.diff(sg.indptr)[mine]
        rows = views.RowSource(
            hop=sg.hop[mine], indptr=ip, is_own=src_owner == gpu, own_pos=find_mine(src), peer=src_owner,
            key=src, src_hop=sg.hop[sg.position_of(src)], degree=degree.astype(np.float32),
            features=sl.features[ids - self.offsets[gpu]], global_id=sl.global_id[ids - self.offsets[gpu]])
        return rows, ids

    def plan(self, rows, ids) -> views.View:
        ctx = self.ctx
        topo = ctx.topo
        return views.build_view(rows, topo.ranks_per_server, ctx.cfg.layers, all_active=False,
                                resolve_keys=position_lookup(ids), exchange=ctx.comm.intra_exchange,
                                alltoall_counts=lambda counts: topo.exchange_counts(counts, group="server"),
                                device=ctx.device, exact=self.exact, static_phase="halo", group="server")


class PerGpuSplit(CooperativeSplit):
    """mb: each rank takes the co-batch's targets its GPU owns and builds their whole dependency graph,
    with no exchange: what cob saves is the overlap between these per-GPU graphs.  Features are read
    per iteration from the server's shard file, as a per-GPU loader reading the server's host store would."""

    def targets(self, targets):
        owner = owner_of(self.offsets, targets)
        return targets[owner == self.ctx.slice.gpu]

    def rows(self, sg: SampledGraph):
        ids = sg.vertices
        degree = self.server_degree[ids] if self.exact else np.diff(sg.indptr)
        feats = shards.read_server_rows(self.ctx.cfg.shards, self.ctx.manifest, self.ctx.topo.server, ids)
        n_edges = sg.indices.size
        src_pos = sg.position_of(sg.indices)  # every source is one of this rank's own rows
        rows = views.RowSource(
            hop=sg.hop, indptr=sg.indptr, is_own=np.ones(n_edges, dtype=bool), own_pos=src_pos,
            peer=np.zeros(n_edges, np.int64), key=sg.indices, src_hop=sg.hop[src_pos],
            degree=degree.astype(np.float32), features=feats,
            # Dropout keys by the server-local id (the slice has no global ids of other GPUs' rows): the
            # server's GPUs draw one mask per vertex; mb is not exact, so no shape-independence is lost.
            global_id=ids)
        return rows, ids

    def plan(self, rows, ids) -> views.View:
        # No halo anywhere in mb: plan with a local no-op exchange (nothing to send or receive).
        def exchange(send, send_counts, recv_counts, phase="halo"):
            return send.new_empty((0,) + tuple(send.shape[1:]))
        return views.build_view(rows, 1, self.ctx.cfg.layers, all_active=False,
                                resolve_keys=position_lookup(ids), exchange=exchange,
                                alltoall_counts=lambda c: c, device=self.ctx.device, exact=self.exact,
                                static_phase="halo", group="server")


SPLITS = {"cooperative": CooperativeSplit, "per-gpu": PerGpuSplit}


def redundancy(topo, computed_ids) -> float:
    """Rows computed summed over the server's ranks / distinct (vertex, layer) pairs they needed.

    Collective on the server's ranks; every rank gets the server's factor."""
    gathered = topo.allgather_object([np.asarray(ids) for ids in computed_ids], group="server")
    distinct = sum(np.unique(np.concatenate([g[l] for g in gathered])).size for l in range(len(computed_ids)))
    total = sum(sum(ids.size for ids in g) for g in gathered)
    return float(total) / max(distinct, 1)
