"""The layer runner: runs a model's stack of layers (nn/contract.py) over the per-layer one-hop graphs.

It owns, for every layer alike, what a layer itself knows nothing of:
- the halo exchange: ``gather(l, h)`` (engine/views.py) turns layer l's own rows into its source rows,
  a tensor cat(own, halo) or ``PendingRows`` (the exchange posted, the halo in flight);
- the overlap: with the halo in flight, a layer that splits its sources computes its own-source part,
  then waits and computes its halo-source part, and combines them; a layer that does not is called on
  cat(own, halo) after the wait;
- boundary-first pipelining: where ``gather.boundary(l + 1)`` names the rows the next exchange sends, a
  layer that splits its destination rows computes those first; they are activated, dropped and posted
  (``gather.post``), and the other rows are computed while they travel;
- dropout keyed by vertex id (nn/dropout.py RowDropout; attention dropout keyed by edge, EdgeDropout),
  applied to a layer's own rows before the exchange, so a halo row carries its owner's mask, and input
  dropout on layer 0's gathered source rows (or on the own rows, per the stack);
- activation checkpointing of residual blocks, and the rounding of every layer's rows to the pass's
  row dtype (the pass's ``PassSettings``, nn/contract.py, as --checkpoint-activations and --precision).

A stack (nn/models.py GNN) declares ``convs``, ``norms`` (before layer l >= 1: ``norms[l - 1]``),
``activation``, the per-vertex ``linears`` after the convs (--linear-layers), and ``residual``: False,
conv -> [norm] -> act -> dropout -> conv ...; True, ResSAGE+'s encoder -> conv_0, then pre-norm residual
blocks h = h + conv(dropout(act(norm(h)))) and ``out_norm`` -> act -> dropout -> ``head``.
Without ``gather`` (a single process on the whole graph) every layer's own rows are its source rows.
No MPI here: the exchange is ``gather``'s.  It sits beside the layers (``GNN.forward`` calls it); the
engine gives it ``gather``, the keyed ``RowDropout`` and the ``PassSettings``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.utils.checkpoint

from .contract import RELATION_MEAN, Layer, LayerCall, PassSettings, dst_rows
from .dropout import RowDropout
from .edge_layers import EdgeDropout
from .graph import GraphPart, LayerGraph
from .rows import PartialSources, PendingRows, SplitRows, materialize

DEFAULT_SETTINGS = PassSettings()


def call_layer(layer: Layer, h_src, graph: LayerGraph, attention=None, split=None,
               dtype: Optional[torch.dtype] = None):
    """layer over h_src (a tensor or PendingRows) -> its destination rows; SplitRows over `split` (a
    RowSplit of the destination rows: the first rows now, the rest on demand) when given.
    With a ``dtype`` (the pass's row dtype: --precision bf16, engine/precision.py) the layer reads and
    returns its rows rounded to it, each part when it is there (the halo on arrival, the rest rows when
    asked for)."""
    if dtype is None:
        return _call_layer(layer, h_src, graph, attention, split)
    return _rounded(_call_layer(layer, _rounded(h_src, dtype), graph, attention, split), dtype)


def _rounded(h, dtype):
    def rounded(t):
        return t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t
    return h.map(rounded) if isinstance(h, (PendingRows, SplitRows)) else rounded(h)


def _call_layer(layer: Layer, h_src, graph: LayerGraph, attention=None, split=None):
    if isinstance(h_src, PartialSources):
        return _call_partial(layer, h_src, attention, split)
    pending = isinstance(h_src, PendingRows)
    if pending and not layer.splits_sources:
        h_src, pending = h_src.materialize(), False  # the wait, then the whole block
    if split is not None and not layer.splits_rows:
        out = _call_layer(layer, h_src, graph, attention)
        return SplitRows(split, out.index_select(0, split.first), lambda: out.index_select(0, split.rest))
    if not pending and split is None:
        return layer(h_src, graph, attention)
    if pending:
        call = LayerCall(graph, attention, n_own=h_src.own.shape[0])
        messages = h_src.map(lambda rows: layer.message(rows, call))  # the halo's on arrival, once
        call.own_messages, own = messages.own, h_src.own
    else:
        call = LayerCall(graph, attention)
        messages = call.own_messages = layer.message(h_src, call)
        own = h_src
    n_own = own.shape[0]

    def rows_out(rows):
        if pending:
            partials = [layer.aggregate_part(GraphPart(graph, "own", n_own, rows), messages.own, call)]
            # The wait (once): everything above overlapped the transfer.  Even without halo rows the
            # halo part stays in the graph: its backward posts the reverse exchange the peers wait for.
            partials.append(layer.aggregate_part(GraphPart(graph, "halo", n_own, rows), messages.halo(), call))
        else:
            partials = [layer.aggregate_part(GraphPart(graph, None, None, rows), messages, call)]
        h_dst = None  # a layer that does not read them (reads_dst False) gets no copy of them
        if layer.reads_dst:
            h_dst = dst_rows(own, graph.n_dst)
            if rows is not None:  # a copy of those rows: [rows, in] at the layer's input width
                h_dst = h_dst.index_select(0, rows[1].first if rows[0] == "first" else rows[1].rest)
        return layer.update(h_dst, layer.combine(partials, call), call)

    if split is None:
        return rows_out(None)
    return SplitRows(split, rows_out(("first", split)), lambda: rows_out(("rest", split)))


def _call_partial(layer: Layer, sources: PartialSources, attention, split):
    """A weighted-sum layer over source rows some of whose peers sent partial aggregates: the aggregate
    of the rows at hand plus the partials (the same weighted sum in another order of addition).

    With the rows part in flight (PendingRows) the partials are posted as soon as the own messages exist,
    the own rows' edges are aggregated while both travel, then the halo rows' edges and the partials are
    added as they arrive.  Over a RowSplit the whole layer is computed, then split (the partials' exchange
    is of the whole layer's destination rows).  A RELATION_MEAN layer's partials are projected rows: they
    are added to its output instead (nn/contract.py)."""
    kind = layer.weighted_sum
    if kind is None or attention is not None:
        raise ValueError(f"{type(layer).__name__}: partial aggregates need a layer whose aggregation is a "
                         "weighted sum (Layer.weighted_sum), without attention dropout; use --halo-payload rows")
    if split is not None:
        out = _call_partial(layer, sources, attention, None)
        return SplitRows(split, out.index_select(0, split.first), lambda: out.index_select(0, split.rest))
    graph, rows = sources.graph, sources.rows
    if isinstance(rows, PendingRows) and not layer.splits_sources:
        rows = rows.materialize()  # the wait, then the whole block (as in _call_layer)
    if isinstance(rows, PendingRows):
        n_own = rows.own.shape[0]
        call = LayerCall(graph, attention, n_own=n_own)
        messages = rows.map(lambda r: layer.message(r, call))  # the halo's on arrival
        call.own_messages = messages.own
        wait_partials = sources.partials(messages.own, layer)  # posted
        partials = [layer.aggregate_part(GraphPart(graph, "own", n_own), messages.own, call)]
        # Even without halo rows the halo part stays in the graph: its backward posts the reverse
        # exchange the peers wait for (as in _call_layer).
        partials.append(layer.aggregate_part(GraphPart(graph, "halo", n_own), messages.halo(), call))
        own = rows.own
    else:
        call = LayerCall(graph, attention)
        m = call.own_messages = layer.message(rows, call)
        wait_partials = sources.partials(m if m.shape[0] == graph.n_own else m[: graph.n_own], layer)
        partials = [layer.aggregate_part(GraphPart(graph), m, call)]
        own = rows
    h_dst = dst_rows(own, graph.n_dst) if layer.reads_dst else None
    if kind == RELATION_MEAN:
        return layer.update(h_dst, layer.combine(partials, call), call) + wait_partials()
    return layer.update(h_dst, layer.combine(partials + [wait_partials()], call), call)


def pass_dropout(model, dropout: Optional[RowDropout], settings: PassSettings) -> Optional[RowDropout]:
    """The pass's RowDropout; None where nothing is dropped (eval, p = 0: no generator is touched)."""
    if not model.training or (model.dropout == 0.0 and settings.input_dropout == 0.0 and model.attn_dropout == 0.0):
        return None
    if dropout is None:  # single-process use without a key: a fresh key per pass
        dropout = RowDropout(int(torch.randint(0, 2 ** 62, ())), 0)
    return dropout


def _drop(model, dropout, layer: int, h: torch.Tensor) -> torch.Tensor:
    return h if dropout is None else dropout(layer, h, model.dropout)


def _drop_input(model, dropout, x, settings: PassSettings):
    """Input dropout of raw feature rows: layer 0's gathered source rows, or the own rows."""
    if dropout is None:
        return x
    x = materialize(x)  # drawn per source row: needs the halo rows
    if model.contract.input_dropout_rows == "sources":
        return dropout.sources(x, settings.input_dropout)
    return dropout(RowDropout.INPUT_LAYER, x, settings.input_dropout)


def _between(model, dropout, layer: int, h: torch.Tensor, rows=None) -> torch.Tensor:
    """[norm] -> activation -> dropout before layer `layer`, of its own rows or of the rows `rows` of
    them (all three are row-wise, so rows can be done apart)."""
    if model.norms is not None:
        h = model.norms[layer - 1](h)
    h = model.activation(h)
    if rows is None or dropout is None:
        return _drop(model, dropout, layer, h)
    return dropout.at(layer, h, model.dropout, rows)


def _gather(model, gather, layer: int, h: torch.Tensor, graph: LayerGraph):
    if h.shape[0] < graph.n_dst:
        raise ValueError(f"{model.name} layer {layer}: {h.shape[0]} own rows but the layer graph has "
                         f"n_dst={graph.n_dst}; destination rows must be a prefix of the own rows")
    h_src = h if gather is None else gather(layer, h)
    if isinstance(h_src, PartialSources):  # its own graph: the rows' in-edges, the partials' left out
        graph = h_src.graph
    if h_src.shape[0] != graph.n_src:
        how = ("without gather the own rows must be all source rows" if gather is None
               else "gather must return cat(own rows, halo rows)")
        raise ValueError(f"{model.name} layer {layer}: got {h_src.shape[0]} source rows, the layer graph "
                         f"has n_src={graph.n_src} ({how})")
    return h_src


def _attention(model, dropout, layer: int, graph: LayerGraph):
    p = model.attn_dropout
    return EdgeDropout(dropout, layer, p, graph) if dropout is not None and p > 0 else None


def _maybe_checkpoint(model, settings: PassSettings, fn, *args):
    if settings.checkpoint_activations and model.training and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def run_stack(model, x: torch.Tensor, graphs: Sequence[LayerGraph], gather=None,
              dropout: Optional[RowDropout] = None, settings: Optional[PassSettings] = None) -> torch.Tensor:
    """The model's logits for the rows the last layer computes (nn/models.py GNN.forward)."""
    settings = settings or DEFAULT_SETTINGS
    if len(graphs) != model.num_layers:
        raise ValueError(f"{model.name} has {model.num_layers} message-passing layers but got "
                         f"{len(graphs)} layer graphs; pass one LayerGraph per layer")
    dropout = pass_dropout(model, dropout, settings)
    if model.residual:
        return _run_residual(model, x, graphs, gather, dropout, settings)
    return _run_plain(model, x, graphs, gather, dropout, settings)


def _run_plain(model, x, graphs, gather, dropout, settings: PassSettings):
    # Boundary-first pipelining (gather.boundary, nn/rows.py HaloGather): where the next layer's exchange
    # is overlapped, layer l computes the rows that exchange sends first; they are activated and
    # posted (gather.post), and the other rows are computed while they travel.  Any gather with those
    # two hooks pipelines (a plain gather function, a single process's, has none).
    boundary = getattr(gather, "boundary", None)
    h, activated = x, True
    for layer, (conv, graph) in enumerate(zip(model.convs, graphs)):
        if not activated:
            h = _between(model, dropout, layer, h)
        # One name for the gathered rows: a second one would keep layer l's gathered tensor alive
        # through layer l + 1's gather (measured: +24 % step peak for GCN, tests/mpi/test_memory_model_mpi).
        h = _gather(model, gather, layer, h, graph)
        if layer == 0:
            h = _drop_input(model, dropout, h, settings)
        attention = _attention(model, dropout, layer, graph)
        split = None
        if boundary is not None and layer + 1 < model.num_layers and conv.splits_rows:
            split = boundary(layer + 1)
        if split is None:
            h, activated = call_layer(conv, h, graph, attention, dtype=settings.row_dtype), False
            continue
        out = call_layer(conv, h, graph, attention, split, settings.row_dtype)
        first = _between(model, dropout, layer + 1, out.first, split.first)
        gather.post(layer + 1, first)
        h = split.merge(first, _between(model, dropout, layer + 1, out.rest(), split.rest))
        del out, first
        activated = True
    for j, linear in enumerate(model.linears):  # the per-vertex head: the last conv's rows only
        h = linear(_between(model, dropout, model.num_layers + j, h))
    return h


def _run_residual(model, x, graphs, gather, dropout, settings: PassSettings):
    h = model.encoder(_drop_input(model, dropout, x, settings))
    h = call_layer(model.convs[0], _gather(model, gather, 0, h, graphs[0]), graphs[0],
                   _attention(model, dropout, 0, graphs[0]), dtype=settings.row_dtype)
    for layer in range(1, model.num_layers):
        graph = graphs[layer]

        def block(h, layer=layer, graph=graph):
            z = _drop(model, dropout, layer, model.activation(model.norms[layer - 1](h)))
            return h[: graph.n_dst] + call_layer(model.convs[layer], _gather(model, gather, layer, z, graph), graph,
                                                 _attention(model, dropout, layer, graph), dtype=settings.row_dtype)
        h = _maybe_checkpoint(model, settings, block, h)
    for j, linear in enumerate(model.linears):
        layer = model.num_layers + j

        def linear_block(h, layer=layer, linear=linear):
            return h + linear(_drop(model, dropout, layer, model.activation(model.norms[layer - 1](h))))
        h = _maybe_checkpoint(model, settings, linear_block, h)
    h = _drop(model, dropout, model.total_layers, model.activation(model.out_norm(h)))
    return model.head(h)
