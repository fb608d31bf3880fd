"""Partial aggregates instead of halo rows (--halo-payload), for layers whose aggregation is a weighted sum.

A weighted-sum layer (nn/contract.py Layer.weighted_sum: GraphSAGE mean and sum, GCN, GIN) aggregates
agg(v) = sum_u c(u, v) m(u) over v's in-edges, m the layer's messages and c the kind's normalisation
(1/deg v; 1/sqrt(d'_u d'_v); 1).  Instead of sending the rows u of rank a that rank b reads, a can send,
for every destination row v of b with an in-edge from a, the partial sum of its own rows'
contributions p_a(v) = sum_{u on a} c(u, v) m(u); b adds them into agg(v).  The backward sends the
gradient of agg(v) back to a, which scatters it to its rows (autograd through the same products).
The sum is the same, in another order of addition (exact, float rounding aside).  R-GCN (kind
RELATION_MEAN, nn/contract.py): out_v = x_v W_root + sum_r mean_{u in N_r(v)} x_u W_r + b is linear in
the source rows, so a sends p_a(v) = sum_r (sum_{u on a in N_r(v)} x_u / deg_r(v)) W_r, the relations'
sums taken at input width and projected by the layer (out wide), which b adds to the layer's output;
the coefficients 1 / deg_r(v) and each edge's relation are the receiver's, sent with the entries.

Which is fewer bytes depends on the pair and the layer: rows cost (distinct rows a sends b) x the
layer's input width, partials (distinct rows of b with an in-edge from a) x its partial width
(Layer.partial_width: the message width min(in, out), or R-GCN's output width).  Per ordered pair of
servers (sending server, receiving server) and layer:
    rows     every layer sends rows (the default);
    partial  every layer whose rows are exchanged per pass sends partials between servers (layer 0 of
             a plain stack reads the input features, whose halo rows were exchanged once at set-up, so
             it keeps them; a residual stack or a typed model's input projection makes its rows travel
             every pass, so it sends partials too);
    smaller  whichever of the two the exact counts of the whole server pair make fewer bytes (ties: rows).
Ranks of one server always exchange rows.  On --halo-route per-server the rows still cross once per
receiving server (a route planned for the pairs that send rows) and 'smaller' counts them so; the
partials go directly to the rank that reads them (a partial row is of one receiving rank).  Scope: the
world view's layers of the training plan (fb: every layer; flx with k < L: the L - k layers after the
preloaded ones, the preloaded layers exchanging rows inside the server; --inductive: the train-induced
graph's world view, which training runs on), float32 layers, no input dropout; `problem` says what else
is refused and why.  `problem` and `choose` live in graph/payload.py, which the memory model's byte count
of the payloads (memory_model/payload.py: --mode auto and `preprocess plan`) applies to the same counts.

Blocking (--no-overlap) a layer exchanges its rows part, then its partials, each waited for.  Overlapped
(the world halo in --overlap-halos, the default) the rows part is posted by `gather` (PendingRows) and the
partials as soon as the layer has its own messages; the layer aggregates its own rows' edges while both
travel, then waits for the rows (their edges) and the partials.  The backward mirrors it
(engine/exchange.py's _Post/_Wait for both).  A layer that sends partials is not pipelined boundary-first
(its exchange is of messages, not of the rows the layer below computes): the layer below computes all
its rows before the exchange is posted.

Set-up (`plan_payload`, collective over the world): every rank counts, per peer, the rows it receives
and the partial rows it would receive; an all-reduce gives every rank every pair's counts, so all
choose alike; then each receiving rank sends each sending rank the entries of its partial rows
(partial row, position in the rows the sender sends it, the edge's relation, the coefficient c of
every kind the model uses), so that the sender computes exactly the coefficients fb's receiver would have used.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.graph.payload import PAYLOAD_MODES, choose, pair_bytes, problem
from granndis_hpc.options.train_groups import HALO_PAYLOADS
from granndis_hpc.engine.exchange import (halo_exchange, halo_exchange_post, halo_exchange_start, routed_exchange,
                                          routed_post, send_index_tensor)
from granndis_hpc.engine.halo_route import ServerRoute, plan_server_route
from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.nn.contract import RELATION_MEAN
from granndis_hpc.nn.cpu_kernels import csr_matmul
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.rows import PartialSources, PendingRows
from granndis_hpc.nn.sparse import coo_to_csr

__all__ = ["HALO_PAYLOADS", "PAYLOAD_MODES", "PartialPayload", "choose", "pair_bytes", "plan_payload", "problem"]


def _peer_of(cols: np.ndarray, recv_counts: np.ndarray) -> np.ndarray:
    """The sending peer of halo columns (numbered from 0 in the received order)."""
    return np.searchsorted(np.cumsum(recv_counts), cols, side="right")


def receiver_counts(lp) -> Tuple[np.ndarray, np.ndarray]:
    """Per peer a: (rows this rank receives from a, this rank's destination rows with an in-edge from a's
    rows): what a would send as rows and as partials, from the receiving rank's layer plan."""
    recv = np.asarray(lp.recv_counts, dtype=np.int64)
    rows = np.repeat(np.arange(lp.n_dst, dtype=np.int64), np.diff(lp.indptr))
    halo = lp.indices >= lp.n_own_in
    peer = _peer_of(lp.indices[halo] - lp.n_own_in, recv)
    pairs = np.unique(peer * (lp.n_dst + 1) + rows[halo])
    return recv.copy(), np.bincount(pairs // (lp.n_dst + 1), minlength=recv.size).astype(np.int64)


class _Product(torch.autograd.Function):
    """a @ x for a sparse CSR a (its transpose given for the backward), float32, outside autocast."""

    @staticmethod
    def forward(ctx, x, a, a_t):
        ctx.a_t = a_t
        with torch.autocast(x.device.type, enabled=False):
            return csr_matmul(a, x.contiguous())

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):
            return csr_matmul(ctx.a_t, grad.contiguous()), None, None


def _csr_pair(rows, cols, vals, shape, device):
    """(CSR of the entries, CSR of its transpose) on `device`."""
    r, c = torch.as_tensor(rows, device=device), torch.as_tensor(cols, device=device)
    v = torch.as_tensor(vals, dtype=torch.float32, device=device)
    return coo_to_csr(r, c, v, shape), coo_to_csr(c, r, v, (shape[1], shape[0]))


class _LayerPayload:
    """One layer's exchange with partials: the rows part (peers that send rows) and the partials part."""

    def __init__(self, lp, graph: LayerGraph, send_partial: np.ndarray, recv_partial: np.ndarray,
                 received: "_Received", sent: "_Sent", device, route: Optional[Callable] = None):
        recv = np.asarray(lp.recv_counts, dtype=np.int64)
        send = np.asarray(lp.send_counts, dtype=np.int64)
        n_own = lp.n_own_in
        # The rows part: the blocks of the peers that send rows, the in-edges from the others' rows dropped.
        keep_send = np.repeat(~send_partial, send)
        self.send_index = send_index_tensor(np.asarray(lp.send_index, dtype=np.int64)[keep_send], device)
        self.send_counts = np.where(send_partial, 0, send).tolist()
        self.recv_counts = np.where(recv_partial, 0, recv).tolist()
        # On the per-server route the rows part is planned as a route of its own (collective).
        self.route = None if route is None else route(np.asarray(lp.send_index, dtype=np.int64)[keep_send],
                                                      self.send_counts, self.recv_counts)
        keep_col = np.concatenate([np.ones(n_own, dtype=bool), np.repeat(~recv_partial, recv)])
        new_col = np.cumsum(keep_col) - 1
        rows = np.repeat(np.arange(lp.n_dst, dtype=np.int64), np.diff(lp.indptr))
        keep_edge = keep_col[lp.indices]
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[keep_edge], minlength=lp.n_dst))])
        keep_t = torch.as_tensor(keep_col, device=device)
        assert graph.src_loops is not None  # (LayerGraph sets it)
        self.graph = LayerGraph(lp.n_dst, int(keep_col.sum()), torch.as_tensor(indptr, device=device),
                                torch.as_tensor(new_col[lp.indices[keep_edge]], device=device),
                                graph.dst_degree, graph.src_degree[keep_t], graph.src_loops[keep_t], n_own=n_own,
                                degrees_from=graph)
        if graph.source_ids is not None:  # a typed layer reads its rows' types from their ids
            self.graph.source_ids = graph.source_ids[keep_t]
        # The partials part: what this rank sends (rows of its products) and receives, per peer.
        self.p_send_counts = np.where(send_partial, sent.counts, 0).tolist()
        self.p_recv_counts = np.where(recv_partial, received.counts, 0).tolist()
        # Every product row is sent once, in order (scatter rounds built on the host, as the views' are).
        self.p_index = send_index_tensor(np.arange(sum(self.p_send_counts), dtype=np.int64), device)
        self._sent, self._send_peers, self.n_own, self.device = sent, send_partial, n_own, device
        self.receive = received.matrix(recv_partial, lp.n_dst, device)
        self._products: Dict[str, tuple] = {}

    def product(self, kind: str, num_relations: int = 0):
        """The CSR pair of this rank's partials from its messages; RELATION_MEAN: per relation (the
        partial rows it reaches, their CSR pair)."""
        if kind not in self._products:
            self._products[kind] = self._sent.matrix(self._send_peers, kind, self.n_own, self.device, num_relations)
        return self._products[kind]


class _Received:
    """This rank as a receiver: per sending peer, its destination rows with an in-edge from the peer."""

    def __init__(self, lp):
        recv = np.asarray(lp.recv_counts, dtype=np.int64)
        rows = np.repeat(np.arange(lp.n_dst, dtype=np.int64), np.diff(lp.indptr))
        halo = lp.indices >= lp.n_own_in
        self.rows, cols = rows[halo], lp.indices[halo] - lp.n_own_in
        self.peer = _peer_of(cols, recv)
        self.col_in_block = cols - np.concatenate([[0], np.cumsum(recv)[:-1]])[self.peer]
        self.halo_edge = np.flatnonzero(halo)  # positions among the layer's edges
        pairs, self.position = np.unique(self.peer * (lp.n_dst + 1) + self.rows, return_inverse=True)
        self.dst_of_partial = pairs % (lp.n_dst + 1)  # grouped by peer, rows ascending
        self.partial_peer = pairs // (lp.n_dst + 1)
        self.counts = np.bincount(self.partial_peer, minlength=recv.size).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]])

    def matrix(self, from_peers: np.ndarray, n_dst: int, device):
        """The scatter of the partials received from `from_peers` (in peer order) into the destination rows."""
        chosen = from_peers[self.partial_peer]
        dst = self.dst_of_partial[chosen]
        return _csr_pair(dst, np.arange(dst.size), np.ones(dst.size, dtype=np.float32), (n_dst, dst.size), device)


class _Sent:
    """This rank as a sender: per receiving peer, the entries (partial row, own row, the edge's relation,
    coefficient per kind)."""

    def __init__(self, counts: np.ndarray, peer: np.ndarray, partial_row: np.ndarray, own_row: np.ndarray,
                 relation: np.ndarray, values: Dict[str, np.ndarray]):
        self.counts, self.peer, self.partial_row, self.own_row = counts, peer, partial_row, own_row
        self.relation, self.values = relation, values

    def matrix(self, to_peers: np.ndarray, kind: str, n_own: int, device, num_relations: int = 0):
        """The products of the partials this rank sends `to_peers` (rows grouped by peer) from its messages:
        a CSR pair, or for RELATION_MEAN per relation r (the partial rows with an entry of r, the CSR pair
        of those rows), every relation listed (an empty one too: the layer's projection stays in the graph)."""
        if kind not in self.values:
            raise ValueError(f"partial aggregates: no coefficients of the aggregation kind {kind!r} were planned")
        chosen = to_peers[self.peer]
        offsets = np.concatenate([[0], np.cumsum(np.where(to_peers, self.counts, 0))[:-1]])
        rows = offsets[self.peer[chosen]] + self.partial_row[chosen]
        n = int(np.where(to_peers, self.counts, 0).sum())
        cols, vals = self.own_row[chosen], self.values[kind][chosen]
        if kind != RELATION_MEAN:
            return _csr_pair(rows, cols, vals, (n, n_own), device)
        out = []
        relation = self.relation[chosen]
        for r in range(num_relations):
            mine = relation == r
            reached, local = np.unique(rows[mine], return_inverse=True)
            out.append((torch.as_tensor(reached, device=device),
                        _csr_pair(local.reshape(-1), cols[mine], vals[mine], (reached.size, n_own), device)))
        return out


class PartialPayload:
    """A view's layers with partial aggregates where the plan chose them (`plan_payload`)."""

    def __init__(self, layers: List[Optional[_LayerPayload]], use: List[np.ndarray], counts: Tuple[np.ndarray, ...],
                 rows_once: Optional[np.ndarray] = None):
        self.layers, self.use = layers, use
        self.rows, self.partials = counts  # [receiver, sender] of the layer plan every layer shares
        self.rows_once = rows_once  # [sender, receiving server] on the per-server route (None: direct)

    def at(self, l: int) -> bool:
        """Whether layer l exchanges partials (on some pair: every rank takes part in its exchanges)."""
        return self.layers[l] is not None

    def sources(self, l: int, h: torch.Tensor, phase: str, exchange: Callable, wire_dtype,
                start: Optional[Callable] = None) -> PartialSources:
        """Layer l's source rows with the partials (`exchange`, `start`: the world group's blocking and
        posting exchanges, bound to `phase`).  start None: both parts blocking; given: the rows part is
        posted now (PendingRows) and the partials when the layer asks for them, each waited for last."""
        lay = self.layers[l]
        assert lay is not None
        route = None if lay.route is None else lay.route.bind(phase)  # the rows relayed, the partials direct
        rows: Union[torch.Tensor, PendingRows]
        if start is None:
            if route is not None:
                halo = routed_exchange(h, route.send_index, route, wire_dtype)
            else:
                halo = halo_exchange(h, lay.send_index, lay.send_counts, lay.recv_counts, exchange, wire_dtype)
            rows = torch.cat([h, halo], dim=0)
        elif route is not None:
            rows = routed_post(h, route.send_index, route, wire_dtype).rows(h)
        else:
            rows = halo_exchange_start(h, lay.send_index, lay.send_counts, lay.recv_counts, start, wire_dtype)

        def partials(m_own: torch.Tensor, layer) -> Callable[[], torch.Tensor]:
            kind = layer.weighted_sum
            if kind == RELATION_MEAN:  # each relation's sums at message width, projected by the layer
                products = lay.product(kind, layer.num_relations)
                mine = layer.project_partials([_Product.apply(m_own, *pair) for _, pair in products],
                                              [reached for reached, _ in products], sum(lay.p_send_counts))
            else:
                mine = _Product.apply(m_own, *lay.product(kind))
            if start is None:
                got = halo_exchange(mine, lay.p_index, lay.p_send_counts, lay.p_recv_counts, exchange, wire_dtype)
                summed = _Product.apply(got, *lay.receive)
                return lambda: summed
            posted = halo_exchange_post(mine, lay.p_index, lay.p_send_counts, lay.p_recv_counts, start,
                                        wire_dtype).rows(mine)
            return lambda: _Product.apply(posted.halo(), *lay.receive)
        return PartialSources(rows, lay.graph, partials)


def payload_of_run(cfg, view, model, row_dtype, comm, train_view=None) -> Optional[PartialPayload]:
    """Collective: --halo-payload partial / smaller for the world `view` of `model` (None for rows), or the
    same refusal (problem) on every rank.  train_view: the training plan (a LayeredView, engine/views.py);
    with --mode flx only its layers on `view` (after the k preloaded ones) send partials."""
    if cfg.halo_payload == "rows":
        return None
    L = len(model.convs)
    world_layers = [True] * L
    if cfg.mode == "flx" and train_view is not None:
        world_layers = [per is view for per in train_view.per_layer]
    with collective_errors(comm.topo.world, "", catch=(TrainingError,)):
        why = problem(cfg.halo_payload, cfg.mode, row_dtype, cfg.input_dropout, list(model.convs), world_layers)
        if why:
            raise TrainingError(why)
    # Layer 0 reads the input features, their halo exchanged at set-up, unless the model projects them
    # first or is residual (its encoder): then its rows are exchanged every pass like any layer's.
    static_first = not model.residual and not model.contract.input_projection
    static = [not world_layers[l] or (l == 0 and static_first) for l in range(L)]
    return plan_payload(view, cfg.halo_payload, list(model.convs), static,
                        lambda counts: comm.allreduce_scalar(counts, "sum"), view.device)


def plan_payload(view, payload: str, convs, static: Sequence[bool], allreduce: Callable,
                 device) -> PartialPayload:
    """Collective over the view's (world) group: the partial payload of `view` for the model's `convs`
    (its ``at(l)`` False at every layer where every pair sends rows).  static[l]: layer l sends rows only
    (layer 0 reading the input features, their halo rows exchanged once at set-up; flx's preloaded
    layers, which training runs on the server view).  allreduce(array): the sum over the world's ranks."""
    group, layers = view.exchange_group, view.plan.layers
    lp = layers[0]
    if any(other is not lp for other in layers):
        raise ValueError("--halo-payload: every layer must share the world view's plan (fb)")
    P, me = group.size, group.me
    rows_me, partials_me = receiver_counts(lp)
    rows, partials = np.zeros((P, P), np.int64), np.zeros((P, P), np.int64)
    rows[me], partials[me] = rows_me, partials_me
    rows, partials = np.asarray(allreduce(rows)), np.asarray(allreduce(partials))
    rows_once = None
    if group.per_server:  # [sender, receiving server]: distinct rows each sender sends to each other server
        server = np.asarray(group.peer_server, dtype=np.int64)
        dest = server[np.repeat(np.arange(P), lp.send_counts)]
        mine = np.zeros((P, int(server.max()) + 1), np.int64)
        pairs = np.unique(np.stack([dest, np.asarray(lp.send_index, np.int64)], 1), axis=0).reshape(-1, 2)
        mine[me] = np.bincount(pairs[:, 0], minlength=mine.shape[1])
        rows_once = np.asarray(allreduce(mine))
    use = choose(payload, rows, partials, group.peer_server, [c.in_features for c in convs],
                 [c.partial_width() for c in convs], static, rows_once)
    if not any(u.any() for u in use):
        return PartialPayload([None] * len(convs), use, (rows, partials), rows_once)
    # The entries of every pair that sends partials at some layer: receiver -> sender, once.
    any_use = np.logical_or.reduce(use)  # [sender, receiver]
    received = _Received(lp)
    graph = view.graphs[0]
    kinds = sorted({c.weighted_sum for c, u in zip(convs, use) if u.any()})
    coo_vals = []
    relation = np.zeros(lp.indices.size, dtype=np.int64)  # of every edge (RELATION_MEAN; else 0)
    for kind in kinds:
        if kind == RELATION_MEAN:  # the relations and coefficients are the model's (one typing for all)
            conv = next(c for c in convs if c.weighted_sum == kind)
            rel, coefficient = (t.cpu().numpy() for t in conv.relation_edges(graph))
            relation = rel.astype(np.int64)
            coo_vals.append(coefficient.astype(np.float32)[received.halo_edge])
            continue
        _, cols, vals = graph.coo(kind)
        n_edges = lp.indices.size  # gcn appends its self loops after the edges (never halo columns)
        coo_vals.append(_halo_values(graph, kind, cols, vals, n_edges, lp.n_own_in)[received.halo_edge])
    ask = any_use[received.peer, me]  # entries for senders that send this rank partials
    order = np.argsort(received.peer[ask], kind="stable")
    ask_peer = received.peer[ask][order]
    meta = np.stack([received.position[ask][order] - received.offsets[ask_peer],
                     received.col_in_block[ask][order], relation[received.halo_edge][ask][order]], axis=1)
    vals = np.stack([v[ask][order] for v in coo_vals], axis=1).astype(np.float32)
    entry_counts = np.bincount(ask_peer, minlength=P).astype(np.int64).tolist()
    got_counts = group.counts(entry_counts)
    got_meta = group.exchange(torch.as_tensor(meta.reshape(-1, 3), device=device), entry_counts, got_counts,
                              phase="setup").cpu().numpy().reshape(-1, 3)
    got_vals = group.exchange(torch.as_tensor(vals.reshape(-1, len(kinds)), device=device), entry_counts, got_counts,
                              phase="setup").cpu().numpy().reshape(-1, len(kinds))
    got_peer = np.repeat(np.arange(P), got_counts)
    send_off = np.concatenate([[0], np.cumsum(lp.send_counts)[:-1]]).astype(np.int64)
    own_row = np.asarray(lp.send_index, dtype=np.int64)[send_off[got_peer] + got_meta[:, 1]]
    sent = _Sent(partials[:, me].copy(), got_peer, got_meta[:, 0], own_row, got_meta[:, 2],
                 {kind: got_vals[:, i] for i, kind in enumerate(kinds)})
    made: Dict[bytes, _LayerPayload] = {}
    out: List[Optional[_LayerPayload]] = []
    for u in use:
        if not u.any():
            out.append(None)
            continue
        key = u.tobytes()
        if key not in made:
            made[key] = _LayerPayload(lp, graph, u[me, :], u[:, me], received, sent, device,
                                      _route_planner(view, device) if group.per_server else None)
        out.append(made[key])
    return PartialPayload(out, use, (rows, partials), rows_once)


def _halo_values(graph: LayerGraph, kind: str, cols, vals, n_edges: int, n_own: int) -> np.ndarray:
    """The coefficient of every edge of the layer (CSR order) for `kind`, from the graph's normalised
    COO (what fb's aggregation multiplies by); GCN's stored self loops (never halo edges) get 0."""
    out = np.zeros(n_edges, dtype=np.float32)
    cols, vals = cols.cpu().numpy(), vals.cpu().numpy()
    if kind != "gcn" or not graph.has_loops:
        out[:] = vals[:n_edges]
        return out
    rows = graph.edge_rows().cpu().numpy()
    off_diag = graph.indices.cpu().numpy() != rows
    out[off_diag] = vals[: int(off_diag.sum())]
    return out


def _route_planner(view, device) -> Callable:
    """plan(send_index, send_counts, recv_counts) -> the per-server ServerRoute of those rows (collective
    over the world, engine/halo_route.py); the relays take turns by the own rows' global ids."""
    group = view.exchange_group
    ids = (np.arange(view.num_own, dtype=np.int64) if view.row_ids is None
           else view.row_ids.cpu().numpy().astype(np.int64))

    def plan(send_index, send_counts, recv_counts):
        return ServerRoute(plan_server_route(send_index, send_counts, recv_counts, group.peer_server,
                                             group.peer_local, group.me, ids, group.counts, group.exchange,
                                             group.relay.counts, group.relay.exchange, device),
                           device, group, group.relay)
    return plan
