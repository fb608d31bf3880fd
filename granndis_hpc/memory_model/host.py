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
  step's longer-lived tensors (building the graph caches before the first step changed nothing): measured
  with glibc's mallinfo2 on R-GCN over a 30,000- and a 100,000-vertex graph with ogbn-mag's statistics
  (fb, flx, eas, cob), the heap's free bytes after an epoch were 1.8-2.8 times the peak torch allocated
  in it (its profiler's); counted as ALLOCATOR_HOLES of the step's estimated transient beyond it.
"""
from __future__ import annotations

from typing import Dict

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64

from .graph_bytes import _graph_bytes
from .induced import RUNTIME_BYTES, SLICE_EDGE_BYTES, SLICE_INNER_BYTES

# Per row of a transductive slice (shards/schema.py dtypes): global_id, hop, labels, the three masks,
# indptr, in_degree; per world edge: src_global_id, src_rank; per row, its share of server_hop.
SLICE_ROW_BYTES = 8 + 4 + 8 + 3 + 8 + 8
SLICE_WORLD_EDGE_BYTES = 8 + 4
SERVER_HOP_BYTES = 4
# What the trainer's set-up adds to the process outside its arrays (measured on 2 x 2 emulated ranks
# with 30,000 and 100,000 vertices: 78-86 MiB of anonymous and file pages, independent of the graph).
SETUP_PROCESS_BYTES = 80 << 20
# The heap's holes as a fraction of the step's peak (module docstring): measured 0.8-1.8.
ALLOCATOR_HOLES = 1.5
# ServerIndex per row (indptr, owner, in_degree, global_id) and per edge (indices, edge_dst int32,
# src_owner int16, is_loop).
INDEX_ROW_BYTES = 4 * I64
INDEX_EDGE_BYTES = I64 + 4 + 2 + 1


def host_parts(r, step: int) -> Dict[str, int]:
    """The breakdown entries of a transductive run on a CPU device (module docstring); step: the step's
    bytes above the static ones (activations, halo buffers and the rest)."""
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
        index = rows_c * (r.features * F32 + INDEX_ROW_BYTES) + edges_c * INDEX_EDGE_BYTES
        nxt = rows_c * (r.features + 1) * F32 + c.n_send * I64
        nxt += sum(_graph_bytes(lr, False, False, False) for lr in c.layers)
        out["cobatch_host"] = int(index + nxt)
    out["allocator"] = int(ALLOCATOR_HOLES * step)
    return out
