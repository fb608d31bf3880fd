"""What a rank's resident memory holds on a CPU device beyond the tensors `estimate` counts, for a
transductive run (an inductive one's are memory_model/induced.py's).

`preprocess plan --device cpu` (ModelSpec.resident) estimates what a CPU run's peak resident memory
(VmHWM) is compared with, not an allocator's count, so it adds:
- runtime: the process before it reads its shard (the interpreter, torch, MPI, h5py and this package)
  and what the trainer's set-up adds outside its arrays (MPI's communicators and buffers, the thread
  pool, the pages of the libraries it runs);
- shard_slice: the rank's slice as read from the file (shards.read_rank_slice), kept for the run; the
  views' own feature rows are slices of it (engine/views.py), counted once, under features;
- for co-batches (cob), cobatch_host: the sampler's server graph (engine/cobplan.py ServerIndex: every
  row's features, pointers, owner, degree and id, every edge's source, destination, source owner and
  self-loop flag; counted over the rows the rank's co-batch reads, own and halo, a lower bound: the
  index holds the server's whole preload) and the next co-batch, which the loader prepares while the
  step computes (its rows' features and degrees, send list and graph indices);
- allocator: what the C heap keeps of the step beyond the step's own peak.  After set-up the engine
  keeps freed memory for reuse and serves every block from the heap (engine/hostmem.py: no mmap), and
  the heap then holds the step's peak plus the holes that blocks of changing sizes leave between the
  step's longer-lived tensors.  How much depends on what the model's step allocates, so it is the
  model's estimator's `heap_holes` (memory_model/stacks.py ModelEstimate), a fraction of the step's
  estimated transient (activations, halo buffers and the rest), measured by bench/check_heap_holes.py
  (one process, fb, 3 layers, hidden 64: glibc's mallinfo2 free bytes after three epochs, less the
  peak torch allocated in a fourth (its profiler), over the estimate's step):
  HEAP_HOLES_* below, with their measurements.
"""
from __future__ import annotations

from typing import Dict

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .graph_bytes import _graph_bytes
from .induced import RUNTIME_BYTES, SLICE_EDGE_BYTES, SLICE_INNER_BYTES
from .typed_widths import held_width, view_width

# Per row of a transductive slice (shards/schema.py dtypes): global_id, hop, labels, the three masks,
# indptr, in_degree; per world edge: src_global_id, src_rank; per row, its share of server_hop.
SLICE_ROW_BYTES = 8 + 4 + 8 + 3 + 8 + 8
SLICE_WORLD_EDGE_BYTES = 8 + 4
SERVER_HOP_BYTES = 4
# What the trainer's set-up adds to the process outside its arrays (measured on 2 x 2 emulated ranks
# with 30,000 and 100,000 vertices: 78-86 MiB of anonymous and file pages, independent of the graph).
SETUP_PROCESS_BYTES = 80 << 20
# The heap's holes as a fraction of the step's estimated transient (module docstring), per model family,
# measured with bench/check_heap_holes.py over repeated runs (it prints each; they vary from run to run).
# A step whose bytes are mostly a few large per-edge tensors left fewer holes than one of per-row blocks
# of many sizes.  R-GCN's update adds each relation's product [rows of its type, out] to a new
# [rows, out] sum, relation by relation: 1.82-2.38 at 10,000 vertices and 1.58-1.65 at 30,000 (the typed
# synthetic graph with ogbn-mag's statistics).
HEAP_HOLES_RGCN = 2.0
# R-GAT: mostly its per-edge attention tensors ([edges, heads] per relation, saved for the backward)
# and its relations' projections: 1.10-1.29 at 10,000 vertices, 0.76-0.85 at 30,000 (the same graphs).
HEAP_HOLES_RGAT = 1.0
# GAT: mostly its gathered messages [edges, heads, C]: 0.44 at 2,500 and at 5,000 vertices (DC-SBM;
# small, as a step above 1 GiB measures too few: the heap gives its free top beyond 1 GiB back to the
# system, engine/hostmem.py's trim threshold).
HEAP_HOLES_GAT = 0.5
# SAGE (0.71-0.99 at 20,000 vertices, 1.38-1.48 at 60,000, DC-SBM), GCN (0.93-1.51, 0.79-1.19), and
# every model not measured (GIN, SAGE-max, sage-sum, ressage, the pyg models: their estimators' default).
HEAP_HOLES_ROWS = 1.5
# ServerIndex per row (indptr, owner, in_degree, global_id) and per edge (indices, edge_dst int32,
# src_owner int16, is_loop).
INDEX_ROW_BYTES = 4 * I64
INDEX_EDGE_BYTES = I64 + 4 + 2 + 1


def host_parts(r, m, step: int, holes: float) -> Dict[str, int]:
    """The breakdown entries of a transductive run on a CPU device (module docstring); step: the step's
    bytes above the static ones (activations, halo buffers and the rest); holes: the model's heap holes
    per byte of it (its estimator's heap_holes).  Feature rows of a set of several widths are held at
    their own (memory_model/typed_widths.py)."""
    cob = r.server is not None and r.server.name == "cobatch"
    view = r.server if r.server is not None and not cob else r.world
    rows = view.n_own  # a server view's own rows are the slice's rows of every hop it plans
    edges = view.layers[0].nnz
    world_edges = r.world.layers[0].nnz
    # The slice's arrays beside its feature rows (the views' rows are slices of them; fb's estimate
    # knows only the world view's, the slice's first rows, not the deeper hops a full set also holds),
    # and its share of the server-wide hop array.
    slice_bytes = (rows * (SLICE_ROW_BYTES + SERVER_HOP_BYTES) + edges * SLICE_EDGE_BYTES
                   + (r.n_inner + 1) * SLICE_INNER_BYTES + world_edges * SLICE_WORLD_EDGE_BYTES)
    out = {"runtime": RUNTIME_BYTES + SETUP_PROCESS_BYTES, "shard_slice": int(slice_bytes)}
    if cob:
        c = r.server
        rows_c, edges_c = c.n_own + c.n_halo, c.layers[0].nnz
        index = rows_c * (held_width(m) * F32 + INDEX_ROW_BYTES) + edges_c * INDEX_EDGE_BYTES
        # The next co-batch's own rows, its halo rows (none for a model that projects them), degrees.
        halo = 0 if getattr(m.estimator, "projects", lambda _: False)(m) else c.n_halo * r.features
        nxt = (c.n_own * view_width(m) + halo + rows_c) * F32 + c.n_send * I64
        nxt += sum(_graph_bytes(lr, False, False, False) for lr in c.layers)
        out["cobatch_host"] = int(index + nxt)
    out["allocator"] = int(holes * step)
    return out
