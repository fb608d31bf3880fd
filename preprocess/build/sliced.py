"""Distributed loading: every build rank reads 1/P of the edges and of the vertex rows, and the ranks
canonicalise together.

A *sliced source* can hand a rank its share without producing the rest: the chunked directory
(preprocess/formats/chunked.py, memory-mapped) and the synthetic generators (each chunk drawn from (seed, i)
alone, preprocess/sources/synthetic_chunks.py).  The protocol:

    source.name, source.num_vertices, source.num_features, source.num_classes (None: from the labels)
    source.edge_pieces(rank, size)  -> iterable of (origin, src, dst), this rank's 1/size of the raw edges
    source.nodes(lo, hi)            -> {field: [(origin, array), ...]}: vertices lo..hi-1 in pieces, in
                                       order (features, labels, train_mask, val_mask, test_mask)
    source.types (optional)         -> GraphTypes of a heterogeneous graph (granndis_hpc/graph/hetero.py),
                                       checked on every rank's rows and carried by the slices; or
    source.types_for(symmetrize)       the same, when the relations depend on the symmetrisation, and
    source.derive_features(...)        collective, fills the rows of types without stored features
                                       (preprocess/sources/hetero_sliced.py)

Canonicalisation (`load_slice`), the same result as canonical.canonicalize on the whole graph, rows
lo..hi-1 of it (vtxdist = slices.vtxdist_for(N, P), the slices ParMETIS takes):
1. every raw edge u->v (and v->u when symmetrising) becomes the int64 key v*N+u, checked for range
   on the rank that read it (the error names the chunk file);
2. one local sort groups the keys by the rank owning their destination (contiguous id ranges, so key
   order is owner order) and one alltoallv sends each group to its owner;
3. the owner sorts what it received, adds its vertices' loops (self_loops=add), removes duplicates and
   (self_loops=remove) loops: its rows of the global in-edge CSR, sources sorted.
Memory per rank: its keys (16 B per raw edge read, twice when symmetrising) and its rows.

`slice_digest` computes the dataset content digest of build.dataset_digest from the slices (the same
bytes in the same order: every rank's part of each array is streamed to rank 0 in rank order, so rank
0 holds one slice at a time), so a shard set built from slices carries the digest a whole-graph build
of the same dataset gives and `--resume` across shapes keeps working.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from granndis_hpc.cluster import as_group
from granndis_hpc.graph.csr import Graph
from granndis_hpc.graph.hetero import GraphTypes, TypesError
from granndis_hpc.shards.content import CONTENT, ContentHash

from granndis_hpc.preprocess.sources.canonical import SELF_LOOP_MODES, DataError, _dedupe_sorted, normalize_features
from granndis_hpc.preprocess.build.slices import shuffle_to_owners, vtxdist_for

NODE_FIELDS = ("features", "labels", "train_mask", "val_mask", "test_mask")


@dataclass
class GraphSlice:
    """Rows lo..hi-1 of a canonical graph, with their vertex data (global ids everywhere)."""

    name: str
    num_vertices: int
    num_edges: int  # of the whole canonical graph
    num_classes: int
    vtxdist: np.ndarray  # int64 [P + 1]
    lo: int
    hi: int
    edge_offset: int  # global position of this slice's first edge in the CSR
    indptr: np.ndarray  # int64 [hi - lo + 1], starting at 0
    indices: np.ndarray  # int64 sources (global ids)
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    symmetric: bool = False  # every edge u -> v has v -> u (load_slice with symmetrize)
    types: Optional[GraphTypes] = None  # a heterogeneous graph's types (the source's `types`)

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])


def _edge_keys_checked(pieces, n: int, symmetrize: bool) -> np.ndarray:
    """int64 keys v*n+u of this rank's raw edges (and their reverses), ids checked per piece."""
    parts = []
    for origin, src, dst in pieces:
        src, dst = np.asarray(src), np.asarray(dst)
        if src.ndim != 1 or src.shape != dst.shape:
            raise DataError(f"{origin}: edge arrays must be two 1-D arrays of equal length, got {src.shape} "
                            f"and {dst.shape}. Fix: store edges as [2, E]")
        if src.size == 0:
            continue
        for arr, what in ((src, "source"), (dst, "destination")):
            if not np.issubdtype(arr.dtype, np.integer):
                raise DataError(f"{origin}: edge {what} ids have dtype {arr.dtype}, not an integer type. "
                                "Fix: store edge endpoints as integers")
            a, b = int(arr.min()), int(arr.max())
            if a < 0 or b >= n:
                raise DataError(f"{origin}: edge {what} ids span [{a}, {b}] but there are {n} vertices "
                                f"(valid ids 0..{n - 1}). Fix: renumber the edges to 0-based ids or give "
                                "the correct vertex count")
        s, d = src.astype(np.int64), dst.astype(np.int64)
        k = d * n
        k += s
        parts.append(k)
        if symmetrize:
            s *= n
            s += d
            parts.append(s)
        del d
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _counted(pieces, read: dict):
    """The pieces unchanged, their edge counts added up per origin into `read`."""
    for origin, src, dst in pieces:
        read[origin] = read.get(origin, 0) + int(np.asarray(src).shape[0])
        yield origin, src, dst


def _check_declared_edges(group, source, read: dict) -> None:
    """Collective: a source that declares its edge count (`declared_edges`, said where by `declared_in`)
    but whose files could only be counted while read (text edge files) is refused when the ranks read
    another total: a cut or truncated edge file would otherwise build a smaller graph silently."""
    declared = getattr(source, "declared_edges", None)
    if declared is None:
        return
    counts = {}
    for part in group.allgather_object(read):
        counts.update(part)
    found = sum(counts.values())
    with group.errors("checking the edge count"):
        if found != int(declared) and group.rank == 0:  # one statement of it (every rank gets the error)
            files = ", ".join(f"{os.path.basename(str(o))} {c}" for o, c in sorted(counts.items())[:8])
            more = ", ..." if len(counts) > 8 else ""
            raise DataError(f"{source.declared_in} declares {int(declared)} edges but the edge files hold "
                            f"{found} ({files}{more}). Fix: restore the missing or cut edge files, or correct "
                            "the declared count")
        # A typed source declares a count per relation: a file moved from one relation's list to another's
        # keeps the total but puts its edges in the wrong relation.
        for relation, (want, files) in (getattr(source, "declared_per_relation", None) or {}).items():
            got = {f: counts.get(f, 0) for f in files}
            if sum(got.values()) != int(want) and group.rank == 0:
                held = ", ".join(f"{os.path.basename(str(f))} {c}" for f, c in got.items()) or "no files"
                raise DataError(f"{source.declared_in} declares {int(want)} edges of relation {relation!r} but its "
                                f"edge files hold {sum(got.values())} ({held}). Fix: restore the relation's missing "
                                "or cut edge files, list them under its own entry, or correct its declared count")


def _origin_of(pieces, index: int) -> str:
    """The file holding local row `index` of a field given as [(origin, array), ...]."""
    ends = np.cumsum([a.shape[0] for _, a in pieces])
    return pieces[min(int(np.searchsorted(ends, index, side="right")), len(pieces) - 1)][0]


def _check_nodes(nodes: dict, lo: int, hi: int, width: int, classes: int | None = None) -> dict:
    """Validate one rank's vertex rows, given per field as [(origin, array), ...] pieces in vertex order;
    messages name the chunk file holding the first bad row and its global vertex id.  `classes`: a
    multi-label source's task count (its labels are 0/1 rows of that width), else None."""
    out, origins = {}, {}
    m = hi - lo
    for field in NODE_FIELDS:
        pieces = [(o, np.asarray(a)) for o, a in nodes[field]]
        for origin, a in pieces:
            if field == "features" and (a.ndim != 2 or a.shape[1] != width):
                raise DataError(f"{origin}: features have shape {a.shape}, expected [rows, {width}]. "
                                "Fix: one row of num_features values per vertex")
            if field == "labels" and not np.issubdtype(a.dtype, np.integer):
                raise DataError(f"{origin}: labels have dtype {a.dtype}. Fix: store integer class ids (-1 = unlabelled)")
            if field == "labels" and classes is not None and (a.shape[1:] != (classes,) or np.any(a > 1) or np.any(a < 0)):
                raise DataError(f"{origin}: multi-label targets must be 0/1 rows of {classes} entries, got shape "
                                f"{a.shape}, values in [{a.min() if a.size else 0}, {a.max() if a.size else 0}]. "
                                "Fix: store one 0/1 entry per vertex and task")
            if field.endswith("_mask") and a.dtype != np.bool_:
                raise DataError(f"{origin}: {field} has dtype {a.dtype}. Fix: store a boolean mask")
        arr = pieces[0][1] if len(pieces) == 1 else np.concatenate([a for _, a in pieces])
        if arr.shape[0] != m:
            raise DataError(f"{pieces[0][0]}: {field} has {arr.shape[0]} rows for vertices {lo}..{hi - 1}. "
                            "Fix: one row per vertex")
        out[field], origins[field] = arr, pieces
    x = out["features"].astype(np.float32, copy=False)
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise DataError(f"{_origin_of(origins['features'], first)}: features of {int(bad.sum())} vertices contain "
                        f"NaN or infinite values (first: vertex {lo + first}). Fix: clean or impute those "
                        "feature rows before preprocessing (e.g. replace by 0)")
    masks = [out[f] for f in ("train_mask", "val_mask", "test_mask")]
    overlap = (masks[0].astype(np.int8) + masks[1] + masks[2]) > 1
    if overlap.any():
        first = int(np.flatnonzero(overlap)[0])
        raise DataError(f"{_origin_of(origins['train_mask'], first)}: {int(overlap.sum())} vertices are in more "
                        f"than one of train/val/test (first: vertex {lo + first}). Fix: make the splits disjoint "
                        "(overlap leaks evaluation data into training)")
    labels = out["labels"].astype(np.int64 if classes is None else np.uint8, copy=False)
    return {"features": x, "labels": labels, "train_mask": masks[0],
            "val_mask": masks[1], "test_mask": masks[2], "label_pieces": origins["labels"]}


def load_slice(comm, source, symmetrize: bool = True, self_loops: str = "remove",
               normalize: str = "none") -> GraphSlice:
    """Collective: this rank's rows of the canonical graph of `source` (module docstring).  Raises
    DataError on the rank that found a problem; callers wrap it in `group.errors` so every rank fails."""
    group = as_group(comm)
    if self_loops not in SELF_LOOP_MODES:
        raise DataError(f"{source.name}: self_loops={self_loops!r} is not one of {SELF_LOOP_MODES}. "
                        "Fix: choose remove, keep or add")
    # A typed source's relations depend on the symmetrisation (hetero_sliced.TypedSource.types_for).
    types = source.types_for(symmetrize) if hasattr(source, "types_for") else getattr(source, "types", None)
    if types is not None and self_loops == "add":
        raise DataError(f"{source.name}: self_loops='add' for a heterogeneous graph. Fix: use remove or keep: a "
                        "loop per vertex would need a relation from every type to itself")
    n, P, rank = int(source.num_vertices), group.size, group.rank
    vtxdist = vtxdist_for(n, P)
    lo, hi = int(vtxdist[rank]), int(vtxdist[rank + 1])
    read = {}  # origin -> raw edges read from it
    with group.errors("reading this rank's edges"):
        keys = _edge_keys_checked(_counted(source.edge_pieces(rank, P), read), n, symmetrize)
    _check_declared_edges(group, source, read)
    keys = shuffle_to_owners(group, keys, vtxdist, n)
    if self_loops == "add":
        loops = np.arange(lo, hi, dtype=np.int64) * (n + 1)
        keys = np.concatenate([keys, loops])
        keys.sort()
    keys = _dedupe_sorted(keys, n, drop_loops=self_loops == "remove")
    indptr = np.searchsorted(keys, np.arange(lo, hi + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(keys, n, out=keys)
    with group.errors("reading this rank's vertex rows"):
        multilabel = bool(getattr(source, "multilabel", False))  # labels [rows, C] of 0/1 (chunked.py)
        nodes = _check_nodes(source.nodes(lo, hi), lo, hi, int(source.num_features),
                             int(source.num_classes) if multilabel else None)
    derive = getattr(source, "derive_features", None)  # a typed source's types without stored features
    if derive is not None:
        nodes["features"] = derive(group, types, vtxdist, lo, indptr, keys, nodes["features"])
    labels = nodes["labels"]
    classes = source.num_classes
    if classes is None:
        top = group.allreduce_max(np.array([labels.max() if labels.size else -1], dtype=np.int64))[0]
        classes = max(int(top) + 1, 1)
    with group.errors("checking the labels"):
        if not multilabel:  # multi-label entries were checked 0/1 (_check_nodes); none is unlabelled
            _check_class_ids(nodes, labels, classes, lo)
        features = normalize_features(nodes["features"], normalize, origin=f"{source.name}: features")
    with group.errors("checking the vertex types"):
        _check_types(source, types, n, lo, indptr, keys, nodes)
    counts = group.allgather_object(int(keys.shape[0]))
    return GraphSlice(name=str(source.name), num_vertices=n, num_edges=int(sum(counts)), num_classes=int(classes),
                      vtxdist=vtxdist, lo=lo, hi=hi, edge_offset=int(sum(counts[:rank])), indptr=indptr,
                      indices=keys, features=features, labels=labels, train_mask=nodes["train_mask"],
                      val_mask=nodes["val_mask"], test_mask=nodes["test_mask"], symmetric=bool(symmetrize),
                      types=types)


def _check_types(source, types, n: int, lo: int, indptr, indices, nodes: dict) -> None:
    """A typed source's rows: its types cover the graph, every edge has a relation, labels and splits
    lie on the target type (GraphTypes.check_rows; DataError naming the source otherwise)."""
    if types is None:
        return
    try:
        if types.num_vertices != n:
            raise TypesError(f"{source.name}: the types cover {types.num_vertices} vertices, the graph has {n}")
        types.check_rows(lo, indptr, indices, nodes["labels"],
                         [nodes[f] for f in ("train_mask", "val_mask", "test_mask")], str(source.name))
    except TypesError as err:
        raise DataError(str(err)) from None


def _check_class_ids(nodes: dict, labels: np.ndarray, classes: int, lo: int) -> None:
    """A single-label slice's class ids: inside the class count, none unlabelled in a split."""
    split = nodes["train_mask"] | nodes["val_mask"] | nodes["test_mask"]
    out_of_range = (labels < -1) | (labels >= classes)
    if out_of_range.any():
        first = int(np.flatnonzero(out_of_range)[0])
        raise DataError(f"{_origin_of(nodes['label_pieces'], first)}: labels span [{labels.min()}, "
                        f"{labels.max()}] but num_classes={classes} (valid: 0..num_classes-1, or -1 for "
                        f"unlabelled; first bad: vertex {lo + first}). Fix: fix the labels or the num_classes "
                        "in metadata.json")
    bad = (labels < 0) & split
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise DataError(f"{_origin_of(nodes['label_pieces'], first)}: {int(bad.sum())} unlabelled vertices "
                        f"(label -1) are in a train/val/test split (first: vertex {lo + first}). Fix: remove "
                        "them from the splits or give them labels")


def assemble(comm, part: GraphSlice) -> Graph:
    """The whole canonical Graph on every rank from the slices (allgathers): for the build phases that
    still work on the whole graph."""
    group = as_group(comm)
    rows = np.diff(part.vtxdist)
    degrees = group.allgatherv_rows(np.diff(part.indptr), rows)
    indptr = np.zeros(part.num_vertices + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    del degrees
    counts = group.allgather_object(int(part.indices.shape[0]))
    indices = group.allgatherv_rows(part.indices, counts)
    fields = {f: group.allgatherv_rows(getattr(part, f), rows) for f in NODE_FIELDS}
    return Graph(name=part.name, indptr=indptr, indices=indices, num_classes=part.num_classes, types=part.types,
                 **fields)


def slice_digest(comm, part: GraphSlice) -> str:
    """build.dataset_digest of the whole canonical graph, from the slices (every rank gets it), fed to
    the one digest definition (granndis_hpc/shards/content.py ContentHash), so the two cannot drift."""
    group = as_group(comm)
    multilabel = part.labels.ndim == 2  # uint8 [rows, C] (ContentHash's multi-label form)
    record = None if part.types is None else part.types.to_record()  # as content.dataset_digest folds it in
    h = ContentHash(part.num_classes, multilabel, record) if group.rank == 0 else None
    last = group.rank == group.size - 1
    n, e = part.num_vertices, part.num_edges
    shapes = {"indptr": [n + 1], "indices": [e], "features": [n, part.num_features],
              "labels": [n, part.num_classes] if multilabel else [n]}
    for name, dtype in CONTENT:
        dtype = "|u1" if name == "labels" and multilabel else dtype
        if name == "indptr":
            local = part.indptr[:None if last else -1] + part.edge_offset
        else:
            local = getattr(part, name)
        local = np.ascontiguousarray(local, dtype=dtype)
        if group.rank == 0:
            h.begin(name, shapes.get(name, [n]))
        group.stream_to(local, (lambda a: h.update(a, dtype)) if group.rank == 0 else None)
    return group.bcast_object(h.hexdigest() if group.rank == 0 else None)
