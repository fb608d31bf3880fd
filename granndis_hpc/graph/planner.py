"""The one planner: from a rank's rows and their in-edges to one-hop graphs, exchange plans and the
rows active at every layer.  Pure NumPy; the single communication step (asking owners which rows they
must send) is done by the caller between `HaloTable.requests` and `build_plan`.

Vocabulary
- *own rows*: the rows this rank computes, ordered so that rows needed by later layers are a prefix
  (the shard sorts each GPU's rows by hop).
- *halo rows*: rows owned by a peer that this rank's edges read.  Each is identified by
  (peer, key): the peer's index in the communicator used for the exchange, and a key the peer can
  resolve to one of its own rows (its row position for intra-server plans, the global vertex id for
  world plans).
- *hop*: 0 for rows every layer computes (the server's inner vertices); a row of hop d is needed as an
  input up to layer L - d (1-based) and computed up to layer L - d - 1.  With the shard's BFS hops an
  in-neighbour of a hop-d row has hop <= d + 1, so layer l (0-based) computes rows with hop <= L-1-l
  from rows with hop <= L-l: the active set shrinks by one hop per layer and is a prefix on every rank.

Layout of layer l's source rows: [own rows with hop <= L-l | for each peer p in order: the rows
received from p with hop <= L-l].  Halo rows are kept sorted by (peer, hop, key) and the owner sends
the requested rows in the same order, so every peer's active block is a prefix of its full block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np


class PlanError(ValueError):
    """The rows or edges handed to the planner cannot give an exact layer-wise plan."""


@dataclass
class HaloTable:
    """Distinct halo rows of one rank, sorted by (peer, hop, key)."""

    peer: np.ndarray  # int64 [H]
    key: np.ndarray  # int64 [H]
    hop: np.ndarray  # int64 [H]
    num_peers: int

    def counts(self) -> np.ndarray:
        return np.bincount(self.peer, minlength=self.num_peers).astype(np.int64)

    def requests(self):
        """Keys to ask each peer for, concatenated in peer order, and the count per peer."""
        return self.key.copy(), self.counts()


@dataclass
class EdgeSources:
    """Where the source of every in-edge of the own rows lives (CSR order)."""

    own_pos: np.ndarray  # int64 [E]; own row position, or -1 when the source is a halo row
    halo_index: np.ndarray  # int64 [E]; index into the HaloTable, or -1 for own sources


def build_halo(num_peers: int, is_own: np.ndarray, own_pos: np.ndarray, peer: np.ndarray,
               key: np.ndarray, hop: np.ndarray):
    """Deduplicate the halo sources of all edges into a HaloTable and point every edge at its row.

    Arguments are per edge: `is_own` marks sources that are own rows (their position in `own_pos`);
    for the others `peer`, `key`, `hop` identify the halo row (values at own edges are ignored).
    """
    is_own = np.asarray(is_own, dtype=bool)
    num_edges = is_own.shape[0]
    halo_edges = np.flatnonzero(~is_own)
    hp, hk, hh = peer[halo_edges].astype(np.int64), key[halo_edges].astype(np.int64), hop[halo_edges].astype(np.int64)
    if halo_edges.size and (hp.min() < 0 or hp.max() >= num_peers):
        raise PlanError(f"halo source owned by peer outside [0, {num_peers})")
    # Sort by (peer, hop, key) and keep distinct (peer, key) pairs; hop is a property of the vertex.
    order = np.lexsort((hk, hh, hp))
    sp, sk, sh = hp[order], hk[order], hh[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (sp[1:] != sp[:-1]) | (sk[1:] != sk[:-1])
    table = HaloTable(peer=sp[first], key=sk[first], hop=sh[first], num_peers=num_peers)
    halo_index = np.full(num_edges, -1, dtype=np.int64)
    halo_index[halo_edges[order]] = np.cumsum(first) - 1
    own = np.where(is_own, np.asarray(own_pos, dtype=np.int64), -1)
    return table, EdgeSources(own_pos=own, halo_index=halo_index)


@dataclass
class LayerPlan:
    """Everything layer l needs: its one-hop block and the exchange that fills its halo rows."""

    n_own_in: int  # own source rows (a prefix of the own rows)
    n_dst: int  # rows computed (a prefix of the own rows)
    active_hops: int  # largest hop of this layer's source rows (-1: every row, the plan is all-active)
    send_index: np.ndarray  # int64: own rows to send, grouped by destination peer
    send_counts: np.ndarray  # int64 [num_peers]
    recv_counts: np.ndarray  # int64 [num_peers]
    indptr: np.ndarray  # int64 [n_dst+1], in-edges of the dst rows
    indices: np.ndarray  # int64, source columns in this layer's layout
    halo_rows: np.ndarray  # int64: HaloTable indices of this layer's halo columns, in column order

    @property
    def n_src(self) -> int:
        return self.n_own_in + int(self.recv_counts.sum())


@dataclass
class Plan:
    num_peers: int
    num_own: int
    halo: HaloTable
    group: str = "server"  # the exchange group of every layer of the plan: "server" or "world"
    layers: List[LayerPlan] = field(default_factory=list)
    # The full exchange (every halo row): used once at set-up for static per-row data
    # (input features, degrees) and by layers whose inputs are all rows.
    full_send_index: np.ndarray = None
    full_send_counts: np.ndarray = None


def resolve_requests(requested_keys: np.ndarray, key_to_pos) -> np.ndarray:
    """Own row positions for the keys peers asked for; unknown keys are a planning error."""
    pos = key_to_pos(np.asarray(requested_keys, dtype=np.int64))
    if pos.size and (pos.min() < 0):
        raise PlanError("a peer asked for a row this rank does not own: shard views disagree; "
                        "re-run `granndis preprocess verify` on the shard directory")
    return pos


def build_plan(own_hop: np.ndarray, indptr: np.ndarray, sources: EdgeSources, halo: HaloTable,
               send_pos: np.ndarray, send_peer_counts: np.ndarray, num_layers: int,
               all_active: bool = False, complete_degree: np.ndarray = None, group: str = "server") -> Plan:
    """Per-layer one-hop blocks and exchange lists.

    own_hop: hop of every own row (non-decreasing).  indptr/sources: in-edges of the own rows.
    send_pos/send_peer_counts: own row positions requested by each peer (concatenated in peer order,
    each peer's list in its (hop, key) order), from `resolve_requests`.
    all_active: every row is computed at every layer (world view / closed sampled graphs).
    complete_degree: for exact plans, the global in-degree of every own row; every row the plan
    computes must then have all its in-edges (a preload with too few hops would silently truncate).
    """
    own_hop = np.asarray(own_hop, dtype=np.int64)
    n_own = own_hop.shape[0]
    if n_own and np.any(np.diff(own_hop) < 0):
        raise PlanError("own rows are not sorted by hop; the shard is not in format v1 order")
    L = int(num_layers)
    send_pos = np.asarray(send_pos, dtype=np.int64)
    send_peer = np.repeat(np.arange(halo.num_peers, dtype=np.int64), send_peer_counts)
    send_hop = own_hop[send_pos]
    edge_dst = np.repeat(np.arange(n_own, dtype=np.int64), np.diff(indptr))

    def limit(l_in):  # largest hop active as an input of 0-based layer l_in
        return np.iinfo(np.int64).max if all_active else L - l_in

    if complete_degree is not None and L > 0:
        n_computed = n_own if all_active else int(np.searchsorted(own_hop, limit(1), side="right"))
        short = np.flatnonzero(np.diff(indptr)[:n_computed] != np.asarray(complete_degree)[:n_computed])
        if short.size:
            raise PlanError(
                f"row {int(short[0])} (hop {int(own_hop[short[0]])}) is computed by a {L}-layer model but "
                f"only {int(np.diff(indptr)[short[0]])} of its {int(complete_degree[short[0]])} in-edges are "
                f"in the shard: the preload has too few hops for {L} layers (its rows are not active)")
    plan = Plan(num_peers=halo.num_peers, num_own=n_own, halo=halo, group=group)
    plan.full_send_index = send_pos
    plan.full_send_counts = np.asarray(send_peer_counts, dtype=np.int64)
    for l in range(L):
        if all_active and l > 0:
            # Every layer reads and computes every row: one LayerPlan (and so one graph and one set of
            # sparse matrices, engine/views.py) serves them all instead of L equal copies.
            plan.layers.append(plan.layers[0])
            continue
        in_lim, out_lim = limit(l), limit(l + 1)
        n_own_in = int(np.searchsorted(own_hop, in_lim, side="right"))
        n_dst = int(np.searchsorted(own_hop, out_lim, side="right"))
        halo_active = halo.hop <= in_lim
        recv_counts = np.bincount(halo.peer[halo_active], minlength=halo.num_peers).astype(np.int64)
        # Column of every active halo row: own block first, then the active rows in table order,
        # which is peer-major and, inside a peer, the prefix of its (hop, key)-sorted block.
        halo_col = np.full(halo.peer.shape[0], -1, dtype=np.int64)
        halo_col[halo_active] = n_own_in + np.arange(int(halo_active.sum()), dtype=np.int64)
        n_edges = int(indptr[n_dst])
        own_src = sources.own_pos[:n_edges]
        halo_of_edge = (halo_col[np.maximum(sources.halo_index[:n_edges], 0)] if halo_col.size
                        else np.full(n_edges, -1, dtype=np.int64))
        cols = np.where(own_src >= 0, own_src, halo_of_edge)
        if np.any((own_src >= 0) & (own_src >= n_own_in)) or np.any(cols < 0):
            bad = int(edge_dst[np.flatnonzero(((own_src >= 0) & (own_src >= n_own_in)) | (cols < 0))[0]])
            raise PlanError(
                f"layer {l + 1}: row {bad} (hop {own_hop[bad]}) reads a source that is not active at this "
                f"layer; the shard's hops are not BFS distances or its preload has too few hops for "
                f"{L} layers")
        send_active = send_hop <= in_lim
        plan.layers.append(LayerPlan(
            n_own_in=n_own_in, n_dst=n_dst, active_hops=-1 if all_active else int(in_lim),
            send_index=send_pos[send_active],
            send_counts=np.bincount(send_peer[send_active], minlength=halo.num_peers).astype(np.int64),
            recv_counts=recv_counts,
            indptr=indptr[: n_dst + 1].astype(np.int64, copy=True),
            indices=cols,
            halo_rows=np.flatnonzero(halo_active),
        ))
    return plan
