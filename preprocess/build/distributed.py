"""The distributed build: every phase reads the ranks' slices of the canonical graph.

After `sliced.load_slice`, rank r of P holds rows vtxdist[r]..vtxdist[r+1]-1 of the in-edge CSR and
those vertices' features, labels and masks.  No rank ever holds the whole edge list or feature matrix:

* server partitioning (`SlicedAccess`, the access object partition.partition_servers takes): the
  symmetric adjacency ParMETIS needs is one alltoallv of edge keys to the owner of their row (for
  METIS, to rank 0: small graphs only); the balance refinement's neighbour counts are computed by the
  owners of the candidate rows and allgathered; the edge cut is an allreduce;
* the GPU split of server s (gpu_split.split_servers_over_gpus, the whole-graph build's too): every
  rank sends the symmetric keys of the inner subgraph's edges among its own rows to the rank owning
  their row, for ParMETIS on server s's own block of P / S ranks, every server's at the same time
  (`--partitioner parmetis` with 2 <= S <= P: each rank of the block an S/P slice of the server's
  inner rows; otherwise over all ranks, one server after another) or METIS on rank s % P (`metis`,
  `random`) (`SlicedAccess.inner_keys`);
* the halo (full k-hop or EAS), the owner GPUs and the file of server s are built by all ranks
  together and written by rank s % P in blocks (preprocess/build/dist_server.py), so no rank holds a
  server's edges or features, the writer included;
* every rank holds O(V) small per-vertex arrays after the partition (server and GPU of every vertex
  as int8, int32 in-degrees, three bool split masks: 9 B per vertex; while a server is built its hop
  and owner (int8) and file row (int32) of every vertex and the BFS's masks, and its rows' global ids,
  hops and owners (int64, int8, int8) with their sort: measured by tracing every live array,
  docs/performance/build-scaling.md) besides its slice;
* the partition phase, the peak of every rank (ParMETIS on the slices), holds only what it reads: the
  slice's features, labels and masks are in a temporary file meanwhile, its edges (indices, indptr)
  too during each ParMETIS call (slices.spilled), and the in-degrees and val/test masks are gathered
  after it (same bytes).

The servers are built one after another, each by every rank; every collective round happens on every
rank whatever its data, so no rank waits for a round another skipped.
"""
from __future__ import annotations

import time

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import csr_rows, row_of_edges
from granndis_hpc.shards import discard_staged, stage_server_file

from granndis_hpc.preprocess.build import inductive
from granndis_hpc.preprocess.build.pipeline import PhaseLog, check_dataset, commit_build, prepare_build_output, validate_config
from granndis_hpc.preprocess.build.dist_server import drain_datasets, server_datasets, small_int_dtype
from granndis_hpc.preprocess.build.halo import unique_sorted
from granndis_hpc.preprocess.partition.gpu_split import split_servers_over_gpus
from granndis_hpc.preprocess.partition.twolevel import partition_servers, symmetric_keys, typed_rows
from granndis_hpc.preprocess.partition.row_blocks import part_of, row_blocks
from granndis_hpc.preprocess.build.sliced import GraphSlice
from granndis_hpc.preprocess.build.slices import keys_to_adjacency, shuffle_to_owners, spilled


class SlicedAccess:
    """partition.partition_servers' view of a graph held as slices (collective methods)."""

    def __init__(self, group, part: GraphSlice, train: np.ndarray):
        self.group, self.part, self.train = group, part, train
        self.server_of = None  # the server partition, once made (inner_keys)
        self.num_vertices, self.num_edges = part.num_vertices, part.num_edges
        # A heterogeneous graph balances each vertex type, read from the ids (no per-vertex array).
        self.vertex_type, self.vertex_names = typed_rows(part.types)

    def adjacency(self, dist: np.ndarray):
        """Rows dist[rank]..dist[rank+1]-1 of the symmetric graph without loops: every edge u -> v of
        this rank's rows becomes the keys v*n+u and u*n+v, sent to the owner (under dist) of its row.
        A symmetric slice (load_slice with symmetrize) asked for its own rows is that already: its rows
        without their loops, the sources sorted and distinct (no keys, no shuffle: ~17 B per edge at
        the partition phase instead of ~62)."""
        p, n = self.part, self.num_vertices
        rows = row_of_edges(p.indptr) + p.lo
        cols = p.indices
        keep = cols != rows
        del rows
        if p.symmetric and np.array_equal(np.asarray(dist), p.vtxdist):
            loops = np.flatnonzero(~keep)  # edge positions of the loops (none without self_loops=add|keep)
            del keep
            xadj = p.indptr - np.searchsorted(loops, p.indptr)  # minus the loops before each row
            return xadj, (np.delete(cols, loops) if loops.size else cols)
        rows = row_of_edges(p.indptr) + p.lo
        rows, cols = rows[keep], cols[keep]
        keys = np.concatenate([rows * n + cols, cols * n + rows])
        del rows, cols, keep
        keys = unique_sorted(shuffle_to_owners(self.group, keys, np.asarray(dist, dtype=np.int64), n), in_place=True)
        return keys_to_adjacency(keys, n, int(dist[self.group.rank]), int(dist[self.group.rank + 1]))

    def inner_keys(self, s: int, inner: np.ndarray, dist: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
        """Collective: this rank's rows dist[rank]..dist[rank+1]-1 of server s's symmetric inner
        adjacency (gpu_split.split_servers_over_gpus; keys row*m+col, local ids), sorted and distinct;
        with `labels` (a label of every vertex: row_blocks' parts) of the vertices labelled s.
        Every rank makes both directions of the in-edges of its own inner rows (of its slice) and sends
        each key to the rank owning its row under dist, which drops the duplicates (an edge and its
        reverse made on two ranks)."""
        p, server_of = self.part, self.server_of if labels is None else labels
        m = inner.shape[0]
        mine = np.flatnonzero(server_of[p.lo:p.hi] == s)
        sub_indptr, src = csr_rows(p.indptr, p.indices, mine)
        dst = np.searchsorted(inner, mine + p.lo)[row_of_edges(sub_indptr)]
        keep = server_of[src] == s
        keys = symmetric_keys(np.searchsorted(inner, src[keep]), dst[keep], m)
        del sub_indptr, src, dst, keep
        keys = shuffle_to_owners(self.group, keys, np.asarray(dist, dtype=np.int64), m)
        first = np.ones(keys.shape[0], dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        return keys[first]

    def released(self):
        """Collective context for a ParMETIS call: the slice's edges (indices and indptr) on disk
        meanwhile (slices.spilled; the partitioner reads only the adjacency made from them before the
        call)."""
        return spilled(self.group, self.part, ("indices", "indptr"))

    def part_counts(self, cand: np.ndarray, parts: np.ndarray, nparts: int) -> np.ndarray:
        p = self.part
        a, b = np.searchsorted(cand, [p.lo, p.hi])
        sub_indptr, nbrs = csr_rows(p.indptr, p.indices, cand[a:b] - p.lo)
        local = np.bincount(row_of_edges(sub_indptr) * nparts + parts[nbrs],
                            minlength=(b - a) * nparts).reshape(b - a, nparts)
        per_rank = np.diff(np.searchsorted(cand, p.vtxdist))
        return self.group.allgatherv_rows(local.astype(np.int64), per_rank)

    def edge_cut(self, parts: np.ndarray) -> int:
        p = self.part
        local = np.count_nonzero(parts[p.indices] != parts[row_of_edges(p.indptr) + p.lo])
        return int(self.group.allreduce_sum(np.array([local], dtype=np.int64))[0])


def run_build_sliced(comm, part: GraphSlice, cfg, log: PhaseLog | None = None,
                     content_digest: str | None = None) -> dict:
    """Collective: build.run_build's shard set from the ranks' slices (module docstring); the same
    server files and partition digest as run_build on the assembled graph with the same P."""
    group = as_group(comm)
    log = log or PhaseLog(group, printer=lambda *a, **k: None)
    n = part.num_vertices
    if content_digest is None:
        from granndis_hpc.preprocess.build.sliced import slice_digest

        content_digest = slice_digest(group, part)
    num_train = int(group.allreduce_sum(np.array([np.count_nonzero(part.train_mask)], dtype=np.int64))[0])
    with group.errors("checking the build configuration"):
        validate_config(cfg, n)
        check_dataset(part.name, n, part.num_classes, num_train)
    S, G, P, rank = cfg.servers, cfg.gpus_per_server, group.size, group.rank
    rows = np.diff(part.vtxdist)
    train = group.allgatherv_rows(part.train_mask, rows)
    prepare_build_output(group, cfg, n, part.num_edges, part.num_features,
                         part.num_classes if part.labels.ndim == 2 else 8)  # multi-label: C uint8 a row

    # The partition phase sets the build's peak (ParMETIS on every rank's slice): only what it reads is
    # in memory meanwhile.  The features, labels and the slice's masks wait on disk (slices.spilled),
    # the edges too during each ParMETIS call (SlicedAccess.released), and the per-vertex arrays the
    # server files need (in-degrees, val/test masks) are gathered after it.
    access = SlicedAccess(group, part, train)
    with spilled(group, part, ("features", "labels", "train_mask", "val_mask", "test_mask")):
        sp = partition_servers(group, access, S, cfg.partitioner, cfg.seed)
        # 1 B per vertex each (int8 while S, G < 128) instead of the partitioners' int32, the server's
        # from here (through the GPU split's calls): one copy, kept until the manifest
        # (partition_digest hashes the values, not the dtype).
        server_of = sp.parts = access.server_of = sp.parts.astype(small_int_dtype(S))
        gpu_of, gpu_constraints = split_servers_over_gpus(group, access, server_of, train, G,
                                                          cfg.partitioner, cfg.seed)
        gpu_of = gpu_of.astype(small_int_dtype(G))
        t_blocks = time.perf_counter()
        block = row_blocks(group, access, part_of(server_of, gpu_of, G), S * G, cfg.row_block_rows)
        t_blocks = time.perf_counter() - t_blocks
    # int32 in-degrees (4 B per vertex on every rank; the files store them as int64).
    degree = group.allgatherv_rows(np.diff(part.indptr).astype(np.int32 if part.num_edges < 2**31 else np.int64), rows)
    masks = {"train_mask": train, **{f: group.allgatherv_rows(getattr(part, f), rows) for f in ("val_mask", "test_mask")}}
    induced = None
    if cfg.inductive:  # 9 B more per vertex on every rank (preprocess/build/inductive.py)
        induced = {"train_in_degree": group.allgatherv_rows(
                       inductive.train_in_degree(part.indptr, part.indices, train), rows),
                   "split_code": inductive.vertex_split_codes(train, masks["val_mask"], masks["test_mask"])}
    log.done("partition", sp.log_line(cfg.row_block_rows, t_blocks))

    staged, stats = [], []
    t_halo = t_write = 0.0
    try:
        for s in range(S):
            # Every rank builds every server with the others (dist_server); rank s % P writes it.
            writer = s % P
            t = time.perf_counter()
            with group.errors("building server files"):
                arrays, st = server_datasets(group, part, s, writer, server_of, gpu_of, block, degree, masks, cfg, induced)
                t_halo += time.perf_counter() - t
                t = time.perf_counter()
                if rank == writer:
                    st["gpu_constraints"] = gpu_constraints[s]
                    try:
                        staged.append(stage_server_file(cfg.out, s, S, G, arrays))
                    finally:
                        drain_datasets(arrays)  # the rounds a failed write left (none after a success)
                    stats.append(st)
                else:
                    drain_datasets(arrays)
                del arrays
            # Outside the errors block, which every rank leaves alike: the writer closes, fsyncs and
            # hashes the file while the others sleep.
            group.idle_barrier()
            t_write += time.perf_counter() - t
    except BaseException:
        discard_staged(staged)
        raise
    log.done("halos+write", f"halo/owners {t_halo:.2f} s, gather + hdf5 write {t_write:.2f} s (rank 0)")
    entry = {"name": part.name, "num_vertices": n, "num_edges": part.num_edges, "num_features": part.num_features,
             "num_classes": int(part.num_classes), "num_train": int(masks["train_mask"].sum()),
             "num_val": int(masks["val_mask"].sum()), "num_test": int(masks["test_mask"].sum()),
             "content_sha256": content_digest, **({"multilabel": True} if part.labels.ndim == 2 else {}),
             **({"types": part.types.to_record()} if part.types is not None else {})}
    manifest = commit_build(group, cfg, entry, sp, server_of, gpu_of, staged, stats)
    log.done("commit", f"{cfg.out}: {S} server files + manifest.json")
    return manifest
