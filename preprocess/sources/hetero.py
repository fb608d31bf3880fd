"""Canonicalisation of a heterogeneous graph: typed vertices and relations into the one canonical `Graph`.

A source hands over its graph the way heterogeneous datasets store it, per type and per relation with
per-type ids; `canonicalize_hetero` turns it into the canonical graph with ``graph.types`` set
(granndis_hpc/graph/hetero.py describes the representation):

* vertex types take contiguous global-id ranges in the order of ``counts`` (type-major ids);
* each relation's edges are offset to global ids; the relation of an edge is its (source type,
  destination type) pair, so two relations with the same ordered pair are refused;
* symmetrisation: a relation inside one type is made symmetric in place; a relation between two types
  sends its reversed edges into the relation of the opposite direction when the source has one (DBLP's
  writes / written_by), else into a new relation ``rev_<name>`` (PyG's ``ToUndirected`` naming);
* every type keeps its own feature width (types of different widths are recorded in ``widths``, and
  the graph holds their rows zero-padded to the widest in memory).  A type without features gets the mean of its
  in-neighbours' features over one relation into it (the usual ogbn-mag baseline features): the one
  ``derive`` names, else the first relation whose source type has stored features, else one whose
  source type has derived ones (institutions from authors from papers).  Vertices without such a
  neighbour get zeros.  Its width is that source type's.  The record says which: ``feature_origin``
  "mean:<relation>";
* labels and splits cover the target type only; the other vertices get label -1 and are in no split.

The edges then go through `canonicalize` (duplicates and self loops removed, in-edge CSR) without its
own symmetrisation, which has already been done relation by relation.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from granndis_hpc.graph.csr import Graph
from granndis_hpc.graph.hetero import GraphTypes, Relation, TypesError
from granndis_hpc.preprocess.sources.canonical import (DataError, _check_features, _check_labels, _fail, _where,
                                                       canonicalize, index_to_mask)

SPLIT_NAMES = ("train", "val", "test")


def _check_ids(ids, n: int, what: str, origin: str) -> np.ndarray:
    """int64 per-type ids, 1-D, in 0..n-1 (DataError naming the relation's file otherwise)."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise _fail(origin, f"{what} must be a 1-D array of ids, got shape {ids.shape}",
                    "pass edge_index[0] and edge_index[1] of the relation")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise _fail(origin, f"{what} have dtype {ids.dtype}, not an integer type", "store edge endpoints as integers")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise _fail(origin, f"{what} span [{int(ids.min())}, {int(ids.max())}] but the type has {n} vertices "
                    f"(valid ids 0..{n - 1})", "use 0-based ids within each vertex type (per-type ids)")
    return ids.astype(np.int64, copy=False)


def _check_counts(counts, origin: str) -> Dict[str, int]:
    if not isinstance(counts, Mapping) or not counts:
        raise _fail(origin, f"vertex counts must be a non-empty mapping type -> count, got {type(counts).__name__}",
                    "pass e.g. {'paper': 736389, 'author': 1134649}")
    out = {}
    for name, count in counts.items():
        if not isinstance(name, str) or not name:
            raise _fail(origin, f"vertex type name {name!r} is not a non-empty string", "name every type")
        if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) or int(count) < 0:
            raise _fail(origin, f"vertex type {name!r} has count {count!r}", "give a non-negative integer count")
        out[name] = int(count)
    return out


def _relations(counts, relations, symmetrize: bool, origin) -> Tuple[List[Relation], Dict[Relation, tuple]]:
    """The relations after symmetrisation, in order (given ones first, new reverses after), with their
    per-type edges as lists of (src, dst) pieces."""
    given: List[Relation] = []
    edges: Dict[Relation, list] = {}
    for key, pair in relations.items():
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) and k for k in key)):
            raise _fail(_where(origin, "edges"), f"relation key {key!r} is not (source type, name, destination type)",
                        "key every relation by a tuple of three names")
        rel = Relation(*key)
        where = _where(origin, f"edges:{rel}")
        for end in (rel.src, rel.dst):
            if end not in counts:
                raise _fail(where, f"relation {rel} names vertex type {end!r}, which has no count "
                            f"(types: {list(counts)})", "add the type to the counts or drop the relation")
        try:
            src, dst = pair
        except (TypeError, ValueError):
            raise _fail(where, f"relation {rel} must be given as (src_ids, dst_ids)",
                        "pass a pair of id arrays (or an edge_index [2, E])") from None
        src = _check_ids(src, counts[rel.src], f"source ids of {rel}", where)
        dst = _check_ids(dst, counts[rel.dst], f"destination ids of {rel}", where)
        if src.shape != dst.shape:
            raise _fail(where, f"relation {rel} has {src.size} source ids but {dst.size} destination ids",
                        "give one source and one destination per edge")
        given.append(rel)
        edges[rel] = [(src, dst)]
    try:
        GraphTypes(tuple(counts), tuple(np.cumsum([0, *counts.values()]).tolist()), tuple(given), next(iter(counts)))
    except TypesError as err:
        raise _fail(_where(origin, "edges"), str(err).split("; ")[0],
                    "merge the relations of one type pair into one relation, or keep one of them "
                    "(an edge's relation is the pair of its endpoint types)") from None
    if not symmetrize:
        return given, edges
    out, back_of = symmetrized_relations(given)
    for rel in given:
        src, dst = edges[rel][0]
        edges.setdefault(back_of[rel], []).append((dst, src))
    return out, edges


def symmetrized_relations(given) -> Tuple[List[Relation], Dict[Relation, Relation]]:
    """The relations after symmetrisation, in order (the given ones, then the new ``rev_<name>`` ones),
    and the relation each given one sends its reversed edges into: itself inside one type, the
    relation of the opposite direction when given, else its new ``rev_<name>``.  Shared by
    `canonicalize_hetero` and the typed sliced sources, so both name and order the relations alike."""
    by_pair = {(rel.src, rel.dst): rel for rel in given}
    out, back_of = list(given), {}
    for rel in given:
        back = by_pair.get((rel.dst, rel.src))
        if back is None:  # a relation of its own for the reversed edges
            back = Relation(rel.dst, f"rev_{rel.name}", rel.src)
            by_pair[(rel.dst, rel.src)] = back
            out.append(back)
        back_of[rel] = back
    return out, back_of


def _merged(pieces):
    src = np.concatenate([s for s, _ in pieces]) if pieces else np.zeros(0, np.int64)
    dst = np.concatenate([d for _, d in pieces]) if pieces else np.zeros(0, np.int64)
    return src, dst


def neighbour_mean(src, dst, n_dst: int, source_features: np.ndarray) -> np.ndarray:
    """float32 [n_dst, F]: each destination's mean over its distinct in-neighbours' feature rows (zeros
    where it has none); one sparse product, no loop over vertices."""
    import scipy.sparse as sp

    n_src = source_features.shape[0]
    adj = sp.csr_matrix((np.ones(np.asarray(src).size, dtype=np.float32), (dst, src)), shape=(n_dst, n_src))
    adj.sum_duplicates()
    adj.data[:] = 1.0  # a repeated edge counts once, as in the canonical graph
    degree = np.diff(adj.indptr).astype(np.float32)
    out = np.asarray(adj @ source_features, dtype=np.float32)
    out /= np.maximum(degree, 1.0)[:, None]
    return out


def _features(counts, features, rels, edges, derive, origin) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Every type's float32 features at its own width (a derived type's is its source type's), and how
    each got them."""
    features = dict(features or {})
    derive = dict(derive or {})
    unknown = sorted(set(features) - set(counts)) + sorted(set(derive) - set(counts))
    if unknown:
        raise _fail(_where(origin, "features"), f"features or derive name vertex types {unknown} that have no count",
                    f"use the types {list(counts)}")
    out, how = {}, {}
    for t in counts:
        if features.get(t) is not None:
            out[t] = _check_features(features[t], counts[t], _where(origin, f"features:{t}"))
            how[t] = "stored"
    if not out:
        raise _fail(_where(origin, "features"), "no vertex type has features",
                    "give the features of at least one type (the others are derived from them)")
    for t, rel_name in derive.items():
        if t in how:
            raise _fail(_where(origin, "features"), f"derive names type {t!r}, which has stored features",
                        "derive only the types without features")
        if not any(r.name == rel_name and r.dst == t for r in rels):
            into = [str(r) for r in rels if r.dst == t]
            raise _fail(_where(origin, "features"), f"derive asks for type {t!r} the relation {rel_name!r}, "
                        f"which does not lead into it (relations into it: {into})", "name one of those relations")
    for t, rel in derive_plan(list(counts), set(how), rels, derive, _where(origin, "features")):
        src, dst = _merged(edges[rel])
        out[t] = neighbour_mean(src, dst, counts[t], out[rel.src])
        how[t] = f"mean:{rel.name}"
    return out, how


def padded_rows(per_type: List[np.ndarray]) -> Tuple[np.ndarray, Tuple[int, ...]]:
    """The types' feature rows one after the other as the graph holds them in memory, and the widths
    record: one width: the rows as they are and (); widths that differ: each row's features first, zeros
    up to the widest type (the shards store each row at its own width, granndis_hpc/shards/typed_rows.py)
    and each type's width."""
    widths = tuple(int(f.shape[1]) for f in per_type)
    if len(set(widths)) <= 1:
        return np.concatenate(per_type), ()
    x = np.zeros((sum(int(f.shape[0]) for f in per_type), max(widths)), dtype=np.float32)
    row = 0
    for f, w in zip(per_type, widths):
        x[row:row + f.shape[0], :w] = f
        row += f.shape[0]
    return x, widths


def derive_plan(types, stored, rels, derive=None, origin="input") -> List[Tuple[str, Relation]]:
    """(type, relation) for every type without stored features, in the order their features are
    derived (a type's source type comes first): the relation ``derive`` names, else the first one
    into it from a type with stored features, else one from a type with derived ones.  Shared by
    `canonicalize_hetero` and the typed sliced sources, so both derive alike."""
    derive = dict(derive or {})
    how = {t: "stored" for t in types if t in stored}
    plan, pending = [], [t for t in types if t not in how]
    while pending:
        progress = False
        for t in list(pending):
            into = [r for r in rels if r.dst == t and r.src in how and r.src != t
                    and (t not in derive or r.name == derive[t])]
            if not into:
                continue
            rel = next((r for r in into if how[r.src] == "stored"), into[0])
            plan.append((t, rel))
            how[t] = f"mean:{rel.name}"
            pending.remove(t)
            progress = True
        if not progress:
            raise _fail(origin, f"vertex types {pending} have no features and no relation "
                        "leads into them from a type with features", "give their features, or a relation into "
                        "them from a type with features (with symmetrisation on, one out of them serves too)")
    return plan


def _target_arrays(counts, target, labels, splits, origin):
    n_t = counts[target]
    labels = _check_labels(labels, n_t, _where(origin, "labels"))
    if labels.ndim != 1:
        raise _fail(_where(origin, "labels"), f"the target type's labels have shape {labels.shape}",
                    "give one class id per target vertex (multi-label targets are for homogeneous graphs)")
    if not isinstance(splits, Mapping) or any(s not in splits for s in SPLIT_NAMES):
        raise _fail(_where(origin, "splits"), f"splits must map {SPLIT_NAMES} to index arrays or masks",
                    "give all three splits of the target type")
    masks = []
    for s in SPLIT_NAMES:
        part = np.asarray(splits[s])
        if part.dtype == np.bool_:
            if part.shape != (n_t,):
                raise _fail(_where(origin, "splits"), f"{s} mask has shape {part.shape}, the target type "
                            f"{target!r} has {n_t} vertices", "give one boolean per target vertex, or ids")
            masks.append(part)
        else:
            masks.append(index_to_mask(part, n_t, f"{s} split of {target!r}", _where(origin, "splits")))
    return labels, masks


def choose_target(labelled: List[str], asked: Optional[str], origin: str, option: str = "--target-type",
                   no_labels_fix: str = "store the target type's labels") -> str:
    """The target type: `asked` (`option`, which must be one of the `labelled` types), else the one labelled
    type; DataError saying which types have labels and what to do otherwise."""
    if asked is not None:
        if asked not in labelled:
            raise DataError(f"{origin}: {option} {asked} has no labels (labelled types: {labelled}). Fix: name a "
                            f"type with labels")
        return asked
    if len(labelled) != 1:
        raise DataError(f"{origin}: {'no vertex type has' if not labelled else f'the types {labelled} all have'} "
                        f"labels. Fix: {no_labels_fix if not labelled else f'pick one with {option}'}")
    return labelled[0]


def canonicalize_hetero(name, counts, features, relations, labels, splits, target, num_classes=None,
                        symmetrize=True, derive=None, origin=None, self_loops="remove") -> Graph:
    """A canonical `Graph` with ``types`` set, from a heterogeneous graph given per type (module docstring).

    ``counts``: ordered mapping type -> vertex count (the order of the global id ranges); ``features``:
    type -> [count, F] array, or None / absent for a type without features; ``relations``:
    (src_type, name, dst_type) -> (src_ids, dst_ids) in per-type ids; ``labels``: the target type's class
    ids (-1 or NaN: unlabelled); ``splits``: train/val/test -> id arrays or boolean masks over the target
    type; ``derive``: type -> name of the relation whose in-neighbours' mean gives its features.
    ``origin`` names the source in errors: a string, or a dict like `canonicalize`'s whose keys may also
    be "features:<type>" and "edges:<src>__<rel>__<dst>".  ``self_loops``: remove or keep (one per
    vertex cannot be added: most types have no relation to themselves).  Every problem is a DataError.
    """
    origin = {"*": str(name), **origin} if isinstance(origin, dict) else {"*": origin or str(name)}
    base = _where(origin, "*")
    if self_loops not in ("remove", "keep"):
        raise _fail(base, f"self_loops={self_loops!r} for a heterogeneous graph", "use remove or keep: a loop per "
                    "vertex would need a relation from every type to itself")
    counts = _check_counts(counts, base)
    if target not in counts:
        raise _fail(base, f"target type {target!r} is not one of the vertex types {list(counts)}",
                    "name the type that carries the labels")
    if not isinstance(relations, Mapping) or not relations:
        raise _fail(_where(origin, "edges"), "a heterogeneous graph needs at least one relation",
                    "give the relations as {(src_type, name, dst_type): (src_ids, dst_ids)}")
    rels, edges = _relations(counts, relations, symmetrize, origin)
    feats, how = _features(counts, features, rels, edges, derive, origin)
    labels, masks = _target_arrays(counts, target, labels, splits, origin)

    offsets = np.cumsum([0, *counts.values()]).astype(np.int64)
    first = {t: int(offsets[i]) for i, t in enumerate(counts)}
    n = int(offsets[-1])
    src = np.concatenate([s + first[r.src] for r in rels for s, _ in edges[r]])
    dst = np.concatenate([d + first[r.dst] for r in rels for _, d in edges[r]])
    lo, hi = first[target], first[target] + counts[target]
    full_labels = np.full(n, -1, dtype=np.int64)
    full_labels[lo:hi] = labels
    full_masks = []
    for m in masks:
        full = np.zeros(n, dtype=bool)
        full[lo:hi] = m
        full_masks.append(full)
    x, widths = padded_rows([feats[t] for t in counts])
    graph = canonicalize(name, n, src, dst, x, full_labels, *full_masks, num_classes=num_classes,
                         symmetrize=False, self_loops=self_loops, origin=dict(origin))
    try:
        types = GraphTypes(tuple(counts), tuple(offsets.tolist()), tuple(rels), target,
                           tuple(how[t] for t in counts), widths)
        types.check_graph(graph.indptr, graph.indices, graph.labels,
                          (graph.train_mask, graph.val_mask, graph.test_mask), base)
    except TypesError as err:
        raise DataError(f"{err}. Fix: check the relations and the target type's labels and splits") from None
    return dataclasses.replace(graph, types=types)


def split_relation_key(key: str, sep: str = "__") -> Optional[Tuple[str, str, str]]:
    """(src, rel, dst) of a name written ``src<sep>rel<sep>dst``, or None when it does not have three parts."""
    parts = key.split(sep)
    return tuple(parts) if len(parts) == 3 and all(parts) else None
