"""The dataset content digest (`dataset.content_sha256` of a manifest): its definition, and its
recomputation by a training job from the rows its ranks read (`granndis-train --verify-content`).

The digest is sha256 over the canonical dataset in global-id order: the in-edge CSR, the features
(float32), the labels, the class count and the three split masks (docs/reliability.md, "What is the same
dataset").  `preprocess build` computes it with `ContentHash` in one pass; `preprocess verify` recomputes
it from the server files; and a training job with --verify-content recomputes it from what its ranks
read, before any epoch, so a file edited after the build with its checksum recomputed (one training
label changed: the checksums and the manifest's field digests agree, and `--resume` would take it as the
same dataset) is refused on every rank.

In a job every vertex is an inner row of exactly one rank.  sha256 is sequential, so the ranks' shares
are combined in order: the vertices are cut into ranges of global ids (about CHUNK_BYTES of features
each), and for every range each rank sends its rows in it to rank 0, which puts them in global-id
order and feeds the hash (memory: one range's rows, never the dataset).  Rows a rank holds of other
servers' vertices (flx's preload) are sent with the range and compared with their home rows there: they
are not in the digest, but flx trains on them.  Cost: the dataset's bytes (plus the preloaded copies)
travel to rank 0 once, at start-up; nothing of this runs per epoch.

This module knows no MPI: it is handed an mpi4py-like communicator (gather, Gatherv, bcast)."""
from __future__ import annotations

import hashlib
import json
from typing import Optional

import numpy as np

from granndis_hpc.graph.typed_features import TypedRows

from .schema import ShardError

# What the digest covers, in this order (dtype fixed, little-endian, so that it does not depend on the
# machine or on how a source happened to type its arrays).
CONTENT = (("indptr", "<i8"), ("indices", "<i8"), ("features", "<f4"), ("labels", "<i8"),
           ("train_mask", "|b1"), ("val_mask", "|b1"), ("test_mask", "|b1"))
# Per-vertex arrays (one row per vertex, in the order above); indptr and indices are the CSR.
_ROW_ARRAYS = CONTENT[2:]
CHUNK_BYTES = 32 << 20


class ContentHash:
    """The digest, fed array by array in CONTENT order, each array in one or more pieces: the same
    bytes as hashing every array whole (what `preprocess build` does), so pieces streamed from the
    ranks give the build's digest."""

    def __init__(self, num_classes: int, multilabel: bool = False, types: Optional[dict] = None):
        # A multi-label set's 0/1 labels are hashed as uint8 [N, C] and say so in the header; a
        # single-label set's header and bytes are unchanged (its digest is what it always was).  A
        # heterogeneous set's types record (graph/hetero.py: which ids are which type, which relations
        # the edges form) changes what its edges mean, so its header carries the record too.
        head = f"granndis-dataset-v1 classes={int(num_classes)}" + (" multilabel" if multilabel else "")
        if types is not None:
            head += " types=" + json.dumps(types, sort_keys=True, separators=(",", ":"))
        self._h = hashlib.sha256(head.encode())
        self._multilabel = bool(multilabel)
        self._next = 0

    def begin(self, name: str, shape) -> str:
        """Start array `name` (the next of CONTENT) of the given whole shape; returns its dtype."""
        expected, dtype = CONTENT[self._next]
        if name == "labels" and self._multilabel:
            dtype = "|u1"
        if name != expected:
            raise ValueError(f"content digest: array {name!r} given where {expected!r} comes next")
        self._next += 1
        self._h.update(f" {name}:{np.dtype(dtype).str}:{[int(s) for s in shape]};".encode())  # shapes bound the runs
        return dtype

    def update(self, piece: np.ndarray, dtype: str) -> None:
        a = np.ascontiguousarray(piece, dtype=dtype)
        self._h.update(memoryview(a).cast("B"))

    def hexdigest(self) -> str:
        if self._next != len(CONTENT):
            raise ValueError(f"content digest: {len(CONTENT) - self._next} arrays not given")
        return self._h.hexdigest()


def dataset_digest(graph) -> str:
    """The digest of a whole graph held in memory (arrays named as in CONTENT, plus num_classes)."""
    types = getattr(graph, "types", None)
    h = ContentHash(graph.num_classes, np.ndim(graph.labels) == 2, None if types is None else types.to_record())
    for name, _ in CONTENT:
        a = getattr(graph, name)
        h.update(a, h.begin(name, np.shape(a)))
    return h.hexdigest()


def _gather(world, send: np.ndarray, width: int):
    """Rank 0 receives every rank's rows (send: [k, width] of one dtype) in rank order, and each rank's
    row count; other ranks get (None, None)."""
    send = np.ascontiguousarray(send).reshape(-1, width)
    counts = world.gather(int(send.shape[0]), root=0)
    if world.Get_rank() != 0:
        world.Gatherv(send, None, root=0)
        return None, None
    counts = np.asarray(counts, dtype=np.int64)
    recv = np.empty((int(counts.sum()), width), dtype=send.dtype)
    world.Gatherv(send, (recv, (counts * width).tolist()), root=0)
    return recv, counts


class _Ranges:
    """One rank's rows cut by global-id range: its inner rows, and every row it holds (inner rows and
    preloaded copies), each as positions into the slice in global-id order.  (Inner rows are sorted by
    global id in a slice; nothing here relies on it, and nothing here raises: every rank must reach
    the collectives.)"""

    def __init__(self, sl):
        gid = np.asarray(sl.global_id, dtype=np.int64)
        n_inner = int(sl.n_inner)
        self.inner_order = np.argsort(gid[:n_inner], kind="stable")
        self.inner_gid = gid[:n_inner][self.inner_order]
        self.held_order = np.argsort(gid, kind="stable")
        self.held_gid = gid[self.held_order]

    def inner(self, lo: int, hi: int) -> np.ndarray:
        a, b = np.searchsorted(self.inner_gid, [lo, hi])
        return self.inner_order[a:b]

    def held(self, lo: int, hi: int) -> np.ndarray:
        a, b = np.searchsorted(self.held_gid, [lo, hi])
        return self.held_order[a:b]


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of these lengths starts (exclusive prefix sum)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.cumsum(lengths) - lengths


def _row_array(sl, name: str):
    return {"features": sl.features, "labels": sl.labels, "train_mask": sl.train_mask,
            "val_mask": sl.val_mask, "test_mask": sl.test_mask}[name]


def job_digest(world, sl, manifest: dict, chunk_bytes: int = CHUNK_BYTES) -> tuple[Optional[str], list]:
    """Collective over `world`: the content digest of the dataset the job's ranks hold (each rank's
    RankSlice `sl`), and the problems rank 0 found on the way (vertices held by no rank or by two,
    a row whose stored edges disagree with its in-degree, preloaded copies that differ from their home
    rows).  Every rank returns the same (digest, problems); the digest is None when a problem means
    the rows cannot be put in order (differing copies do not: their home rows are hashed)."""
    ds = manifest["dataset"]
    n, f = int(ds["num_vertices"]), int(ds["num_features"])
    root = world.Get_rank() == 0
    r = _Ranges(sl)
    step = max(1, int(chunk_bytes) // max(1, 4 * f))
    bounds = [(lo, min(n, lo + step)) for lo in range(0, n, step)] or [(0, 0)]
    h = ContentHash(int(ds["num_classes"]), ds.get("multilabel") is True, ds.get("types")) if root else None
    problems: list = []  # rows that cannot be put in order: no digest
    copies: list = []  # preloaded copies that differ from their home rows (the digest still holds)
    deg = np.asarray(sl.in_degree[: sl.n_inner], dtype=np.int64)
    w_len = np.diff(np.asarray(sl.w_indptr, dtype=np.int64))
    w_src = np.asarray(sl.w_src_global_id, dtype=np.int64)
    num_edges = int(world.allreduce(int(deg.sum())))

    def inner_ids(lo, hi):
        ids, _ = _gather(world, np.asarray(sl.global_id, np.int64)[r.inner(lo, hi)], 1)
        if root:
            ids = ids[:, 0]
            seen = np.bincount(ids - lo, minlength=hi - lo) if ids.size else np.zeros(hi - lo, np.int64)
            if np.any(seen != 1) and not problems:
                missing, twice = np.flatnonzero(seen == 0), np.flatnonzero(seen > 1)
                problems.append(f"vertices held as inner row by no rank ({missing.size}) or by two "
                                f"({twice.size}), e.g. global id {int((missing if missing.size else twice)[0]) + lo}")
        return ids

    # indptr: from the in-degrees of the inner rows, in global order (a running offset on rank 0).
    if root:
        dtype = h.begin("indptr", (n + 1,))
        h.update(np.zeros(1, np.int64), dtype)
    offset = 0
    for lo, hi in bounds:
        ids = inner_ids(lo, hi)
        d, _ = _gather(world, deg[r.inner(lo, hi)], 1)
        if root and not problems:
            dg = np.empty(hi - lo, np.int64)
            dg[ids - lo] = d[:, 0]
            h.update(offset + np.cumsum(dg), dtype)
            offset += int(dg.sum())
    # indices: each inner row's sources (world view, sorted by global id), rows put in global order.
    if root:
        dtype = h.begin("indices", (num_edges,))
    cum = _starts(w_len)  # each inner row's first source in w_src
    for lo, hi in bounds:
        sel = r.inner(lo, hi)
        ids = inner_ids(lo, hi)
        lens, _ = _gather(world, w_len[sel], 1)
        ds_, _ = _gather(world, deg[sel], 1)
        # the selected rows' sources, row after row
        take = np.repeat(cum[sel] - _starts(w_len[sel]), w_len[sel]) + np.arange(int(w_len[sel].sum()))
        src, _ = _gather(world, w_src[take], 1)
        if root and not problems:
            lens, ds_, src = lens[:, 0], ds_[:, 0], src[:, 0]
            if np.any(lens != ds_):
                bad = int(ids[np.flatnonzero(lens != ds_)[0]])
                problems.append(f"vertex {bad}: its world row holds {int(lens[ids == bad][0])} sources but its "
                                f"in-degree is {int(ds_[ids == bad][0])}")
                continue
            order = np.argsort(ids, kind="stable")  # received rows -> global order
            out_start = np.empty(ids.size, np.int64)
            out_start[order] = _starts(lens[order])
            in_start = _starts(lens)
            out = np.empty(src.size, np.int64)
            out[np.repeat(out_start - in_start, lens) + np.arange(src.size)] = src
            h.update(out, dtype)
    # Per-vertex arrays: every held row of the range goes to rank 0; inner rows are the dataset's,
    # copies (hop > 0) must equal them.
    hop = np.asarray(sl.hop)
    for name, _ in _ROW_ARRAYS:
        a = _row_array(sl, name)
        width = int(np.prod(a.shape[1:], dtype=np.int64))
        if root:
            dtype = h.begin(name, (n, *a.shape[1:]))
        for lo, hi in bounds:
            sel = r.held(lo, hi)
            ids, _ = _gather(world, np.asarray(sl.global_id, np.int64)[sel], 1)
            copy, _ = _gather(world, (hop[sel] > 0).astype(np.int8), 1)
            # Rows at their own widths (TypedRows) are hashed zero-padded (the module docstring): padded
            # here, one range's rows at a time.
            rows, _ = _gather(world, a.take(sel).padded() if isinstance(a, TypedRows) else a[sel], width)
            if root and not problems:
                ids, copy = ids[:, 0], copy[:, 0].astype(bool)
                home = np.empty((hi - lo, width), dtype=rows.dtype)
                home[ids[~copy] - lo] = rows[~copy]
                differ = np.flatnonzero(np.any(rows[copy] != home[ids[copy] - lo], axis=1))
                if differ.size:
                    copies.append(f"{differ.size} preloaded rows' {name} differ from their home server's "
                                    f"rows, e.g. global id {int(ids[copy][differ[0]])}")
                h.update(home, dtype)
    digest = h.hexdigest() if root and not problems else None
    return world.bcast((digest, problems + copies), root=0)


def check_job_content(world, sl, manifest: dict, path: str, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Collective: refuse (ShardError, the same on every rank) a job whose rows do not hash to the
    manifest's dataset.content_sha256, or whose preloaded copies differ from their home rows."""
    recorded = manifest["dataset"].get("content_sha256")
    if recorded is None:
        raise ShardError(f"{path}: --verify-content: the manifest records no dataset.content_sha256 (built by an "
                         f"older granndis-hpc); rebuild the set with `granndis preprocess build ... --overwrite`")
    digest, problems = job_digest(world, sl, manifest, chunk_bytes)
    fix = (f"the server files were edited after the build (their checksums recomputed): run "
           f"`granndis preprocess verify {path}` and rebuild the set from its source with "
           f"`granndis preprocess build ... --overwrite`")
    if digest is not None and digest != recorded:
        problems.insert(0, f"manifest.json dataset.content_sha256 is {recorded[:16]}... but the server files' graph, "
                           f"features, labels and split hash to {digest[:16]}...")
    if problems:
        raise ShardError(f"{path}: --verify-content: {'; '.join(problems)}: {fix}")
