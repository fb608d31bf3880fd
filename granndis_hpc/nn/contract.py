"""The layer contract: a layer is a pure module over (source rows, destination rows, its one-hop graph).

Like PyG's bipartite convolutions, a layer maps the source rows ``h_src`` [n_src, in] of its
``LayerGraph`` to the destination rows [n_dst, out]; the destination rows are the first n_dst source
rows, so ``h_dst = h_src[:n_dst]``.  A layer knows nothing of the exchange, the overlap, dropout masks or
checkpointing: the layer runner (nn/runner.py) owns them, for every layer alike.  So that
the runner (nn/runner.py) can overlap the halo exchange, a layer comes in four parts:

    message(h, call)                    row-wise transform of source rows (a projection), applied to
                                        each group of source rows once (own rows now, halo on arrival)
    aggregate_part(part, m, call)       the partial aggregate of the edges of ``part`` (a GraphPart:
                                        own-source edges, halo-source edges, or all; all destination rows
                                        or a subset of them) from those sources' messages ``m``
    combine(partials, call)             the aggregate from the partials (sum by default; a maximum or a
                                        softmax combine exactly, see nn/edge_layers.py)
    update(h_dst, aggregated, call)     the output rows, row-wise over the destination rows

``forward(h_src, graph, attention=None)`` runs them on the whole graph in one part.  The runner calls
the parts itself: own-source part, then (after the halo arrives) halo-source part, combine, update; and
with boundary-first pipelining the same over two groups of destination rows.  ``call`` (a LayerCall)
carries what one call of a layer shares between its parts: the graph, the own source rows' count when
the sources are split, the messages of the own rows (a destination row's message is its own), the
attention dropout of the pass, and a scratch dict.

A layer that cannot be split sets ``splits_sources = False`` and implements ``forward`` only: the
runner waits for the halo and calls it on the whole block.  ``splits_rows``: its parts may also be
restricted to a subset of destination rows (row-restricted sparse products: SAGE, GCN).
``weighted_sum``: the aggregation is a weighted sum of the messages (its kind), which lets a server
send partial aggregates instead of rows (engine/partial.py); for the kind "relation-mean" (R-GCN) the
sums are per relation and projected by the layer before they are sent (``relation_edges``,
``project_partials``).
``reads_dst``: ``update`` reads the destination rows; a layer whose update does not (GCN: a vertex's own
row enters through the aggregation's self-loop) sets it False and gets ``h_dst = None``, so the runner
does not copy a row split's destination rows out of the source rows for it (at layer 0 of Cora, rows
1433 wide: the largest transient of GCN's overlapped step).

The model contract (``ModelContract``): what the engine may ask of a model, declared by its class as
``contract`` and checked when the model is built (nn/models.py check_model); the engine reads it once
(engine/trainer.py, engine/predict.py) and writes nothing onto a model.  What one run asks of every pass
(--input-dropout, --checkpoint-activations, --precision's row dtype) is a ``PassSettings`` the engine
hands to ``forward``.

A layer holds no memory-model code: its sizes (parameters, the bytes autograd saves per row and per
edge) are declared beside the model's estimate (granndis_hpc/memory_model/stacks.py and zoo_stacks.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional

import torch
from torch import nn

from .graph import GraphPart, LayerGraph


class LayerCall:
    """What the parts of one call of a layer share (made by the runner, or by ``Layer.forward``)."""

    __slots__ = ("graph", "n_own", "attention", "own_messages", "state")

    def __init__(self, graph: LayerGraph, attention=None, n_own: Optional[int] = None):
        self.graph, self.attention, self.n_own = graph, attention, n_own
        self.own_messages: Any = None  # message() of the own source rows (or of all, unsplit)
        self.state: Dict[str, Any] = {}

    @property
    def split_sources(self) -> bool:
        """The sources come in two parts (the halo in flight)."""
        return self.n_own is not None


# Layer.weighted_sum of a relation-wise mean whose relations are projected apart (R-GCN).
RELATION_MEAN = "relation-mean"

# The rows input dropout applies to (ModelContract.input_dropout_rows), and the graphs a model reads
# graph.source_ids from (ModelContract.source_ids).
INPUT_DROPOUT_ROWS = ("sources", "own")
SOURCE_IDS = ("none", "training", "all")


@dataclass(frozen=True)
class ModelContract:
    """What the engine may ask of a model (a class attribute ``contract``, or set by its constructor).

    keyed: ``forward(x, graphs, gather, dropout=RowDropout, settings=PassSettings)``: dropout masks keyed
        by (seed, epoch, layer, global row id), the same on every cluster shape; False: ``forward(x,
        graphs, gather)`` draws its own (refused with --input-dropout, and resumes only on the same shape).
    pending_rows: ``gather`` may return ``PendingRows`` (the halo in flight), which the layer runner
        overlaps with the layers' own-source parts; False: it gets tensors.
    input_dropout_rows: the rows --input-dropout drops: "sources" (layer 0's gathered source rows, halo
        rows included, by their global ids), "own" (the own rows), None (refused with --input-dropout).
    first_layer_prefix: the parameter-name prefix of the layer that reads the input features
        (--weight-decay-on first).
    source_ids: the graphs whose ``graph.source_ids`` (the source rows' global ids) the model reads:
        "training" (attention dropout keyed by edge), "all" (a typed model: vertex types from ids), "none".
    input_projection: the model maps the input features through learnable per-row Linears before layer 0
        (nn/hetero_models.py: one per vertex type, each from its type's width), so layer 0's source rows
        are its projected rows, and so are the first rows the engine exchanges: layer 0's halo rows travel
        every step like any layer's (gather(0, h) takes the halo's features exchanged at set-up only
        when h is the input features themselves, engine/views.py), and input dropout, attention and
        the layer-0 exchange's bytes are those of the projected rows' width.
    """

    keyed: bool = True
    pending_rows: bool = True
    input_dropout_rows: Optional[str] = None
    first_layer_prefix: str = "convs.0."
    source_ids: str = "none"
    input_projection: bool = False

    def problem(self) -> Optional[str]:
        """What is wrong with the declared values (None: nothing)."""
        if self.input_dropout_rows not in (None,) + INPUT_DROPOUT_ROWS:
            return f"input_dropout_rows must be one of {INPUT_DROPOUT_ROWS} or None, got {self.input_dropout_rows!r}"
        if self.source_ids not in SOURCE_IDS:
            return f"source_ids must be one of {SOURCE_IDS}, got {self.source_ids!r}"
        if not isinstance(self.first_layer_prefix, str) or not self.first_layer_prefix:
            return f"first_layer_prefix must be a non-empty string, got {self.first_layer_prefix!r}"
        return None


@dataclass(frozen=True)
class PassSettings:
    """What a run asks of every pass of a keyed model (ModelContract.keyed), from its options.

    input_dropout: --input-dropout, on the rows ModelContract.input_dropout_rows names.
    checkpoint_activations: --checkpoint-activations: residual blocks recomputed in the backward.
    row_dtype: --precision bf16: every layer's source rows and output rows rounded to it
        (engine/precision.py); None: as computed."""

    input_dropout: float = 0.0
    checkpoint_activations: bool = False
    row_dtype: Optional[torch.dtype] = None


class Layer(nn.Module):
    """Base class of the layers of nn/layers.py and nn/edge_layers.py (the contract above)."""

    splits_sources: ClassVar[bool] = True
    splits_rows: ClassVar[bool] = False
    reads_dst: ClassVar[bool] = True
    # The aggregation kind of nn/graph.py ("mean", "gcn", "sum") where the layer's aggregate is that
    # weighted sum of its messages over the in-edges (aggregate_part is ``aggregate(part, m, kind)``,
    # combine the sum) and an unsplit call's messages are ``message_width()`` wide: a server may then
    # send a destination row the partial sum of its own rows' contributions instead of the rows
    # (--halo-payload, engine/partial.py), added to the aggregate.  RELATION_MEAN: the output is
    # ``update`` of the aggregate plus sum_r mean_{u in N_r(v)} m(u) W_r, linear in the messages m (R-GCN):
    # a partial row is then sum_r of the relation's weighted sum of the sender's messages (coefficients
    # ``relation_edges``), projected (``project_partials``, ``partial_width()`` wide), and added to the
    # output of ``update`` of the other sources' aggregate.  None: the aggregation is no such sum.
    weighted_sum: ClassVar[Optional[str]] = None

    def message_width(self) -> int:
        """The width of message() on an unsplit call (weighted-sum layers: they project first when that
        narrows, so min(in, out))."""
        return min(int(getattr(self, "in_features")), int(getattr(self, "out_features")))

    def partial_width(self) -> int:
        """The width of a partial row this layer's server sends (--halo-payload): its messages', or for
        RELATION_MEAN the projected rows' (the output width)."""
        return self.message_width()

    def relation_edges(self, graph: LayerGraph):
        """RELATION_MEAN: (relation [nnz] int64, coefficient [nnz] float32) of every in-edge of `graph` in
        its CSR order, the coefficient the weight of the source's message in its relation's sum."""
        raise NotImplementedError(f"{type(self).__name__} has no relation-wise weighted sum")

    def project_partials(self, sums: List[torch.Tensor], rows: List[torch.Tensor], n: int) -> torch.Tensor:
        """RELATION_MEAN: [n, partial_width()] partial rows from each relation r's weighted sums
        ``sums[r]`` [len(rows[r]), message width] of the rows ``rows[r]`` (int64 indices into the n)."""
        raise NotImplementedError(f"{type(self).__name__} has no relation-wise weighted sum")

    def message(self, h: torch.Tensor, call: LayerCall):
        return h

    def aggregate_part(self, part: GraphPart, m, call: LayerCall):
        raise NotImplementedError

    def combine(self, partials: List[Any], call: LayerCall):
        out = partials[0]
        for p in partials[1:]:
            out = out + p
        return out

    def update(self, h_dst: Optional[torch.Tensor], aggregated, call: LayerCall) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, h_src: torch.Tensor, graph: LayerGraph, attention=None) -> torch.Tensor:
        call = LayerCall(graph, attention)
        m = call.own_messages = self.message(h_src, call)
        aggregated = self.combine([self.aggregate_part(GraphPart(graph), m, call)], call)
        return self.update(dst_rows(h_src, graph.n_dst) if self.reads_dst else None, aggregated, call)


def dst_rows(h_src: torch.Tensor, n_dst: int) -> torch.Tensor:
    """h_src[:n_dst], or h_src itself when it has no more rows (one rank, no halo): a slice's backward
    would allocate a zero gradient of h_src's size and copy into it."""
    return h_src if h_src.shape[0] == n_dst else h_src[:n_dst]
