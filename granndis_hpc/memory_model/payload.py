"""fb and flx with partial aggregates (--halo-payload partial | smaller, engine/partial.py) in the byte model.

A weighted-sum layer may send, instead of the halo rows rank a sends rank b, for every inner row of b
with an in-edge from a's rows the partial sum of a's contributions (the layer's ``partial_width()``:
its message width min(in, out); R-GCN's one row per destination, the relations' means projected, out
wide).  fb does so at every layer whose rows travel each pass, flx with k < L at the L - k layers after
the preloaded ones (the preloaded layers exchange rows inside the server).  What that costs is counted
here per ordered rank pair from the world view's arrays the row model reads (arrays.py; an --inductive
run's train-induced world view, memory_model/induced_sets.py), vectorised:

- rows_from[a]: distinct rows of rank a this rank reads (what a sends it as rows, direct route);
- partials_from[a]: this rank's inner rows with an in-edge from a row of a (what a sends as partials);
- once_from[a]: of rows_from[a], those this rank relays on the per-server route (each row a server
  reads crosses once, to one of its readers: arrays.server_once_from, as engine/halo_route.py chooses);
- edges_from[a]: in-edges of this rank's inner rows from a's rows (the rows part's graph drops them).

The choice of the layers and server pairs that send partials is graph/payload.py `choose`, the one the
engine makes from the same counts, so the bytes predicted are the ledger's (tests/mpi/test_payload_model.py).
Which runs may use partials at all is graph/payload.py `problem` (the model's layers: `payload_check`)
and `world_problem` (the mode and its depth k: `payloads`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from granndis_hpc.graph.payload import choose, problem, world_problem
from granndis_hpc.registry import typed
from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .estimate import LayerRows, ModelSpec, PeerCounts, RankRows
from .graph_bytes import _graph_bytes, _split_graph_bytes
from .hetero_stacks import relations

PAYLOADS = ("partial", "smaller")  # what fb and flx may send besides rows, each an option of --mode auto


def peer_counts(rank: int, w_indptr, w_src_rank, w_src_global_id, world_size: int,
                once_from: Optional[np.ndarray] = None) -> PeerCounts:
    """PeerCounts of rank `rank` from its world view's in-edge CSR (inner rows; sources as (owner rank,
    global id)).  once_from: its relayed rows per owner (arrays.server_once_from); None: rows_from."""
    P = int(world_size)
    src_rank = np.asarray(w_src_rank, dtype=np.int64)
    gid = np.asarray(w_src_global_id, dtype=np.int64)
    indptr = np.asarray(w_indptr, dtype=np.int64)
    n_dst = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(indptr))
    other = src_rank != int(rank)
    rows = np.unique(np.stack([src_rank[other], gid[other]], axis=1), axis=0)[:, 0]
    partials = np.unique(src_rank[other] * (n_dst + 1) + dst[other]) // (n_dst + 1)
    rows_from = np.bincount(rows, minlength=P)
    return PeerCounts(tuple(int(x) for x in rows_from), tuple(int(x) for x in np.bincount(partials, minlength=P)),
                      tuple(int(x) for x in (rows_from if once_from is None else once_from)),
                      tuple(int(x) for x in np.bincount(src_rank[other], minlength=P)))


def payload_check(m: ModelSpec, input_dropout: float = 0.0, types=None) -> Tuple[Tuple[int, ...], str]:
    """(each conv's partial width, "") where fb and flx may send partial aggregates for model `m`
    (graph/payload.py `problem` finds nothing to refuse on its layers, built here without storage);
    ((), why) where they may not.  types: the graph's GraphTypes (graph/hetero.py), which a typed model
    (R-GCN) is built with; without them a typed model is estimated with rows only."""
    if typed(m.name) and types is None:
        return (), f"model {m.name} is built from the graph's vertex types, which this estimate was not given"
    import torch

    from granndis_hpc.nn.models import build_model

    extra = {"types": types} if typed(m.name) else {}
    with torch.device("meta"):  # the layers' classes and widths only: no parameter storage
        model = build_model(m.name, m.features, m.hidden, m.num_classes, m.layers + m.linear_layers,
                            dropout=m.dropout, norm=m.norm, linear_layers=m.linear_layers, **dict(m.options), **extra)
    convs = list(model.convs)
    why = problem("partial", "fb", None if m.precision == "fp32" else m.precision, input_dropout, convs)
    if why:
        return (), why.replace(", or use --halo-payload rows", "").replace("; or use --halo-payload rows", "")
    return tuple(int(c.partial_width()) for c in convs), ""


def payload_widths(m: ModelSpec, input_dropout: float = 0.0, types=None) -> Tuple[int, ...]:
    """Each conv's partial width where the model allows partial aggregates (`payload_check`); () where not."""
    return payload_check(m, input_dropout, types)[0]


def with_payloads(m: ModelSpec, input_dropout: float = 0.0, types=None) -> ModelSpec:
    """`m` with its message_widths set (`payload_check`; payload_refusal: why none): fb's and flx's
    estimates then offer the partial payloads."""
    widths, why = payload_check(m, input_dropout, types)
    return replace(m, message_widths=widths, payload_refusal=why)


def refusal_note(m: ModelSpec) -> str:
    """What a decision's reason adds where the model refuses the partial payloads ("" where it does not)."""
    return f"; no partial payloads offered: {m.payload_refusal}" if m.payload_refusal else ""


def payloads(m: ModelSpec, rows: Sequence[RankRows], mode: str = "fb", k: int = 0) -> Tuple[str, ...]:
    """The payloads `mode` with k preloaded layers offers on these rows (this process's ranks' of the
    option, perhaps none): rows, and partial and smaller where the model allows them (m.message_widths),
    the mode at that depth exchanges rows between servers (graph/payload.py `world_problem`: fb, flx with
    k < L) and every rank's world view has its PeerCounts."""
    if (not m.message_widths or world_problem("partial", mode, [l >= k for l in range(m.layers)])
            or not all(r.world.peers is not None for r in rows)):
        return ("rows",)
    return ("rows",) + PAYLOADS


@dataclass
class PayloadPlan:
    """The choice and the counts of an fb option with a payload, over every rank (rank order)."""

    use: List[np.ndarray]  # per layer, [sender, receiver]: pairs that send partials (graph/payload.py choose)
    rows: np.ndarray  # [receiver, sender]
    partials: np.ndarray
    once: np.ndarray  # [receiver, sender]: the rows the receiver relays (per-server route)
    server: np.ndarray  # server of every rank


def plan(rows: Sequence[RankRows], m: ModelSpec, servers: int, payload: str) -> PayloadPlan:
    """The layers and server pairs that send partials, as the engine chooses them (engine/partial.py
    plan_payload) from the same counts: none at flx's k preloaded layers (the server view's)."""
    ordered = sorted(rows, key=lambda r: r.rank)
    P = len(ordered)
    if [r.rank for r in ordered] != list(range(P)):
        raise ValueError("a payload's bytes need every rank's rows")
    peers = [r.world.peers for r in ordered]
    if any(p is None for p in peers):
        raise ValueError("a payload's bytes need every rank's PeerCounts (memory_model/payload.py)")
    mat = {k: np.array([getattr(p, k) for p in peers], dtype=np.int64).reshape(P, P)
           for k in ("rows_from", "partials_from", "once_from")}
    server = np.arange(P, dtype=np.int64) // max(1, P // int(servers))
    once = None
    if m.halo_route == "per-server":  # [sender, receiving server]: distinct rows crossing once per server
        once = np.zeros((P, int(servers)), dtype=np.int64)
        np.add.at(once, (slice(None), server), mat["once_from"].T)
        once[np.arange(P), server] = 0
    widths = m.widths()
    k = int(ordered[0].k)
    static = [l < k or not m.estimator.exchanged(l, m) for l in range(m.layers)]
    use = choose(payload, mat["rows_from"], mat["partials_from"], server, [w[0] for w in widths],
                 list(m.message_widths), static, once)
    return PayloadPlan(use, mat["rows_from"], mat["partials_from"], mat["once_from"], server)


def halo_bytes(rows: Sequence[RankRows], m: ModelSpec, servers: int, payload: str) -> np.ndarray:
    """[rank, (inter-server, intra-server)] halo bytes of one step with `payload`, received per rank as
    estimate.rank_halo_bytes counts them (forward and the gradients backward): at an exchanging world
    layer, from a rank of another server the partials at the message width where the pair sends
    partials, else the rows at the input width (on the per-server route the rows it relays; the others
    come from a relay of its own server); from its own server's ranks the rows; at flx's preloaded layers
    the server view's halo rows, inside the server."""
    p = plan(rows, m, servers, payload)  # (in rank order; `rows` may come in another)
    same = p.server[:, None] == p.server[None, :]  # [receiver, sender]
    routed = m.halo_route == "per-server"
    ordered = sorted(rows, key=lambda r: r.rank)
    out = np.zeros((p.rows.shape[0], 2), dtype=np.int64)
    for l, ((w_in, _), w_msg) in enumerate(zip(m.widths(), m.message_widths)):
        if not m.estimator.exchanged(l, m):
            continue
        if l < ordered[0].k:  # a preloaded layer: the server view's halo, inside the server
            out[:, 1] += np.array([r.training_layers()[l][1].n_halo for r in ordered], dtype=np.int64) * w_in
            continue
        partial = p.use[l].T  # [receiver, sender]
        crossing = np.where(partial, p.partials * w_msg, (p.once if routed else p.rows) * w_in)
        relayed = np.where(partial, 0, p.rows - p.once) * w_in if routed else 0
        out[:, 0] += np.where(same, 0, crossing).sum(axis=1)
        out[:, 1] += np.where(same, p.rows * w_in, relayed).sum(axis=1)
    return 2 * F32 * out[np.array([r.rank for r in rows], dtype=np.int64)]


def computed_rows(rows: Sequence[RankRows], m: ModelSpec, servers: int, payload: str) -> List[RankRows]:
    """`rows` as a step with `payload` computes them (engine/partial.py): at a world layer where peers send
    this rank partials, its sources are its own rows and the halo rows that still come as rows, and its
    edges those of the rows part plus the product that sums its own rows' messages into the partials it
    sends (its receivers' cut edges: the same count, moved to the sender).  A halo row that came as a
    partial is not projected, and the layer below is not split boundary-first (epoch_time.work's
    partial_layers): on the demo graph unshaped (20,000 vertices, fb's halo twice the own rows, layers 1
    and 2 sending partials) the slowest rank's layers 0, 1 and 2 computed 31.5, 35.7 and 16.6 ms a step
    with rows and 26.1, 31.9 and 15.6 ms with partials (layer_compute_s in the auto sweep's runs'
    metrics.jsonl, docs/performance/auto.md).  The rows and bytes the epoch moves are counted apart
    (halo_bytes)."""
    p = plan(rows, m, servers, payload)
    ordered = sorted(rows, key=lambda r: r.rank)
    edges = np.array([r.world.peers.edges_from for r in ordered], dtype=np.int64)  # type: ignore[union-attr]
    at = {r.rank: i for i, r in enumerate(ordered)}
    layers = {r.rank: list(r.world.layers) for r in ordered}
    for l, u in enumerate(p.use):
        if l < ordered[0].k or not m.estimator.exchanged(l, m) or not u.any():
            continue
        recv = u.T  # [receiver, sender]
        kept_halo = np.where(recv, 0, p.rows).sum(axis=1)
        cut = np.where(recv, edges, 0).sum(axis=1)
        sent = np.where(recv, edges, 0).sum(axis=0)  # as a sender: its own rows' edges into the partials
        for r in ordered:
            i, lr = at[r.rank], layers[r.rank][l]
            layers[r.rank][l] = replace(lr, n_halo=int(kept_halo[i]), nnz=int(lr.nnz - cut[i] + sent[i]))
    return [replace(r, world=replace(r.world, layers=tuple(layers[r.rank]))) for r in rows]


def memory_bytes(rows: Sequence[RankRows], m: ModelSpec, servers: int, payload: str) -> np.ndarray:
    """[rank, (graph, halo buffers)] bytes fb or flx with `payload` holds beyond rows (engine/partial.py),
    per distinct choice of pairs (the layers sharing one share its structures): the rows part's graph
    (the world graph without the in-edges from ranks that send partials: its indices, degrees and cached
    matrices, split where the world halo overlaps), the scatter of the received partials into the rows and
    the product of the partials sent from the own rows (CSR and transpose each), their send index; and at
    the layer where it is the most, what the exchange's buffers (rows part at the input width, partials at
    the message width, sent and received) exceed the rows' by.  R-GCN's products are per relation (bounded
    by the partial rows times the relations and by the entries), and each layer saves its relations' sums
    and their projections.  The rows' activations and buffers stay counted as they are, which bounds the
    payload's smaller ones from above."""
    p = plan(rows, m, servers, payload)
    ordered = sorted(rows, key=lambda r: r.rank)
    edges = np.array([r.world.peers.edges_from for r in ordered], dtype=np.int64)  # type: ignore[union-attr]
    out = np.zeros((len(ordered), 2), dtype=np.int64)
    seen: set = set()
    est = m.estimator
    relational, R = typed(m.name), relations(m)  # R-GCN: its partials are sums over relations
    for l, ((w_in, _), w_msg) in enumerate(zip(m.widths(), m.message_widths)):
        u = p.use[l]  # [sender, receiver]
        if not m.estimator.exchanged(l, m) or not u.any():
            continue
        recv = u.T  # [receiver, sender]: senders that send the receiver partials
        kept_halo = np.where(recv, 0, p.rows).sum(axis=1)
        p_recv = np.where(recv, p.partials, 0).sum(axis=1)
        cut_edges = np.where(recv, edges, 0).sum(axis=1)
        p_sent = np.where(recv, p.partials, 0).sum(axis=0)  # as a sender: what its receivers get
        p_entries = np.where(recv, edges, 0).sum(axis=0)
        sent_rows = np.where(recv, 0, p.rows).sum(axis=0)
        for i, r in enumerate(ordered):
            lr = r.world.layers[l]
            buffers = (sent_rows[i] + kept_halo[i]) * w_in + (p_sent[i] + p_recv[i]) * w_msg
            out[i, 1] = max(out[i, 1], (buffers - (lr.n_send + lr.n_halo) * w_in) * F32)
            if u.tobytes() in seen:
                continue
            kept = LayerRows(n_own_in=lr.n_own_in, n_halo=int(kept_halo[i]), n_dst=lr.n_dst,
                             nnz=int(lr.nnz - cut_edges[i]), n_send=int(sent_rows[i]))
            b = _graph_bytes(kept, est.self_loops, True, est.aggregation_input_grad(m, l))
            if "world" in m.overlap:
                b += _split_graph_bytes(kept, est.self_loops, l + 1 < m.layers, est.aggregation_input_grad(m, l))
            b += (lr.n_dst + p_recv[i] + 2) * I64 + 2 * int(p_recv[i]) * (I64 + F32)  # the scatter
            if relational:  # a product per relation, of the partial rows its entries reach (at most)
                reached = min(R * int(p_sent[i]), int(p_entries[i]))
                b += (2 * reached + R * (lr.n_own_in + 2)) * I64 + 2 * int(p_entries[i]) * (I64 + F32)
            else:
                b += (p_sent[i] + lr.n_own_in + 2) * I64 + 2 * int(p_entries[i]) * (I64 + F32)  # the product
            out[i, 0] += b + int(p_sent[i]) * I64
        if relational:  # the relations' sums at the input width and their projections, saved for the backward
            out[:, 0] += np.minimum(R * p_sent, p_entries) * (w_in + w_msg) * F32
        seen.add(u.tobytes())
    return out[np.array([r.rank for r in rows], dtype=np.int64)]
