"""What each mode trains on, as row counts: the `estimate` of the modes' registry entries
(granndis_hpc/registry.py), called by --mode auto (memory_model/shardsets.py, on shard sets on disk)
and by `preprocess plan` (on the builds it runs), so that both estimate a set the same way.

A mode's estimate takes a `SetArrays` (one set's arrays) and returns `RowGroup`s, one per option it
offers on that set: full sets serve fb and flx with any k <= min(hops, L) (rows deeper than k stay
resident but inactive), each with rows and, where the model and k allow, partial aggregates; EAS sets
serve eas, and a set whose preload holds L hops (or an EAS set) serves cob with each co-batch count,
sampled here exactly as the run samples its first co-batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from granndis_hpc.graph.csr import csr_rows
from granndis_hpc.graph.sampler import CoBatchSampler
from granndis_hpc.registry import MODES

from .arrays import GpuArrays, ServerArrays, cobatch_counts, shard_rows, with_cobatch
from .choice import Option, make_option
from .estimate import ModelSpec, RankRows
from .payload import payloads


@dataclass
class Sampling:
    """How cob's co-batches are drawn (the train options --fanout, --sampler, --seed) and which counts
    per epoch are estimated."""

    batches: Sequence[int] = (2, 4, 8, 16, 32, 64)
    fanout: int = -1
    sampler: str = "sage"
    seed: int = 0


@dataclass
class SetArrays:
    """One shard set's arrays on this process: all its servers, or (a collective plan) this rank's share."""

    servers: List[ServerArrays]
    kind: str  # the preload: "full" | "eas"
    hops: int
    layers: int  # the model depth the set is built for
    source: str = ""
    world_sent: Optional[np.ndarray] = None  # every rank's world send-list length (None: from `servers`)
    world_sent_once: Optional[np.ndarray] = None  # the same on the per-server route (world_reads once=True)
    ks: Optional[Sequence[int]] = None  # preloaded depths to estimate (None: every one the set serves)
    sample_cobatches: bool = True  # whether cob is estimated on this set
    min_train: Optional[int] = None  # the smallest server's training vertices (None: from `servers`)
    server_graph: Optional[Callable[[ServerArrays], Dict[str, np.ndarray]]] = None  # for sampling (cob)
    modes: Optional[Sequence[str]] = None  # the modes the set may serve (None: every one its kind serves)

    def rows(self, layers: int, k: int, m: ModelSpec) -> List[RankRows]:
        return shard_rows(self.servers, layers, k, m.features, m.num_classes, self.world_sent, self.world_sent_once)

    def wants(self, k: int) -> bool:
        return self.ks is None or k in self.ks

    def graphs(self) -> List[Dict[str, np.ndarray]]:
        """Every server's graph (what the co-batch sampler draws from)."""
        out = [self.server_graph(a) if self.server_graph is not None else a.graph for a in self.servers]
        missing = [a.server for a, g in zip(self.servers, out) if g is None]
        if missing:
            raise ValueError(f"the co-batch estimate needs the server graphs; servers {missing} have none (give "
                             f"server_graph, or ServerArrays with their graph)")
        return [g for g in out if g is not None]

    def train_floor(self) -> int:
        """The smallest server's inner training vertices: the most co-batches every server can make."""
        if self.min_train is not None:
            return self.min_train
        return min(int(np.count_nonzero(g["train"] & (g["hop"] == 0))) for g in self.graphs())

    def cobatches(self, layers: int, batches: Sequence[int], sampling: Sampling) -> Dict[int, Dict[int, tuple]]:
        """b -> arrays.cobatch_counts of the first co-batch of every server, for each count b in
        `batches`: sampled here on the servers' graphs (a CountedSet has them counted already)."""
        graphs = self.graphs()
        return {int(b): cobatch_counts([
            cobatch_server_arrays(g, a.server, layers, int(b), sampling.fanout, sampling.sampler, sampling.seed)
            for a, g in zip(self.servers, graphs)]) for b in batches}


@dataclass
class RowGroup:
    """The rows of every rank (of this process) for one option: its mode and its knob's value."""

    mode: str
    rows: List[RankRows]
    k: int = 0  # layers on the server-side view
    batches: int = 1
    source: str = ""
    payload: str = "rows"  # fb's and flx's --halo-payload (memory_model/payload.py)


def full_batch(s: SetArrays, layers: int, m: ModelSpec, sampling: Sampling) -> List[RowGroup]:
    """fb: every layer on the world view, which every full set holds; with rows, and where the model's
    layers allow partial aggregates (m.message_widths) also with --halo-payload partial and smaller."""
    if s.kind != "full" or not s.wants(0):
        return []
    rows = s.rows(layers, 0, m)
    return [RowGroup("fb", rows, source=s.source, payload=p) for p in payloads(m, rows)]


def flexible_preload(s: SetArrays, layers: int, m: ModelSpec, sampling: Sampling) -> List[RowGroup]:
    """flx with each k = 1..min(hops, L) of a full set; where k < L and the model's layers allow partial
    aggregates (m.message_widths) also with --halo-payload partial and smaller at its world layers."""
    if s.kind != "full":
        return []
    out = []
    for k in range(1, min(int(s.hops), int(layers)) + 1):
        if s.wants(k):
            rows = s.rows(layers, k, m)
            out += [RowGroup("flx", rows, k=k, source=s.source, payload=p) for p in payloads(m, rows, "flx", k)]
    return out


def expansion_aware(s: SetArrays, layers: int, m: ModelSpec, sampling: Sampling) -> List[RowGroup]:
    """eas: every layer on an EAS set's server view."""
    return [RowGroup("eas", s.rows(layers, layers, m), k=layers, source=s.source)] if s.kind == "eas" else []


def cooperative_batching(s: SetArrays, layers: int, m: ModelSpec, sampling: Sampling) -> List[RowGroup]:
    """cob with each co-batch count a server can make (no more than its training vertices): the first
    co-batch's sample on every server, plus the world view evaluation keeps resident."""
    if not s.sample_cobatches or not (s.kind == "eas" or int(s.hops) >= int(layers)):
        return []
    n_train = s.train_floor()
    base = s.rows(layers, 0, m)
    wanted = [int(b) for b in sampling.batches if int(b) <= n_train]
    counts = s.cobatches(layers, wanted, sampling) if wanted else {}
    return [RowGroup("cob", with_cobatch(base, counts[b]), k=layers, batches=b, source=s.source) for b in wanted]


def row_groups(s: SetArrays, layers: int, m: ModelSpec, sampling: Sampling) -> List[RowGroup]:
    """Every option the set offers an L-layer model, mode by mode in the registry's order (each mode's
    `estimate`); a set built for another depth serves only the modes that run on any depth
    (`any_depth`: fb's world view), and a set that names its `modes` only those."""
    out = []
    for entry in MODES.entries():
        if entry.get("estimate") is None or (int(s.layers) != int(layers) and not entry.get("any_depth")):
            continue
        if s.modes is not None and entry.name not in s.modes:
            continue
        out += entry.resolve("estimate")(s, layers, m, sampling)
    return out


def options(groups: Sequence[RowGroup], m: ModelSpec, servers: int, device: str = "cpu") -> List[Option]:
    """One Option per group (the groups hold every rank's rows)."""
    return [make_option(g.mode, g.rows, m, servers, device, batches=g.batches, source=g.source, payload=g.payload)
            for g in groups]


def cobatch_server_arrays(graph: Dict[str, np.ndarray], server: int, layers: int, batches: int,
                          fanout: int = -1, sampler: str = "sage", seed: int = 0, epoch: int = 0,
                          iteration: int = 0) -> ServerArrays:
    """The rows of one co-batch (engine/cobatch.py `cob`): the sampler's dependency graph of the
    iteration's targets, split over the server's GPUs by the shard's owners, as ServerArrays whose
    rows are the sample's (sorted by (GPU, hop)).  This is the exact sample the run draws at that
    (epoch, iteration) -- same seed, same sampler -- so its counts are a measurement, not a bound.

    graph: shards.read_server_graph's dict (indptr, indices, hop, train, offsets)."""
    offsets = np.asarray(graph["offsets"], dtype=np.int64)
    G = offsets.shape[0] - 1
    train_ids = np.flatnonzero(np.asarray(graph["train"], bool) & (np.asarray(graph["hop"]) == 0))
    smp = CoBatchSampler(graph["indptr"], graph["indices"], train_ids, batches, layers, sampler, fanout, seed, server)
    sg = smp.sample(smp.epoch_targets(epoch)[iteration], epoch, iteration)
    owner = np.searchsorted(offsets, sg.vertices, side="right") - 1
    perm = np.lexsort((np.arange(sg.vertices.shape[0]), sg.hop, owner))  # (GPU, hop), stable
    new_pos = np.empty_like(perm)
    new_pos[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    row_off = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=G), out=row_off[1:])
    sample_src = new_pos[sg.position_of(sg.indices)]
    gpus = []
    for g in range(G):  # loop over the server's GPUs
        ip, src = csr_rows(sg.indptr, sample_src, perm[row_off[g]:row_off[g + 1]])
        n_t = int(np.count_nonzero(sg.hop[perm[row_off[g]:row_off[g + 1]]] == 0))
        gpus.append(GpuArrays(rank=server * G + g, gpu=g, indptr=ip, indices=src, w_indptr=np.zeros(1, np.int64),
                              w_src_rank=np.zeros(0, np.int64), w_src_global_id=np.zeros(0, np.int64), n_train=n_t))
    return ServerArrays(server=server, hop=sg.hop[perm].astype(np.int64), offsets=row_off, gpus=gpus)
