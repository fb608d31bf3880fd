"""The distributed build: every phase reads the ranks' slices of the canonical graph (issue 17).

After `sliced.load_slice`, rank r of P holds rows vtxdist[r]..vtxdist[r+1]-1 of the in-edge CSR and
those vertices' features, labels and masks.  No rank ever holds the whole edge list or feature matrix:

* server partitioning (`SlicedAccess`, the access object partition.partition_servers takes): the
  symmetric adjacency ParMETIS needs is one alltoallv of edge keys to the owner of their row (for
  METIS, to rank 0: small graphs only); the balance refinement's neighbour counts are computed by the
  owners of the candidate rows and allgathered; the edge cut is an allreduce;
* the GPU split, the k-hop halo (full) and the EAS selection of server s run on its writer rank
  s % P over a `RowCache`: the global in-edge CSR with only the rows the writer fetched from their
  owners (frontier requests out, in-edges back, one alltoallv round per hop), in a global-size row
  pointer with empty rows elsewhere, so the unchanged halo/owner/server code (halo.py, owners.py,
  build.build_server) runs on it and gives byte-identical server files;
* features and labels of the server's rows are fetched from their owners the same way;
* every rank holds O(V) small per-vertex arrays (server and GPU of every vertex, in-degrees, split
  masks: 21 B per vertex) besides its slice; a writer rank also holds its server's rows (the data
  that server's training ranks hold).

Every fetch is collective, so the ranks walk the servers in lockstep rounds (round j: server
j * P + rank), each round making the same number of fetches on every rank (1 + hops), a rank without a
server in a round fetching nothing but serving the others.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import Graph, csr_rows, rank_in_rows, row_of_edges
from granndis_hpc.shards import discard_staged

from .build import (PhaseLog, build_and_stage, check_dataset, commit_build, prepare_build_output,
                    validate_config)
from .halo import eas, full_khop, unique_sorted
from .partition import partition_gpus, partition_servers
from .sliced import GraphSlice, shuffle_to_owners


class SlicedAccess:
    """partition.partition_servers' view of a graph held as slices (collective methods)."""

    def __init__(self, group, part: GraphSlice, train: np.ndarray):
        self.group, self.part, self.train = group, part, train
        self.num_vertices, self.num_edges = part.num_vertices, part.num_edges

    def adjacency(self, dist: np.ndarray):
        """Rows dist[rank]..dist[rank+1]-1 of the symmetric graph without loops: every edge u -> v of
        this rank's rows becomes the keys v*n+u and u*n+v, sent to the owner (under dist) of its row."""
        p, n = self.part, self.num_vertices
        rows = row_of_edges(p.indptr) + p.lo
        cols = p.indices
        keep = cols != rows
        rows, cols = rows[keep], cols[keep]
        keys = np.concatenate([rows * n + cols, cols * n + rows])
        del rows, cols, keep
        keys = unique_sorted(shuffle_to_owners(self.group, keys, np.asarray(dist, dtype=np.int64), n), in_place=True)
        lo, hi = int(dist[self.group.rank]), int(dist[self.group.rank + 1])
        xadj = np.searchsorted(keys, np.arange(lo, hi + 1, dtype=np.int64) * n).astype(np.int64)
        keys %= n
        return xadj, keys

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


def _requests(group, part: GraphSlice, want: np.ndarray):
    """Send the sorted ids `want` to their owners; returns (ids asked of this rank as local rows, how
    many each rank asked)."""
    owner = np.searchsorted(part.vtxdist, want, side="right") - 1
    counts = np.bincount(owner, minlength=group.size).astype(np.int64)
    asked = group.alltoallv(want, counts)
    asked_counts = group.alltoallv(counts, np.ones(group.size, dtype=np.int64))
    return asked - part.lo, asked_counts


def fetch_rows(group, part: GraphSlice, want: np.ndarray):
    """Collective: the in-edge rows of the sorted distinct global ids `want` from their owners, as
    (indptr, sources) in `want` order."""
    local, asked_counts = _requests(group, part, want)
    sub_indptr, srcs = csr_rows(part.indptr, part.indices, local)
    lens = np.diff(sub_indptr)
    got_lens = group.alltoallv(lens, asked_counts)
    bounds = np.zeros(group.size + 1, dtype=np.int64)
    np.cumsum(asked_counts, out=bounds[1:])
    got_srcs = group.alltoallv(srcs, np.diff(sub_indptr[bounds]))
    indptr = np.zeros(want.shape[0] + 1, dtype=np.int64)
    np.cumsum(got_lens, out=indptr[1:])
    return indptr, got_srcs


def fetch_node_rows(group, part: GraphSlice, want: np.ndarray, fields) -> dict:
    """Collective: {field: rows of the sorted distinct ids `want`} from their owners."""
    local, asked_counts = _requests(group, part, want)
    return {f: group.alltoallv(np.ascontiguousarray(getattr(part, f)[local]), asked_counts) for f in fields}


class RowCache:
    """The rows of the global in-edge CSR one rank fetched, as one global-size CSR (other rows empty).

    Only that CSR is kept (8 B per fetched edge and 8 B per vertex): each fetch merges its rows into
    it, moving the old rows to their new positions, so no second copy of the rows stays alive."""

    def __init__(self, n: int):
        self.n = n
        self.have = np.zeros(n, dtype=bool)
        self.clear()

    def missing(self, ids) -> np.ndarray:
        ids = unique_sorted(np.asarray(ids, dtype=np.int64))
        return ids[~self.have[ids]]

    def fetch(self, group, part: GraphSlice, ids) -> None:
        """Collective (every rank calls it, with an empty `ids` if it needs nothing)."""
        want = self.missing(ids)
        got_ptr, srcs = fetch_rows(group, part, want)
        if not want.size:
            return
        self.have[want] = True
        old_ptr, old_idx = self.indptr, self.indices
        lens = np.diff(old_ptr)
        old_lens = lens.copy()
        lens[want] = np.diff(got_ptr)
        ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        del lens
        idx = np.empty(int(ptr[-1]), dtype=np.int64)
        # old edge e of row r moves to e + (ptr[r] - old_ptr[r]); new edge j of row want[i] goes to
        # ptr[want[i]] + (its position in the row)
        idx[np.arange(old_idx.shape[0], dtype=np.int64) + np.repeat(ptr[:-1] - old_ptr[:-1], old_lens)] = old_idx
        del old_idx, old_lens
        idx[np.repeat(ptr[want], np.diff(got_ptr)) + rank_in_rows(got_ptr)] = srcs
        self.indptr, self.indices = ptr, idx

    def clear(self) -> None:
        """Drop every fetched row (the cache stays usable, empty)."""
        self.have[:] = False
        self.indptr = np.zeros(self.n + 1, dtype=np.int64)
        self.indices = np.zeros(0, dtype=np.int64)

    def csr(self):
        return self.indptr, self.indices


class FetchedRows:
    """Rows of a per-vertex array for a set of global ids, indexed by global id (a KeyError-like
    ValueError for an id not fetched: never silently a wrong row)."""

    def __init__(self, ids: np.ndarray, rows: np.ndarray, n: int):
        self.ids, self.rows = ids, rows
        self.shape = (n,) + rows.shape[1:]
        self.dtype = rows.dtype

    def __getitem__(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, ids), max(self.ids.shape[0] - 1, 0))
        if ids.size and (self.ids.size == 0 or not np.array_equal(self.ids[pos], ids)):
            raise ValueError("dist_build: a row was used that was not fetched (a bug: please report it)")
        return self.rows[pos]


@dataclass
class PartialGraph(Graph):
    """A Graph whose CSR holds only fetched rows; in_degree() is the global one (allgathered)."""

    degree: np.ndarray = None

    def in_degree(self) -> np.ndarray:
        return self.degree


def _halo_fetches(group, part, cache: RowCache, inner, cfg) -> np.ndarray:
    """Fetch (collectively, 1 + hops rounds) every row the server's halo selection reads: the rows of
    the vertices of every hop, and for EAS the rows of the candidates it scores.  Returns the server's
    vertices (sorted global ids; empty without a server)."""
    empty = np.zeros(0, dtype=np.int64)
    cache.fetch(group, part, empty if inner is None else inner)
    k = cfg.effective_hops
    for t in range(1, k + 1):
        need = empty
        if inner is not None:
            indptr, indices = cache.csr()
            if cfg.preload == "full":
                verts, hop = full_khop(indptr, indices, inner, t)
                need = verts[hop == t]
            else:
                verts, hop = eas(indptr, indices, inner, t - 1, cfg.fanout, cfg.select, cfg.seed)
                selected = np.zeros(part.num_vertices, dtype=bool)
                selected[verts] = True
                nbrs = csr_rows(indptr, indices, verts[hop == t - 1])[1]
                need = nbrs[~selected[nbrs]]
        cache.fetch(group, part, need)
    if inner is None:
        return empty
    indptr, indices = cache.csr()
    if cfg.preload == "full":
        verts = full_khop(indptr, indices, inner, k)[0]
    else:
        verts = eas(indptr, indices, inner, k, cfg.fanout, cfg.select, cfg.seed)[0]
    return unique_sorted(verts)


def run_build_sliced(comm, part: GraphSlice, cfg, log: PhaseLog | None = None,
                     content_digest: str | None = None) -> dict:
    """Collective: build.run_build's shard set from the ranks' slices (module docstring); the same
    server files and partition digest as run_build on the assembled graph with the same P."""
    group = as_group(comm)
    log = log or PhaseLog(group, printer=lambda *a, **k: None)
    n = part.num_vertices
    if content_digest is None:
        from .sliced import slice_digest

        content_digest = slice_digest(group, part)
    num_train = int(group.allreduce_sum(np.array([np.count_nonzero(part.train_mask)], dtype=np.int64))[0])
    with group.errors("checking the build configuration"):
        validate_config(cfg, n)
        check_dataset(part.name, n, part.num_classes, num_train)
    S, G, P, rank = cfg.servers, cfg.gpus_per_server, group.size, group.rank
    rows = np.diff(part.vtxdist)
    degree = group.allgatherv_rows(np.diff(part.indptr), rows)
    masks = {f: group.allgatherv_rows(getattr(part, f), rows) for f in ("train_mask", "val_mask", "test_mask")}
    prepare_build_output(group, cfg, n, part.num_edges, part.num_features)

    sp = partition_servers(group, SlicedAccess(group, part, masks["train_mask"]), S, cfg.partitioner, cfg.seed)
    server_of = sp.parts
    rounds = -(-S // P)
    gpu_local = np.full(n, -1, dtype=np.int32)
    gpu_constraints = {}
    no_features = FetchedRows(np.zeros(0, np.int64), np.zeros((0, part.num_features), np.float32), n)
    for j in range(rounds):
        s = j * P + rank
        inner = np.flatnonzero(server_of == s).astype(np.int64) if s < S else None
        cache = RowCache(n)
        cache.fetch(group, part, np.zeros(0, np.int64) if inner is None else inner)
        with group.errors("partitioning servers over GPUs"):
            if inner is not None:
                indptr, indices = cache.csr()
                view = PartialGraph(part.name, indptr, indices, no_features, no_features, masks["train_mask"],
                                    masks["val_mask"], masks["test_mask"], part.num_classes, degree=degree)
                gpu_local[inner], gpu_constraints[s] = partition_gpus(view, inner, G)
        del cache
    gpu_of = group.allreduce_max(gpu_local)
    del gpu_local
    log.done("partition", f"{sp.name}: edge cut {sp.edge_cut} ({100 * sp.edge_cut_fraction:.2f}% of edges), "
                          f"vertex balance {sp.vertex_balance:.3f}, train balance {sp.train_balance:.3f}")

    staged, stats = [], []
    t_halo = t_write = 0.0
    try:
        for j in range(rounds):
            s = j * P + rank
            inner = np.flatnonzero(server_of == s).astype(np.int64) if s < S else None
            t = time.perf_counter()
            cache = RowCache(n)
            ids = _halo_fetches(group, part, cache, inner, cfg)
            got = fetch_node_rows(group, part, ids, ("features", "labels"))
            with group.errors("building server files"):
                if inner is not None:
                    fetch_s = time.perf_counter() - t
                    # No local name keeps the view (fetched rows and features) alive: build_and_stage
                    # drops it after building, before the file is written.
                    dh, dw = build_and_stage(
                        PartialGraph(part.name, *cache.csr(), FetchedRows(ids, got.pop("features"), n),
                                     FetchedRows(ids, got.pop("labels"), n), masks["train_mask"],
                                     masks["val_mask"], masks["test_mask"], part.num_classes, degree=degree),
                        s, server_of, gpu_of, cfg, gpu_constraints[s], staged, stats, release=cache.clear)
                    t_halo, t_write = t_halo + fetch_s + dh, t_write + dw
            del cache, got
    except BaseException:
        discard_staged(staged)
        raise
    log.done("halos+write", f"halo/owners {t_halo:.2f} s, hdf5 write {t_write:.2f} s (rank 0)")
    entry = {"name": part.name, "num_vertices": n, "num_edges": part.num_edges, "num_features": part.num_features,
             "num_classes": int(part.num_classes), "num_train": int(masks["train_mask"].sum()),
             "num_val": int(masks["val_mask"].sum()), "num_test": int(masks["test_mask"].sum()),
             "content_sha256": content_digest}
    manifest = commit_build(group, cfg, entry, sp, server_of, gpu_of, staged, stats)
    log.done("commit", f"{cfg.out}: {S} server files + manifest.json")
    return manifest
