"""The layer contract: a layer is a pure module over (source rows, destination rows, its one-hop graph).

Like PyG's bipartite convolutions, a layer maps the source rows ``h_src`` [n_src, in] of its
``LayerGraph`` to the destination rows [n_dst, out]; the destination rows are the first n_dst source
rows, so ``h_dst = h_src[:n_dst]``.  A layer knows nothing of the exchange, the overlap, dropout masks or
checkpointing: the engine's layer runner (engine/runner.py) owns them, for every layer alike.  So that
the runner can overlap the halo exchange, a layer comes in four parts:

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
``reads_dst``: ``update`` reads the destination rows; a layer whose update does not (GCN: a vertex's own
row enters through the aggregation's self-loop) sets it False and gets ``h_dst = None``, so the runner
does not copy a row split's destination rows out of the source rows for it (at layer 0 of Cora, rows
1433 wide: the largest transient of GCN's overlapped step).

A layer holds no memory-model code: its sizes (parameters, the bytes autograd saves per row and per
edge) are declared beside the model's estimate (granndis_hpc/memory_model/stacks.py and zoo_stacks.py).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

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


class Layer(nn.Module):
    """Base class of the layers of nn/layers.py and nn/edge_layers.py (the contract above)."""

    splits_sources = True
    splits_rows = False
    reads_dst = True

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
