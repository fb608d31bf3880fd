"""Views: a rank's rows plus everything needed to run the model over them with exchanges.

Two views exist per rank, built by the same planner:
- the *server view* (preloaded training, `flx` / `eas`): own rows = this GPU's rows of its server's
  shard (inner + preloaded), halo = rows of the other GPUs of the same server, exchanged over the
  intra-server transport; the active set shrinks by one hop per layer;
- the *world view* (`fb` training and exact evaluation in every mode): own rows = this GPU's inner
  vertices, halo = their in-neighbours on any other rank, exchanged with every rank (intra-server
  peers over the intra-server transport, other servers over MPI); every row is active at every layer.

A training plan may use different views for different layers (`LayeredView`): Flexible Preloading
with k < L runs its first k layers on the server view of a k-hop preload and the remaining layers on
the world view.  Each view exchanges within one ExchangeGroup (cluster/exchange_group.py: its
peers, count exchange, ledger links and wire dtype); each layer of a plan names its group.

Static per-row data of halo rows (input features, degrees) is exchanged once, at set-up; so are
their global ids, when input dropout asks for them (`source_ids`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Collection, Dict, List, Optional, Union

import numpy as np
import torch

from granndis_hpc.cluster.exchange_group import ExchangeGroup
from granndis_hpc.engine.exchange import (halo_exchange, halo_exchange_post, halo_exchange_start, routed_exchange,
                                          routed_post, send_index_tensor)
from granndis_hpc.engine.halo_route import route_view
from granndis_hpc.engine.view_agree import agree_with_peers, row_signature
from granndis_hpc.nn.rows import HaloGather, RowSplit
from granndis_hpc.graph import planner
from granndis_hpc.graph.csr import owner_of, position_lookup
from granndis_hpc.graph.typed_features import TypedRows
from granndis_hpc.nn.graph import LayerGraph

if TYPE_CHECKING:
    from granndis_hpc.engine.partial import PartialPayload


@dataclass
class RowSource:
    """What the planner needs to know about one rank's rows, independent of the view."""

    hop: np.ndarray  # int64 [n], non-decreasing
    indptr: np.ndarray  # in-edges of the rows
    is_own: np.ndarray  # per edge
    own_pos: np.ndarray  # per edge (valid where is_own)
    peer: np.ndarray  # per edge (valid where not is_own): index in the exchange's peer numbering
    key: np.ndarray  # per edge: the key the peer resolves
    src_hop: np.ndarray  # per edge: hop of the source row
    degree: np.ndarray  # float [n]: normalisation degree of every own row
    # float32 [n, F], or a TypedRows (types of different widths: each row at its own width)
    features: Union[np.ndarray, TypedRows]
    # int64 [n]: the vertex id every rank and a single process know the row by (global id), which keys
    # its dropout masks (nn/dropout.py); None: the row's position (no shape-independence).
    global_id: Optional[np.ndarray] = None


def server_rows(sl, exact_degrees: bool) -> RowSource:
    """Rows of the preloaded server view from a RankSlice (shard rows of this GPU)."""
    src = sl.indices.astype(np.int64)
    offsets = sl.server_offsets.astype(np.int64)
    owner = owner_of(offsets, src)
    # Sampled (EAS) graphs are closed: normalise over the kept neighbours, not the global degree.
    degree = sl.in_degree if exact_degrees else np.diff(sl.indptr)
    return RowSource(
        hop=sl.hop.astype(np.int64), indptr=sl.indptr.astype(np.int64), is_own=owner == sl.gpu,
        own_pos=src - offsets[sl.gpu], peer=owner, key=src - offsets[owner],
        src_hop=sl.server_hop.astype(np.int64)[src], degree=degree.astype(np.float32),
        features=sl.features, global_id=sl.global_id)


def world_rows(sl, my_rank: int) -> RowSource:
    """Rows of the exact world view: this GPU's inner vertices and all their in-edges."""
    n = int(sl.n_inner)
    inner_gid = sl.global_id[:n]
    gid = sl.w_src_global_id.astype(np.int64)
    owner = sl.w_src_rank.astype(np.int64)
    is_own = owner == my_rank
    # Inner rows by locality block, not by id (preprocess/partition/row_blocks.py)
    pos = position_lookup(inner_gid)(gid)
    if np.any(is_own & (pos < 0)):
        raise planner.PlanError("world view names this rank as owner of a vertex it does not hold; "
                                "the shard is inconsistent: run `granndis preprocess verify`")
    return RowSource(
        hop=np.zeros(n, dtype=np.int64), indptr=sl.w_indptr.astype(np.int64), is_own=is_own,
        own_pos=pos, peer=owner, key=gid, src_hop=np.zeros_like(gid),
        degree=sl.in_degree[:n].astype(np.float32), features=sl.features[:n], global_id=inner_gid)


def stored_self_loops(rows: RowSource) -> np.ndarray:
    """Self-loop edges (v -> v) of every row: in-edges from the row itself, as counted in its degree."""
    n = rows.hop.shape[0]
    edge_row = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.indptr))
    on_diag = rows.is_own & (rows.own_pos == edge_row)
    return np.bincount(edge_row[on_diag], minlength=n).astype(np.float32)


def key_resolver_server(num_own: int):
    def resolve(keys):
        return np.where((keys >= 0) & (keys < num_own), keys, -1)
    return resolve


def key_resolver_world(inner_gid: np.ndarray):
    return position_lookup(inner_gid)


def _first_alike(layers, l: int) -> int:
    """The first layer with the same LayerPlan object as layer l."""
    return next(m for m in range(l + 1) if layers[m] is layers[l])


def _per_layer(layers, make) -> list:
    """make(lp) for every layer, once per distinct LayerPlan object: equal layers get the same result."""
    out: list = []
    for l, lp in enumerate(layers):
        m = _first_alike(layers, l)
        out.append(out[m] if m < l else make(lp))
    return out


def held_features(features, static_features: bool, device):
    """The view's own feature rows on the device: a matrix, or (types of different widths, read by a
    model that projects each type) a TypedRows at the rows' own widths, so nothing [rows, widest] is
    held.  A model that reads the features as they are (static_features: a homogeneous model on such a
    set) takes the zero-padded matrix: it is that model's input, [rows, widest] by definition."""
    if isinstance(features, TypedRows):
        return features.padded_tensor(device) if static_features else features.to(device)
    return torch.as_tensor(np.ascontiguousarray(features), device=device)


class View:
    """A planned view bound to a transport: builds LayerGraphs and the model's `gather` function."""

    def __init__(self, rows: RowSource, plan: planner.Plan, group: ExchangeGroup, device: torch.device,
                 static_phase: str = "setup", static_features: bool = True):
        self.plan, self.device, self.exchange_group, self._exchange = plan, device, group, group.exchange
        self.num_own = plan.num_own
        self.group = plan.group  # the group's name, as the plan records it
        self._send = _per_layer(plan.layers, lambda lp: send_index_tensor(lp.send_index, device))
        self._full_send = torch.as_tensor(plan.full_send_index, device=device)
        # --halo-route per-server: the world's rows cross servers once per server (engine/halo_route.py;
        # planned here, collective over the world); None: the direct route.
        self._routes, self._full_route = route_view(plan, group, device, rows.global_id)
        # Static halo data, exchanged once over the full plan: phase "setup" for a view built once,
        # "halo" for the per-iteration views of co-batched training (it is then per-step traffic).
        own_degree = torch.as_tensor(rows.degree, dtype=torch.float32, device=device).unsqueeze(1)
        own_loops = torch.as_tensor(stored_self_loops(rows), dtype=torch.float32, device=device)
        # A halo row's degree is read only by GCN's source normalisation, degree - loops + 1 (nn/graph.py):
        # send it without the row's stored self loops (and give the halo row 0 loops), so the static
        # exchange stays one column (and is unchanged on graphs without loops).
        halo_degree = self.exchange_full(own_degree - own_loops.unsqueeze(1), phase=static_phase).squeeze(1)
        self.features = held_features(rows.features, static_features, device)
        # static_features False: the model reads its own projection of the features at layer 0
        # (ModelContract.input_projection), so the halo's feature rows are never read: not exchanged or held.
        self.halo_features = self.exchange_full(self.features, phase=static_phase) if static_features else None
        # One tensor object: gather recognises it (by identity) as the static input of layer 0.
        self.input_features = self.features[: plan.layers[0].n_own_in]

        def layer_graph(lp):
            src_degree = torch.cat([own_degree.squeeze(1)[: lp.n_own_in],
                                    halo_degree[torch.as_tensor(lp.halo_rows, device=device)]])
            return LayerGraph(
                n_dst=lp.n_dst, n_src=lp.n_src,
                indptr=torch.as_tensor(lp.indptr, device=device),
                indices=torch.as_tensor(lp.indices, device=device),
                dst_degree=own_degree.squeeze(1)[: lp.n_dst].contiguous(),
                src_degree=src_degree.contiguous(),
                src_loops=torch.cat([own_loops[: lp.n_own_in], own_loops.new_zeros(lp.n_src - lp.n_own_in)]))
        # Layers with one LayerPlan (the world view's: every row at every layer) share one LayerGraph,
        # so its matrices are built and cached once.
        self.graphs: List[LayerGraph] = _per_layer(plan.layers, layer_graph)
        self._halo_rows = _per_layer(plan.layers, lambda lp: torch.as_tensor(lp.halo_rows, device=device))
        # Global ids of the own rows (every layer's rows are a prefix): what dropout masks are keyed by.
        self.row_ids = (None if rows.global_id is None
                        else torch.as_tensor(np.asarray(rows.global_id, dtype=np.int64), device=device))
        self._static_phase, self._source_ids = static_phase, None
        # --halo-payload: where layers send partial aggregates (engine/partial.py; set by the trainer)
        self.payload: Optional[PartialPayload] = None

    @classmethod
    def assembled(cls, plan: planner.Plan, group: ExchangeGroup, device: torch.device, features,
                  halo_features: Optional[torch.Tensor], graphs: List[LayerGraph], row_ids: Optional[torch.Tensor],
                  source_ids: Optional[torch.Tensor], static_phase: str = "halo", put=None) -> "View":
        """A view whose static per-row data is already at hand (engine/cobplan.py: a co-batch planned from
        host memory), so nothing is exchanged to build it: the same object __init__ makes, given its parts.
        put(array): how the plan's host arrays go to the device (cob's loader stream)."""
        put = put or (lambda a: torch.as_tensor(a, device=device))
        self = cls.__new__(cls)
        self.plan, self.device, self.exchange_group, self._exchange = plan, device, group, group.exchange
        self.num_own, self.group = plan.num_own, plan.group
        self._send = [send_index_tensor(lp.send_index, device, put) for lp in plan.layers]
        self._full_send = put(plan.full_send_index)
        self._routes = self._full_route = None  # a co-batch's views exchange on the direct route
        self.features, self.halo_features = features, halo_features
        self.input_features = features[: plan.layers[0].n_own_in]
        self.graphs = list(graphs)
        self._halo_rows = [put(lp.halo_rows) for lp in plan.layers]
        self.row_ids, self._static_phase, self._source_ids = row_ids, static_phase, source_ids
        self.payload = None
        return self

    def source_ids(self) -> Optional[torch.Tensor]:
        """Global ids of layer 0's source rows (own rows, then halo rows), keying input dropout
        (nn/dropout.py RowDropout.sources); None without row ids.  Collective over the view's peers on
        the first call (the halo rows' ids are exchanged once, like their features), cached after."""
        if self.row_ids is None:
            return None
        if self._source_ids is None:
            self._source_ids = self._layer_source_ids(0)
        return self._source_ids

    def _layer_source_ids(self, l: int) -> torch.Tensor:
        """Global ids of layer l's source rows (own rows, then halo rows); the halo rows' ids are
        exchanged on the first call (collective over the view's peers), cached after."""
        if self.row_ids is None:
            raise ValueError("source ids: this view's rows have no global ids")
        if self.__dict__.get("_halo_ids") is None:
            self._halo_ids = self.exchange_full(self.row_ids.unsqueeze(1), phase=self._static_phase).squeeze(1)
        return torch.cat([self.row_ids[: self.plan.layers[l].n_own_in],
                          self._halo_ids.index_select(0, self._halo_rows[l])])

    def attach_source_ids(self) -> None:
        """Give every layer graph the global ids of its source rows (``graph.source_ids``), which key
        edge-wise dropout (GAT's attention, nn/edge_layers.py) like rows key feature dropout.
        Collective over the view's peers on the first call (shared with source_ids)."""
        if self.row_ids is None:
            return
        for l, graph in enumerate(self.graphs):
            if graph.source_ids is None:
                graph.source_ids = self._layer_source_ids(l)

    def exchange_full(self, own: torch.Tensor, phase: str) -> torch.Tensor:
        """All halo rows (HaloTable order) of a per-row tensor of the own rows."""
        if self._full_route is not None:
            route = self._full_route.bind(phase)
            return route.forward(own.index_select(0, route.send_index).contiguous())
        return self._exchange(own.index_select(0, self._full_send).contiguous(),
                              self.plan.full_send_counts.tolist(), self.plan.halo.counts().tolist(),
                              phase=phase)

    @property
    def layer_row_ids(self) -> Optional[tuple]:
        """Dropout's row ids per layer (nn/dropout.py RowIds): one tensor serves every layer, since each
        layer's own rows are a prefix of the view's rows; None without global ids."""
        return None if self.row_ids is None else (self.row_ids,)

    def gather_fn(self, phase: str, overlap: Collection[str] = ()) -> HaloGather:
        """The model's gather(l, h): own rows h -> [h | halo rows of layer l].

        Layer 0 reading the raw input features uses the halo features exchanged at set-up (they are
        static) instead of exchanging them every epoch.  overlap: the exchange group names whose halos
        overlap (config.OVERLAP_HALOS, --overlap-halos); when this view's group is one of them, return
        nn/rows.PendingRows (the exchange posted, the halo in flight) for the model's convs to
        aggregate the own rows' edges first (engine/exchange.py).  Halo rows travel in the group's wire
        dtype in the training phase ("halo", --halo-dtype); evaluation and set-up exchanges are exact.
        """
        # A view of one peer (one rank; one rank per server for "server" views) has no halo: its layers
        # read their own rows as they are, with no exchange, no cat copy of h and no autograd node.
        alone = self.exchange_group.size == 1 and all(lp.n_src == lp.n_own_in for lp in self.plan.layers)
        overlapped = self.exchange_group.name in overlap and not alone
        wire_dtype = self.exchange_group.halo_wire(phase)
        exchange = functools.partial(self._exchange, phase=phase)
        start = functools.partial(self.exchange_group.start, phase=phase)
        x0 = self.input_features
        routes = None if self._routes is None else [route.bind(phase) for route in self._routes]
        # Layer -> PostedHalo, posted from the layer's send rows before its other rows exist.
        posted: Dict[int, Any] = {}
        payload = self.payload

        def gather(l: int, h: torch.Tensor) -> torch.Tensor:
            if alone:
                return h
            lp = self.plan.layers[l]
            if l in posted:
                if h.shape[0] != lp.n_own_in:
                    raise ValueError(f"gather layer {l}: {h.shape[0]} own rows, the plan has {lp.n_own_in}")
                return posted.pop(l).rows(h)
            if payload is not None and payload.at(l):  # some peers send partial aggregates
                return payload.sources(l, h, phase, exchange, wire_dtype, start if overlapped else None)
            if l == 0 and h is x0:
                if self.halo_features is None:
                    raise ValueError("gather layer 0: the view holds no halo feature rows (built for a model whose "
                                     "contract declares input_projection), but the model gathered its features")
                halo = self.halo_features.index_select(0, self._halo_rows[0])
            elif routes is not None:  # the per-server route (blocking or overlapped)
                if overlapped:
                    return routed_post(h, routes[l].send_index, routes[l], wire_dtype).rows(h)
                halo = routed_exchange(h, routes[l].send_index, routes[l], wire_dtype)
            elif overlapped:
                return halo_exchange_start(h, self._send[l], lp.send_counts.tolist(), lp.recv_counts.tolist(),
                                           start, wire_dtype)
            else:
                halo = halo_exchange(h, self._send[l], lp.send_counts.tolist(), lp.recv_counts.tolist(),
                                     exchange, wire_dtype)
            return torch.cat([h, halo], dim=0)

        if overlapped:
            def post(l: int, rows: torch.Tensor) -> None:
                """Post layer l's exchange from rows = the own rows boundary(l).first (in that order)."""
                lp, (split, position) = self.plan.layers[l], self._row_split(l)
                if rows.shape[0] != split.first.shape[0] or l in posted:
                    raise ValueError(f"gather.post layer {l}: {rows.shape[0]} rows for {split.first.shape[0]} "
                                     f"send rows{' (posted twice)' if l in posted else ''}")
                if routes is not None:  # the route's send rows, as positions among the boundary rows
                    posted[l] = routed_post(rows, self._route_position(l, split), routes[l], wire_dtype)
                    return
                posted[l] = halo_exchange_post(rows, position, lp.send_counts.tolist(), lp.recv_counts.tolist(),
                                               start, wire_dtype)

            def boundary(l: int) -> Optional[RowSplit]:
                # A layer that sends partials posts them from its own messages, not from the rows the
                # layer below computes: no boundary-first split for it.
                return None if payload is not None and payload.at(l) else self._row_split(l)[0]

            return HaloGather(gather, boundary, post)
        return HaloGather(gather)

    def layer_counts(self) -> List[dict]:
        """Per layer, what the overlap cost model (granndis_hpc/report/linkmodel.py) reads of this rank's plan:
        the view's exchange group, the distinct own rows the layer's exchange sends (the boundary rows a
        boundary-first layer below computes before posting), the halo rows it receives, and the layer's
        edges and those whose source is a halo row (the product that must wait for the halo).  Built once."""
        if "_layer_counts" not in self.__dict__:
            self._layer_counts = [
                {"group": self.group, "send_rows": int(np.unique(lp.send_index).size),
                 "halo_rows": int(lp.n_src - lp.n_own_in), "edges": int(g.indices.shape[0]),
                 "halo_edges": int((g.indices >= lp.n_own_in).sum())}
                for lp, g in zip(self.plan.layers, self.graphs)]
        return self._layer_counts

    def _route_position(self, l: int, split: RowSplit) -> torch.Tensor:
        """The per-server route's send rows of layer l as positions in its boundary rows (built once)."""
        cached = self.__dict__.setdefault("_route_positions", {})
        if l not in cached:
            cached[l] = torch.searchsorted(split.first, self._routes[l].send_index)
        return cached[l]

    def _row_split(self, l: int):
        """(RowSplit of layer l's own rows into the rows it sends and the others, the send index as
        positions in the first group), built once per view and layer."""
        splits = self.__dict__.setdefault("_row_splits", {})
        l = _first_alike(self.plan.layers, l)  # layers sharing a plan share the split (and its matrices)
        if l not in splits:
            first, position = torch.unique(self._send[l], sorted=True, return_inverse=True)
            splits[l] = (RowSplit(first, self.plan.layers[l].n_own_in), position)
        return splits[l]


class LayeredView:
    """A training plan whose layer l runs on `per_layer[l]`: that view's layer-l graph and exchange.

    Views are indexed by the plan's layer number, so a view that serves layers [k, L) must be planned
    for at least L layers (the world view: every layer the same) and one serving [0, k) for k layers
    (the server view of a k-hop preload: layer l computes hop <= k-1-l).  Where the plan switches
    views, the rows the first computes must be the rows the second starts from: both views order a
    rank's inner vertices identically (the shard's order), which is checked here.
    """

    def __init__(self, per_layer):
        self.per_layer = list(per_layer)
        if not self.per_layer:
            raise planner.PlanError("a plan needs at least one layer")
        self.input_features = self.per_layer[0].input_features
        self.graphs = [view.graphs[l] for l, view in enumerate(self.per_layer)]
        self.groups = [view.group for view in self.per_layer]
        for l in range(1, len(self.per_layer)):
            before, after = self.per_layer[l - 1], self.per_layer[l]
            if before is not after and self.graphs[l - 1].n_dst != after.plan.layers[l].n_own_in:
                raise planner.PlanError(
                    f"layer {l + 1} switches from the {before.group} view to the {after.group} view, but "
                    f"the first computes {self.graphs[l - 1].n_dst} rows and the second reads "
                    f"{after.plan.layers[l].n_own_in}: the shard's views disagree; run `granndis "
                    f"preprocess verify`")
            # Dropout keys rows by global id: the rows must also be the same vertices, not just as many.
            n = self.graphs[l - 1].n_dst
            if (before is not after and before.row_ids is not None and after.row_ids is not None
                    and not torch.equal(before.row_ids[:n], after.row_ids[:n])):
                raise planner.PlanError(
                    f"layer {l + 1} switches from the {before.group} view to the {after.group} view, but the "
                    f"two order the rank's inner vertices differently; run `granndis preprocess verify`")
        # Layer l's own rows (dropout's row ids): a prefix of its view's rows.
        ids = [view.row_ids for view in self.per_layer]
        self.layer_row_ids = tuple(ids)

    def layer_counts(self) -> List[dict]:
        """Layer l's counts (View.layer_counts) from the view that runs it."""
        return [view.layer_counts()[l] for l, view in enumerate(self.per_layer)]

    def source_ids(self) -> Optional[torch.Tensor]:
        """Layer 0's source-row ids: those of the view that runs layer 0 (View.source_ids)."""
        return self.per_layer[0].source_ids()

    def attach_source_ids(self) -> None:
        """Every view's graphs get their source rows' global ids (View.attach_source_ids); collective."""
        for view in self.views:
            view.attach_source_ids()

    @property
    def views(self):
        """The distinct views of the plan, in layer order."""
        out = []
        for view in self.per_layer:
            if not any(view is seen for seen in out):
                out.append(view)
        return out

    def gather_fn(self, phase: str, overlap: Collection[str] = ()) -> HaloGather:
        by_view = {id(view): view.gather_fn(phase, overlap) for view in self.views}
        per_layer = [by_view[id(view)] for view in self.per_layer]

        def gather(l: int, h: torch.Tensor) -> torch.Tensor:
            return per_layer[l](l, h)

        # Boundary-first pipelining wherever layer l's view overlaps its exchange: under the default
        # --overlap-halos world, flx k < L's world layers do while its server layers do not, and the
        # model computes layer l - 1's send rows first for the layers whose boundary is not None.
        if not any(g.boundary is not None for g in per_layer):
            return HaloGather(gather)

        def boundary(l: int):
            at = per_layer[l].boundary
            return None if at is None else at(l)

        def post(l: int, rows: torch.Tensor) -> None:
            at = per_layer[l].post
            assert at is not None  # (the runner posts only a layer whose boundary it was given)
            at(l, rows)
        return HaloGather(gather, boundary, post)


def build_view(rows: RowSource, group: ExchangeGroup, num_layers: int, all_active: bool, resolve_keys,
               device, exact: bool = True, static_phase: str = "setup", static_features: bool = True) -> View:
    """Plan one view.  The one communication step: tell every owner which of its rows we need.

    group: the view's peers (cluster/exchange_group.py): its exchange moves rows between them, its count
    exchange sizes it, and the plan records its name.
    exact: rows.degree are global degrees and every computed row must have all its in-edges.
    static_features: exchange the halo rows' input features once (False: the model projects them first,
    ModelContract.input_projection, and exchanges the projected rows).
    """
    num_peers, alltoall_counts, exchange = group.size, group.counts, group.exchange
    # A view built once (static_phase "setup") agrees with its peers, before each exchange, that every
    # peer planned without error and sends rows of the same width and dtype: the exchange sizes its
    # rows from local data, so a peer with another feature width would corrupt memory or hang it.
    # Per-step views of co-batched training read rows already checked against the
    # manifest (shards.read_server_rows) and skip the extra all-to-alls.
    agree = static_phase == "setup" and num_peers > 1
    signature = row_signature(rows.features)

    def agreed(step):
        """step(), then (a view built once) tell the peers whether it failed and check their rows."""
        problem, out = None, None
        try:
            out = step()
        except planner.PlanError as exc:
            if not agree:
                raise
            problem = exc
        if agree:
            agree_with_peers(alltoall_counts, num_peers, signature, problem, rows.features)
        return out

    table, sources = agreed(lambda: planner.build_halo(num_peers, rows.is_own, rows.own_pos, rows.peer, rows.key,
                                                       rows.src_hop))
    keys, counts = table.requests()
    send_counts = np.asarray(alltoall_counts([int(c) for c in counts]), dtype=np.int64)
    asked = exchange(torch.as_tensor(keys, dtype=torch.int64, device=device).reshape(-1, 1), counts.tolist(),
                     send_counts.tolist(), phase="setup").reshape(-1).cpu().numpy()
    plan = agreed(lambda: planner.build_plan(rows.hop, rows.indptr, sources, table,
                                             planner.resolve_requests(asked, resolve_keys), send_counts,
                                             num_layers, all_active=all_active,
                                             complete_degree=rows.degree if exact else None, group=group.name))
    return View(rows, plan, group, device, static_phase=static_phase, static_features=static_features)
