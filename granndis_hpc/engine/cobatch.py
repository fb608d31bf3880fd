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
from dataclasses import dataclass

import h5py
import numpy as np
import torch

from granndis_hpc.engine import views
from granndis_hpc.graph.csr import csr_rows, position_lookup
from granndis_hpc.graph.sampler import CoBatchSampler, SampledGraph


@dataclass
class Step:
    """One iteration's inputs on this rank."""

    view: views.View
    labels: torch.Tensor  # labels of the view's target rows (hop 0), in row order
    num_targets: int
    computed_ids: list  # per layer: server-local ids of the rows computed (for redundancy)
    sampling_s: float  # sampling and row building (host work before planning)


class BatchedTraining:
    def __init__(self, mode, sl, server_graph, shard_file, sampler: CoBatchSampler, layers, exact, comm,
                 device):
        self.mode, self.sl, self.sampler, self.layers, self.exact = mode, sl, sampler, layers, exact
        self.comm, self.device = comm, device
        self.offsets = sl.server_offsets.astype(np.int64)
        self.server_degree = server_graph["in_degree"]
        self.shard_file = shard_file

    def targets(self, epoch):
        return self.sampler.epoch_targets(epoch)

    def step(self, targets, epoch, iteration) -> Step:
        start = time.perf_counter()
        if self.mode == "mb":
            # This GPU's share of the co-batch: the targets it owns; their whole dependency graph.
            owner = np.searchsorted(self.offsets, targets, side="right") - 1
            sg = self.sampler.sample(targets[owner == self.sl.gpu], epoch, iteration)
            rows, ids = self._mb_rows(sg)
        else:
            sg = self.sampler.sample(targets, epoch, iteration)
            rows, ids = self._cob_rows(sg)
        sampling_s = time.perf_counter() - start
        view = self._plan(rows, ids)
        n_targets = int((rows.hop == 0).sum())
        local = ids[:n_targets] - self.offsets[self.sl.gpu]
        labels = torch.as_tensor(self.sl.labels[local], device=self.device)
        computed = [ids[: lp.n_dst] for lp in view.plan.layers]
        return Step(view=view, labels=labels, num_targets=n_targets, computed_ids=computed, sampling_s=sampling_s)

    def _cob_rows(self, sg: SampledGraph):
        gpu = self.sl.gpu
        owner = np.searchsorted(self.offsets, sg.vertices, side="right") - 1
        mine = np.flatnonzero(owner == gpu)
        ids = sg.vertices[mine]
        ip, src = csr_rows(sg.indptr, sg.indices, mine)
        src_owner = np.searchsorted(self.offsets, src, side="right") - 1
        find_mine = position_lookup(ids)
        degree = self.server_degree[ids] if self.exact else np.diff(sg.indptr)[mine]
        rows = views.RowSource(
            hop=sg.hop[mine], indptr=ip, is_own=src_owner == gpu, own_pos=find_mine(src), peer=src_owner,
            key=src, src_hop=sg.hop[sg.position_of(src)], degree=degree.astype(np.float32),
            features=self.sl.features[ids - self.offsets[gpu]])
        return rows, ids

    def _mb_rows(self, sg: SampledGraph):
        ids = sg.vertices
        degree = self.server_degree[ids] if self.exact else np.diff(sg.indptr)
        # Sorted reads are what h5py's fancy indexing needs; ids are unique.
        order = np.argsort(ids)
        with h5py.File(self.shard_file, "r") as f:
            feats = np.empty((ids.size, f["features"].shape[1]), dtype=np.float32)
            if ids.size:
                feats[order] = f["features"][ids[order]]
        n_edges = sg.indices.size
        src_pos = sg.position_of(sg.indices)  # every source is one of this rank's own rows
        rows = views.RowSource(
            hop=sg.hop, indptr=sg.indptr, is_own=np.ones(n_edges, dtype=bool), own_pos=src_pos,
            peer=np.zeros(n_edges, np.int64), key=sg.indices, src_hop=sg.hop[src_pos],
            degree=degree.astype(np.float32), features=feats)
        return rows, ids

    def _plan(self, rows, ids) -> views.View:
        if self.mode == "mb":
            # No halo anywhere in mb: plan with a local no-op exchange (nothing to send or receive).
            def exchange(send, send_counts, recv_counts, phase="halo"):
                return send.new_empty((0,) + tuple(send.shape[1:]))
            return views.build_view(rows, 1, self.layers, all_active=False,
                                    resolve_keys=position_lookup(ids), exchange=exchange,
                                    alltoall_counts=lambda c: c, device=self.device, exact=self.exact,
                                    static_phase="halo")
        topo = self.comm.topo
        return views.build_view(rows, topo.ranks_per_server, self.layers, all_active=False,
                                resolve_keys=position_lookup(ids), exchange=self.comm.intra_exchange,
                                alltoall_counts=topo.server_comm.alltoall, device=self.device,
                                exact=self.exact, static_phase="halo")


def redundancy(server_comm, computed_ids) -> float:
    """Rows computed summed over the server's ranks / distinct (vertex, layer) pairs they needed.

    Collective on the server communicator; every rank gets the server's factor."""
    gathered = server_comm.allgather([np.asarray(ids) for ids in computed_ids])
    distinct = sum(np.unique(np.concatenate([g[l] for g in gathered])).size for l in range(len(computed_ids)))
    total = sum(sum(ids.size for ids in g) for g in gathered)
    return float(total) / max(distinct, 1)
