"""One server file built by every build rank together: no rank holds a server's edges or
features, the writer included.

Rank r of P holds rows vtxdist[r]..vtxdist[r+1]-1 of the canonical in-edge CSR (sliced.GraphSlice).
For server s every rank takes part, on its own rows, in each step build.build_server makes on the whole
graph, with the same result:

* the halo (`select_halo`): a BFS hop by hop over a dense hop array every rank keeps (int8, -1 = not in
  the server).  Full preload: each rank adds the unselected in-neighbours of its frontier rows; EAS: each
  rank ranks the candidates of its frontier rows (a destination's candidates are its in-edges, all on
  the rank owning it) and asks the owners of the candidates for their unselected in-degree (the
  `degree` rule's score).  The hop's new vertices are one max-allreduce of an N-byte mask.
* the owner GPUs (`assign_owners_sliced`, owners.assign_owners' rule): the votes of hop t are counted
  where the voting edges are (in-edges u -> w of the hop t-1 rows w), sent to the owner of u, summed and
  decided there; the owners of the hop's vertices are allgathered (a dense int8 array); the
  rebalancing runs on every rank on the server's (hop, owner) rows.
* the file: rows in row_blocks.file_order, as build_server orders them; the writer rank
  (s % P) writes the datasets in order, the large ones (the subgraph's sources, features, labels, the
  world view) as shards.StreamedDataset blocks (`block_rows`: whole feature chunks, at most ceil(rows /
  P) rows and at most BLOCK_BYTES of features) that the rows' owners compute (relabelled and sorted
  subgraph rows, world-view ranks and in-degrees) and send to the writer (one alltoallv per block), so
  the writer holds one block at a time (received and reordered; the previous block is freed before
  the next is gathered).

Memory per rank besides its slice: a few bytes per vertex of the graph (the int8 hop and owner and the
int32 file row of every vertex, the BFS's masks) and the server's per-row arrays (int64 global id, int8
hop and owner, converted to the file's int32 when written); the writer adds one block (bounded in bytes,
whatever the server's size) and, while writing, one small per-row dataset at a time.  Every collective round happens on
every rank whatever the data (the block plan is computed from arrays all ranks share), so a rank that
fails while writing drains the rest of the rounds and the failure is agreed on after the file
(Group.errors), never a hang.
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import csr_rows, row_of_edges
from granndis_hpc.shards import StreamedDataset
from granndis_hpc.shards import typed_rows
from granndis_hpc.shards.schema import datasets_in, datasets_of, feature_chunk_rows

from granndis_hpc.preprocess.build import inductive
from granndis_hpc.preprocess.build.halo import eas_choose, unique_inverse
from granndis_hpc.preprocess.partition.owners import DEFAULT_TOLERANCE, rebalance
from granndis_hpc.preprocess.build.pipeline import server_stats
from granndis_hpc.preprocess.partition.row_blocks import file_order
from granndis_hpc.preprocess.build.slices import shuffle_to_owners


# The writer's block: at most this many bytes of feature rows (and the same rows' in-edges), received
# and reordered (two copies), whatever the server's size; ceil(rows / P) rows when that is less.
# 32 MiB: at 2.45M P = 8 a 128 MiB block made the writers' block the build's largest term (writers
# 0.65 GiB against 0.45 on the other ranks); a smaller block writes the same files byte for byte, in more rounds.
BLOCK_BYTES = 32 << 20


def small_int_dtype(bound: int):
    """The narrowest signed integer dtype holding -1..bound-1 (server, GPU, hop ids: 1 B per vertex)."""
    for dt in (np.int8, np.int16, np.int32):
        if bound <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def block_rows(rows: int, num_features: int, ranks: int, block_bytes: int | None = None) -> int:
    """Rows of one block of a server file of `rows` rows: whole feature chunks, at most ceil(rows / P)
    rows and at most `block_bytes` (default BLOCK_BYTES) of float32 feature rows (at least one chunk)."""
    block_bytes = BLOCK_BYTES if block_bytes is None else int(block_bytes)
    chunk = feature_chunk_rows(rows, num_features) if rows else 1
    share = -(-rows // ranks)
    by_bytes = max(block_bytes // (4 * max(num_features, 1) * chunk), 1) * chunk
    return max(min(-(-share // chunk) * chunk, by_bytes), 1)


def _my_rows(part, hop_of: np.ndarray, value: int) -> np.ndarray:
    """Local row numbers of this rank's vertices at hop `value`."""
    return np.flatnonzero(hop_of[part.lo:part.hi] == value)


def _union(group, n: int, ids: np.ndarray) -> np.ndarray:
    """Dense bool mask of the union over ranks of `ids`."""
    mask = np.zeros(n, dtype=np.uint8)
    mask[ids] = 1
    return group.allreduce_max(mask).view(bool)


def _remote_unselected_in_degree(group, part, cand: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Collective: for the sorted distinct global ids `cand`, how many of their in-neighbours are not
    selected (halo._unselected_in_degree, computed by the owners of the rows)."""
    owner = np.searchsorted(part.vtxdist, cand, side="right") - 1
    counts = np.bincount(owner, minlength=group.size).astype(np.int64)
    asked = group.alltoallv(cand, counts) - part.lo
    asked_counts = group.alltoallv(counts, np.ones(group.size, dtype=np.int64))
    sub_indptr, nbrs = csr_rows(part.indptr, part.indices, asked)
    score = np.bincount(row_of_edges(sub_indptr), weights=~selected[nbrs], minlength=asked.shape[0]).astype(np.int64)
    return group.alltoallv(score, asked_counts)


def select_halo(group, part, inner: np.ndarray, cfg) -> np.ndarray:
    """Collective: the hop of every vertex in server s (inner: its sorted inner vertices), -1 outside;
    the same as halo.full_khop / halo.eas on the whole graph (module docstring)."""
    n = part.num_vertices
    hop_of = np.full(n, -1, dtype=np.int8 if cfg.effective_hops < 127 else np.int32)
    hop_of[inner] = 0
    for t in range(1, cfg.effective_hops + 1):
        selected = hop_of >= 0
        front = _my_rows(part, hop_of, t - 1)
        sub_indptr, src = csr_rows(part.indptr, part.indices, front)
        if cfg.preload == "full":
            new = src[~selected[src]]
        else:
            dst = (front + part.lo)[row_of_edges(sub_indptr)]
            keep = ~selected[src]
            src, dst = src[keep], dst[keep]
            score = None
            if cfg.select == "degree":
                cand, inverse = unique_inverse(src)
                score = _remote_unselected_in_degree(group, part, cand, selected)[inverse]
            new = eas_choose(src, dst, cfg.fanout, cfg.seed, score)
        hop_of[_union(group, n, new) & ~selected] = t
    return hop_of


def order_by_hop(hop_of: np.ndarray):
    """(server vertices sorted by (hop, global id), their hops): halo's row order."""
    verts = np.flatnonzero(hop_of >= 0).astype(np.int64, copy=False)
    hops = hop_of[verts].astype(np.int32)
    order = np.argsort(hops, kind="stable")  # verts ascend already: a stable sort by hop is (hop, id)
    return verts[order], hops[order]


def assign_owners_sliced(group, part, hop_of: np.ndarray, verts: np.ndarray, hops: np.ndarray,
                         gpu_of: np.ndarray, gpus: int, tolerance: float = DEFAULT_TOLERANCE) -> np.ndarray:
    """Collective: owners.assign_owners on the server's induced subgraph, from the slices; returns the
    owner (int32) of every server vertex in `verts` order (module docstring)."""
    n, lo, hi = part.num_vertices, part.lo, part.hi
    owner_of = np.full(n, -1, dtype=np.int8 if gpus < 128 else np.int32)
    inner = verts[hops == 0]
    owner_of[inner] = gpu_of[inner]
    rows = np.diff(part.vtxdist)
    for t in range(1, int(hops.max()) + 1 if hops.size else 1):
        w = _my_rows(part, hop_of, t - 1)
        sub_indptr, u = csr_rows(part.indptr, part.indices, w)
        g = owner_of[w + lo][row_of_edges(sub_indptr)].astype(np.int64)
        keep = hop_of[u] == t
        votes_keys = shuffle_to_owners(group, u[keep] * gpus + g[keep], part.vtxdist, gpus)
        at_t = _my_rows(part, hop_of, t)
        votes = np.bincount(votes_keys - lo * gpus, minlength=(hi - lo) * gpus).reshape(hi - lo, gpus)
        votes = votes[at_t].astype(np.float64)
        load = np.bincount(owner_of[owner_of >= 0], minlength=gpus).astype(np.float64)
        votes += 0.5 * (1.0 - load / (load.max() + 1.0))
        mine = owner_of[lo:hi].copy()
        mine[at_t] = np.argmax(votes, axis=1)
        owner_of = group.allgatherv_rows(mine, rows)
    return rebalance(owner_of[verts].astype(np.int32), hops, gpus, tolerance)


def in_file_order(verts: np.ndarray, hop: np.ndarray, owner: np.ndarray, server_of, gpu_of, block):
    """(global id, hop, owner) of the server's rows in its file's order (row_blocks.file_order)."""
    perm = file_order(verts, hop, owner, server_of, gpu_of, block)
    return verts[perm], hop[perm], owner[perm]


def _file_rows(n: int, verts: np.ndarray) -> np.ndarray:
    """The file row of every vertex of the graph (-1 outside the server)."""
    m = verts.shape[0]
    file_row = np.full(n, -1, dtype=np.int32 if m < 2**31 else np.int64)
    file_row[verts] = np.arange(m, dtype=file_row.dtype)
    return file_row


def _induced_rows(part, file_row: np.ndarray, m: int, local: np.ndarray):
    """This rank's rows `local` of the subgraph induced on the server, in file ids, sorted: (in-edges
    per row, their sources)."""
    sub_ptr, src = csr_rows(part.indptr, part.indices, local)
    new = file_row[src]
    keep = new >= 0
    row = row_of_edges(sub_ptr)[keep]
    key = row * m + new[keep]
    key.sort()
    return np.bincount(row, minlength=local.shape[0]).astype(np.int64), key % m


def server_graph(group, part, writer: int, verts: np.ndarray, hop: np.ndarray, owner: np.ndarray,
                 train: np.ndarray, gpus: int):
    """Collective: the graph of a server's file without features or world view -- what
    shards.read_server_graph reads for the co-batch sampler (indptr, indices, hop, train, offsets) --
    assembled on `writer` from the rows' owners in blocks of ceil(rows / P) rows, the same arrays as
    the file's (graph/indptr, graph/indices: `server_datasets` makes them with the same code); None
    elsewhere.  (verts, hop, owner): the server's rows in file order (`in_file_order`); train: the train
    mask of every vertex of the graph.  The writer holds the server's induced subgraph (8 B per edge);
    the others one block of their rows at a time."""
    m = verts.shape[0]
    file_row = _file_rows(part.num_vertices, verts)
    plan = _Blocks(group, part, writer, -(-m // group.size))
    ptr = plan.lengths(verts, lambda local: _induced_rows(part, file_row, m, local)[0])
    indices = np.empty(int(ptr[-1]) if plan.is_writer else 0, dtype=np.int64)
    for a, data in plan.edges(verts, lambda local: _induced_rows(part, file_row, m, local), ptr):
        indices[a:a + data.shape[0]] = data
    if not plan.is_writer:
        return None
    offsets = np.zeros(gpus + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=gpus), out=offsets[1:])
    return {"indptr": ptr, "indices": indices, "hop": hop.astype(np.int64), "train": np.asarray(train[verts], bool),
            "offsets": offsets}


class _Blocks:
    """The block plan of one server file: file rows in blocks of at most `step` rows, and the collective
    that brings a block's rows from their owners to the writer."""

    def __init__(self, group, part, writer: int, step: int):
        self.group, self.part, self.writer = group, part, writer
        self.step = max(int(step), 1)
        self.is_writer = group.rank == writer

    def gather(self, ids: np.ndarray, produce):
        """Collective: `produce(local rows)` -> (lengths per row or None for one row each, data rows) on
        the owners of `ids` (global ids, the same on every rank); on the writer the rows in `ids` order
        (and their lengths), elsewhere (None, None)."""
        group, part = self.group, self.part
        group.idle_barrier()  # while the writer writes the previous block, the others sleep
        owner = np.searchsorted(part.vtxdist, ids, side="right") - 1
        mine = np.flatnonzero(owner == group.rank)
        lens, data = produce(ids[mine] - part.lo)
        counts = np.zeros(group.size, dtype=np.int64)
        counts[self.writer] = data.shape[0]
        got = group.alltoallv(data, counts)
        del data
        got_lens = None
        if lens is not None:
            counts[self.writer] = lens.shape[0]
            got_lens = group.alltoallv(lens.astype(np.int64, copy=False), counts)
        if not self.is_writer:
            return None, None
        # Received in rank order, each rank's rows in `ids` order: a stable sort by owner gives where.
        order = np.argsort(owner, kind="stable")
        if lens is None:
            out = np.empty_like(got)
            out[order] = got
            return out, None
        out_lens = np.empty(ids.shape[0], dtype=np.int64)
        out_lens[order] = got_lens
        ptr = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(out_lens, out=ptr[1:])
        recv_start = np.zeros(got_lens.shape[0], dtype=np.int64)
        np.cumsum(got_lens[:-1], out=recv_start[1:])
        out = np.empty_like(got)
        out[np.repeat(ptr[:-1][order] - recv_start, got_lens) + np.arange(got.shape[0], dtype=np.int64)] = got
        return out, out_lens

    def rows(self, ids: np.ndarray, produce, step=None):
        """Blocks (first row, rows) of a per-row dataset of the file rows `ids` (writer; elsewhere the
        same rounds yield nothing)."""
        step = step or self.step
        for a in range(0, ids.shape[0], step):
            data, _ = self.gather(ids[a:a + step], produce)
            if self.is_writer:
                yield a, data
            del data  # not alive during the next block's gather (one block on the writer, not two)

    def edges(self, ids: np.ndarray, produce, ptr):
        """Blocks (first edge, edges) of a per-edge dataset of the rows `ids` (ptr: the rows' offsets,
        on the writer only)."""
        for a in range(0, ids.shape[0], self.step):
            data, _ = self.gather(ids[a:a + self.step], produce)
            if self.is_writer:
                yield int(ptr[a]), data
            del data

    def lengths(self, ids: np.ndarray, produce) -> np.ndarray | None:
        """Row offsets (int64, len(ids) + 1) of a per-edge dataset, on the writer (None elsewhere)."""
        parts = [self.gather(ids[a:a + self.step], lambda local: (None, produce(local)))[0]
                 for a in range(0, ids.shape[0], self.step)]
        if not self.is_writer:
            return None
        ptr = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        if parts:
            np.cumsum(np.concatenate(parts), out=ptr[1:])
        return ptr


def _lazy(shape, dtype, make, active: bool):
    """A StreamedDataset the writer (`active`) computes only when it reaches it, in one block (small
    per-row arrays: one of them alive at a time); nothing elsewhere."""
    def blocks():
        if active:
            yield 0, np.ascontiguousarray(make(), dtype=dtype)
    return StreamedDataset(shape, dtype, blocks())


def server_datasets(group, part, s: int, writer: int, server_of, gpu_of, block, degree, masks, cfg, induced=None):
    """Collective: (datasets of server s's file, its stats) as build.build_server makes them (block:
    row_blocks' locality blocks, or None); the large
    datasets are StreamedDataset blocks.  On the writer the datasets are for shards.stage_server_file;
    every other rank must drain them (`drain_datasets`) in the same order.  stats only on the writer.
    induced: an inductive build's per-vertex train-induced in-degrees and split codes (preprocess/build/inductive.py)."""
    G, n = cfg.gpus_per_server, part.num_vertices
    inner = np.flatnonzero(server_of == s)
    num_inner = inner.shape[0]
    hop_of = select_halo(group, part, inner, cfg)
    del inner  # 8 B per inner vertex; the file's inner rows come from the hops
    verts, hop = order_by_hop(hop_of)
    owner = assign_owners_sliced(group, part, hop_of, verts, hop, gpu_of, G).astype(small_int_dtype(G))
    del hop_of
    # The per-row arrays in 1 B hops and owners (the file stores them as int32, converted when written).
    hop = hop.astype(small_int_dtype(cfg.effective_hops + 1))
    verts, hop, owner = in_file_order(verts, hop, owner, server_of, gpu_of, block)
    m = verts.shape[0]
    file_row = _file_rows(n, verts)

    offsets = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=G), out=offsets[1:])
    inner_counts = np.bincount(owner[hop == 0], minlength=G).astype(np.int64)
    w_offsets = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(inner_counts, out=w_offsets[1:])
    inner_ids = verts[hop == 0]  # in file order: GPU 0's inner rows, then GPU 1's, ...
    w_ptr = np.zeros(inner_ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(degree[inner_ids], out=w_ptr[1:])
    # Blocks of whole feature chunks, at most ceil(rows / P) rows and BLOCK_BYTES of features.
    plan = _Blocks(group, part, writer, block_rows(m, part.num_features, group.size))
    w = plan.is_writer

    def sub_rows(local):
        return _induced_rows(part, file_row, m, local)

    def in_edges(local):
        sub_ptr, src = csr_rows(part.indptr, part.indices, local)
        return np.diff(sub_ptr), src

    ptr = plan.lengths(verts, lambda local: sub_rows(local)[0])
    nnz = int(ptr[-1]) if plan.is_writer else 0
    world_edges = int(w_ptr[-1])
    arrays = {
        "vertices/global_id": verts,
        "vertices/owner": _lazy((m,), np.int32, lambda: owner, w),
        "vertices/hop": _lazy((m,), np.int32, lambda: hop, w),
        "vertices/offsets": offsets,
        "vertices/inner_counts": inner_counts,
        "graph/indptr": ptr,
        "graph/indices": StreamedDataset((nnz,), np.int64, plan.edges(verts, sub_rows, ptr)),
        "graph/in_degree": _lazy((m,), np.int64, lambda: degree[verts], w),
        "features": _features(part, verts, plan.rows(verts, lambda local: (None, part.features[local]))),
        "labels": StreamedDataset((m, *part.labels.shape[1:]), part.labels.dtype,  # multi-label: uint8 [m, C]
                                  plan.rows(verts, lambda local: (None, part.labels[local]))),
        "split/train": _lazy((m,), bool, lambda: masks["train_mask"][verts], w),
        "split/val": _lazy((m,), bool, lambda: masks["val_mask"][verts], w),
        "split/test": _lazy((m,), bool, lambda: masks["test_mask"][verts], w),
        "world/offsets": w_offsets,
        "world/indptr": w_ptr,
        "world/src_global_id": StreamedDataset((world_edges,), np.int64, plan.edges(inner_ids, in_edges, w_ptr)),
        "world/src_rank": StreamedDataset(
            (world_edges,), np.int32,
            plan.edges(inner_ids, lambda local: _map_edges(in_edges(local), lambda src: (
                server_of[src].astype(np.int32) * G + gpu_of[src]).astype(np.int32)), w_ptr)),
        "world/src_in_degree": StreamedDataset(
            (world_edges,), np.int64,
            plan.edges(inner_ids, lambda local: _map_edges(in_edges(local), lambda src: degree[src].astype(np.int64)), w_ptr)),
    }
    if induced is not None:
        train_degree, codes = induced["train_in_degree"], induced["split_code"]
        arrays["graph/train_in_degree"] = _lazy((m,), np.int64, lambda: train_degree[verts], w)
        arrays["world/src_split"] = StreamedDataset(
            (world_edges,), np.uint8,
            plan.edges(inner_ids, lambda local: _map_edges(in_edges(local), lambda src: codes[src]), w_ptr))
        # Collective (every rank, whatever it writes): 1 B per row, kept until the writer reaches it.
        train_hop = inductive.train_hops_sliced(group, part, file_row, verts, hop, masks["train_mask"],
                                                cfg.effective_hops)
        arrays["graph/train_hop"] = _lazy((m,), np.uint8, lambda: train_hop, w)
    assert list(arrays) == list(datasets_of(induced is not None, train_hop=induced is not None)), \
        "dist_server: dataset order differs from the schema"
    stats = None
    if plan.is_writer:
        stats = server_stats(s, num_inner, hop, owner, masks["train_mask"][verts], nnz, world_edges, G,
                             cfg.effective_hops)
    return arrays, stats


def _features(part, verts: np.ndarray, blocks) -> StreamedDataset:
    """The server's features dataset: [m, F], or flat at each row's type width where the types' widths
    differ (granndis_hpc/shards/typed_rows.py), each block of rows packed where it is written."""
    types = getattr(part, "types", None)
    if types is None or not types.typed_widths:
        return StreamedDataset((verts.shape[0], part.num_features), np.float32, blocks)
    widths = typed_rows.row_widths(types, verts)
    starts = typed_rows.flat_offsets(widths)
    packed = ((int(starts[a]), typed_rows.pack(rows, widths[a:a + rows.shape[0]])) for a, rows in blocks)
    return StreamedDataset((int(starts[-1]),), np.float32, packed)


def _map_edges(rows, fn):
    lens, src = rows
    return lens, fn(src)


def drain_datasets(arrays: dict) -> None:
    """Run every remaining collective round of a server's streamed datasets, in file order."""
    for name in datasets_in(arrays):
        a = arrays[name]
        if isinstance(a, StreamedDataset):
            a.drain()
