"""The memory of an inductive run (--inductive, engine/inductive.py) beyond its training views.

An inductive run trains on views of the train-induced graph (RankRows.world: its world view; .server: the
train-induced graph's own k-hop preload, or a co-batch of it), which `estimate` counts like any others.
Evaluation also holds the full graph's world view and the train+validation-induced world view
(RankRows.evaluation), forward only, and runs one no_grad forward over each of the three in turn; on a
CPU device the shard slice as read from the file shares the same memory (RankRows.host_bytes).  This
module counts them:
- evaluation_views: the evaluation views' static rows (features, degrees, send list) and their one
  forward graph each (the world view's layers share one graph), with the overlapped order's split
  matrices, forward only;
- evaluation_transient: how far the largest no_grad forward (the input gather, the exchange buffers,
  a layer's input, aggregation and outputs; the per-vertex head) exceeds the training step's
  own transient, which it follows (training's activations are freed by then);
- on a CPU device, where the estimate is compared with a rank's peak resident memory: shard_slice, the
  slice's arrays (shards.read_rank_slice; the full world view's own feature rows are the slice's, not
  counted twice), setup_rows, what the full world view's set-up leaves resident, runtime, the
  process before it reads its shard, and for co-batches sampler_graph, the server graph they are drawn
  from.

Both `preprocess plan --inductive` (preprocess/plan/induced_counts.py) and --mode auto
(memory_model/induced_sets.py) count every rank's RankRows.evaluation.
"""
from __future__ import annotations

from typing import Dict

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .graph_bytes import _graph_bytes, _split_graph_bytes
from .typed_widths import held_width, view_width

# Bytes the shard reader keeps per row, per edge and per server row (granndis_hpc/shards/schema.py dtypes,
# shards.read_rank_slice): global_id, hop, labels, the three masks, indptr, in_degree, train_in_degree;
# graph/indices; world/indptr per inner row, src_global_id + src_rank + src_split per world edge;
# server_hop + server_train per server row.
SLICE_ROW_BYTES = 8 + 4 + 8 + 3 + 8 + 8 + 8
SLICE_EDGE_BYTES = 8
SLICE_INNER_BYTES = 8
SLICE_WORLD_EDGE_BYTES = 8 + 4 + 1
SLICE_SERVER_ROW_BYTES = 4 + 1
# What the full world view's set-up leaves resident per in-edge: its row source (engine/views.RowSource:
# is_own, own_pos, peer, key, src_hop), the planner's arrays and their transients, which the heap keeps
# for reuse.  Measured on a 500,000-vertex products-like graph: a rank grows by 81 B per world edge over
# the set-up (254 MiB for 3.14 M edges), of which the view's own tensors (evaluation_views) are ~9.
SETUP_EDGE_BYTES = 72
# read_server_graph per row: indptr, in_degree, hop (int32), global_id, train_in_degree, train; per
# edge: indices, and the filter's edge row (int64) and mask.
SAMPLER_ROW_BYTES = 8 + 8 + 4 + 8 + 8 + 1
SAMPLER_EDGE_BYTES = 8 + 8 + 1
# A rank's resident memory before it reads its shard: the interpreter, torch, MPI, h5py and this package
# (measured: 248-265 MiB on CPU).  Counted on a CPU device only, where the estimate is compared with
# the process's peak resident memory; a GPU's budget leaves the host alone.
RUNTIME_BYTES = 256 << 20


def slice_bytes(rows: int, edges: int, inner: int, world_edges: int, server_rows: int, features: float,
                multilabel_classes: int = 0) -> int:
    """Bytes of one rank's shard slice (read_rank_slice) of an inductive set: its rows of the server file
    (all hops) with their features and in-edges, its inner rows' world view, the server-wide hop and
    train arrays.  multilabel_classes: uint8 labels [rows, C] in place of int64 class ids.  features: the
    feature floats per row (memory_model/typed_widths.py held_width: rows at their own widths)."""
    per_row = SLICE_ROW_BYTES + features * F32 + (multilabel_classes - 8 if multilabel_classes else 0)
    return int(rows * per_row + edges * SLICE_EDGE_BYTES + (inner + 1) * SLICE_INNER_BYTES
               + world_edges * SLICE_WORLD_EDGE_BYTES + server_rows * SLICE_SERVER_ROW_BYTES)


def _view_static(v, r, m) -> int:
    """An evaluation view's rows (features, degrees), send list, one shared forward graph and the split
    matrices its overlapped forward caches (one per row split)."""
    est = m.estimator
    halo = 0 if getattr(est, "projects", lambda _: False)(m) else v.n_halo * r.features  # no halo features
    b = int((v.n_own * view_width(m) + halo + v.n_own + v.n_halo) * F32) + v.n_send * I64
    lr = v.layers[0]  # every layer of a world view is the same rows object (arrays.rank_rows)
    b += _graph_bytes(lr, est.self_loops, True, False)
    if "world" in m.overlap:
        splits = {l + 1 < len(v.layers) for l in range(len(v.layers)) if est.exchanged(l, m)}
        b += sum(_split_graph_bytes(lr, est.self_loops, s, False) for s in splits)
    return int(b)


def forward_peak(v, r, m) -> int:
    """Peak bytes one no_grad forward over view `v` allocates (eval mode: no dropout, nothing saved).
    Layer l holds its input rows, the exchange's send and receive buffers, the cat of own and halo rows,
    the aggregation (of the source rows' projections when the layer narrows, else of the inputs) and
    four output-sized terms (the self and neighbour projections, their sum, and the merge of the
    boundary-first rows with the rest); a layer reading the static halo gathers the halo rows and cats
    them with the own rows at the input width, float32.  The per-vertex head holds its input and output.
    (Measured on a 500,000-vertex products-like graph: 0.86-0.94 of torch's allocation peak of the
    evaluation pass over the full graph.)"""
    est, widths, A = m.estimator, m.widths(), m.activation_bytes
    best = 0
    for l, lr in enumerate(v.layers):
        win, wout = widths[l]
        out = (4 * lr.n_dst * wout + (lr.n_src * wout if win > wout else lr.n_dst * win)) * A
        if est.exchanged(l, m):
            held = (lr.n_own_in + lr.n_send + lr.n_halo + lr.n_src) * win * A + out
        else:
            held = (lr.n_src + lr.n_halo) * win * F32 + out
        best = max(best, held)
    for win, wout in est.linear_widths(m):
        best = max(best, v.layers[-1].n_dst * (win + wout) * A)
    return int(best)


def inductive_parts(r, m, device: str, step_transient: int) -> Dict[str, int]:
    """The breakdown entries an inductive run adds to its training views' (module docstring);
    step_transient: the training step's bytes above the static ones (activations, halo buffers and the
    rest), which evaluation's forward follows."""
    views = sum(_view_static(v, r, m) for v in r.evaluation)
    peak = max(forward_peak(v, r, m) for v in (r.world, *r.evaluation))
    out = {"evaluation_views": int(views), "evaluation_transient": int(max(0, peak - step_transient))}
    if device == "cpu" and r.host_bytes:
        full = max(r.evaluation, key=lambda v: v.n_own)  # the full graph's world view: the slice's rows
        out["evaluation_views"] -= int(full.n_own * view_width(m) * F32)
        out["shard_slice"] = int(r.host_bytes)
        # What the full world view's set-up leaves (SETUP_EDGE_BYTES), and the process itself.
        out["setup_rows"] = full.layers[0].nnz * SETUP_EDGE_BYTES
        out["runtime"] = RUNTIME_BYTES
        if r.server is not None and r.server.name == "cobatch":
            # The server graph the sampler draws from (shards.read_server_graph, features included),
            # and the edge row and mask of its train-induced filter (engine/inductive.py).
            rows, edges = r.server_file
            out["sampler_graph"] = int(rows * (held_width(m) * F32 + SAMPLER_ROW_BYTES) + edges * SAMPLER_EDGE_BYTES)
    return out

