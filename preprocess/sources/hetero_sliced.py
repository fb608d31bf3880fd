"""A heterogeneous graph as a sliced source (preprocess/build/sliced.py): every build rank reads its share
of the relations' edges and the vertex rows it is given, and the ranks together produce the graph
`canonicalize_hetero` (preprocess/sources/hetero.py) gives from the whole input, the same digest.

Why it can be sliced: with type-major global ids an edge's relation is its endpoints' type pair, so
the per-relation symmetrisation of `canonicalize_hetero` (a relation inside one type made symmetric,
a cross-type one sending its reverses into the opposite relation or a new ``rev_<name>``) adds
exactly every edge's reverse, which is what the distributed canonicalisation does; only the types
record (the relations' names and order) depends on it, hence `types_for(symmetrize)`.

Derived features (a type without stored features gets the mean of its in-neighbours' features over
one relation) are computed after canonicalisation from each rank's in-edge rows: the owner of a
derived row asks the owners of its in-neighbours for their feature rows (one exchange per derived
type, in `derive_plan`'s order, so a type derived from derived features finds them ready) and
averages them with `neighbour_mean`, the whole-graph function, over the same distinct edges in the
same order, so the float32 sums are bit for bit those of the whole-graph load.

A format supplies, in per-type ids:

    relation_pieces(rank, size) -> (origin, Relation, src, dst): this rank's share of the given edges
    stored_rows(type, lo, hi)   -> [(origin, [hi - lo, F_type] array)] of a type with stored features
    target_rows(lo, hi)         -> {labels | train_mask | val_mask | test_mask: [(origin, array)]} of
                                   the target type (labels int, NaN or -1 unlabelled; masks boolean)
"""
from __future__ import annotations

import numpy as np

from granndis_hpc.graph.csr import csr_rows, row_of_edges
from granndis_hpc.graph.hetero import GraphTypes, Relation, TypesError

from granndis_hpc.preprocess.sources.canonical import DataError, _check_labels
from granndis_hpc.preprocess.sources.hetero import (_check_ids, derive_plan, neighbour_mean,
                                                    symmetrized_relations)

MASKS = ("train_mask", "val_mask", "test_mask")


class TypedSource:
    """The sliced-source protocol over a graph given per vertex type and relation (module docstring)."""

    multilabel = False
    canonical = None  # raw edges: the build canonicalises them

    def __init__(self, name: str, counts: dict, relations, stored, target: str, num_features,
                 num_classes=None, origin: str = "input"):
        """num_features: the stored types' one width, or a dict type -> width where they differ (the rows
        are then handed over zero-padded to the widest, as canonicalize_hetero holds them)."""
        widths = dict(num_features) if isinstance(num_features, dict) else {t: int(num_features) for t in stored}
        self.widths = {t: int(w) for t, w in widths.items()}
        num_features = max(self.widths.values())
        self.name, self.origin, self.target = str(name), str(origin), target
        self.counts = {t: int(c) for t, c in counts.items()}
        self.given = [r if isinstance(r, Relation) else Relation(*r) for r in relations]
        self.stored = set(stored)
        offsets = np.concatenate([[0], np.cumsum(list(self.counts.values()))]).astype(np.int64)
        self.first = {t: int(offsets[i]) for i, t in enumerate(self.counts)}
        self.offsets = tuple(int(o) for o in offsets)
        self.num_vertices, self.num_features, self.num_classes = int(offsets[-1]), int(num_features), num_classes
        if target not in self.counts:
            raise DataError(f"{origin}: target type {target!r} is not one of the vertex types {list(self.counts)}. "
                            "Fix: name the type that carries the labels")
        for rel in self.given:
            for end in (rel.src, rel.dst):
                if end not in self.counts:
                    raise DataError(f"{origin}: relation {rel} names vertex type {end!r}, which has no vertices "
                                    f"(types: {list(self.counts)}). Fix: add the type or drop the relation")
        self._record(self.given, ())  # one relation per type pair: refused here, before any work

    def types_for(self, symmetrize: bool) -> GraphTypes:
        """The types record of the graph built with or without symmetrisation (its relations differ)."""
        rels = symmetrized_relations(self.given)[0] if symmetrize else list(self.given)
        plan = dict(derive_plan(list(self.counts), self.stored, rels, origin=f"{self.origin}: features"))
        return self._record(rels, tuple("stored" if t in self.stored else f"mean:{plan[t].name}"
                                        for t in self.counts), self.type_widths(rels))

    def type_widths(self, rels) -> tuple:
        """Every type's width where the stored types' differ (a derived type's is its source type's), else ()."""
        if len(set(self.widths.values())) <= 1:
            return ()
        width = dict(self.widths)
        for t, rel in derive_plan(list(self.counts), self.stored, rels, origin=f"{self.origin}: features"):
            width[t] = width[rel.src]
        return tuple(width[t] for t in self.counts)

    def _record(self, rels, how, widths=()) -> GraphTypes:
        try:
            return GraphTypes(tuple(self.counts), self.offsets, tuple(rels), self.target, how, widths)
        except TypesError as err:
            raise DataError(f"{self.origin}: {str(err).split('; ')[0]}. Fix: merge the relations of one type "
                            "pair into one relation, or keep one of them (an edge's relation is the pair of "
                            "its endpoint types)") from None

    # ---- the sliced-source protocol ---------------------------------------------------------------
    def edge_pieces(self, rank: int, size: int):
        for origin, rel, src, dst in self.relation_pieces(rank, size):
            src = _check_ids(src, self.counts[rel.src], f"source ids of {rel}", origin)
            dst = _check_ids(dst, self.counts[rel.dst], f"destination ids of {rel}", origin)
            yield origin, src + self.first[rel.src], dst + self.first[rel.dst]

    def nodes(self, lo: int, hi: int) -> dict:
        out = {f: [] for f in ("features", "labels", *MASKS)}
        for t, count in self.counts.items():
            a, b = max(lo - self.first[t], 0), min(hi - self.first[t], count)
            if a >= b:
                continue
            if t in self.stored:
                out["features"] += [(o, self._padded(t, x, o)) for o, x in self.stored_rows(t, a, b)]
            else:  # filled in by derive_features once the edges are canonical
                out["features"].append((f"{self.origin}: {t} (derived)",
                                        np.zeros((b - a, self.num_features), dtype=np.float32)))
            if t == self.target:
                rows = self.target_rows(a, b)
                out["labels"] += [(o, _check_labels(x, x.shape[0], o)) for o, x in rows["labels"]]
                for m in MASKS:
                    out[m] += rows[m]
            else:
                out["labels"].append((self.origin, np.full(b - a, -1, dtype=np.int64)))
                for m in MASKS:
                    out[m].append((self.origin, np.zeros(b - a, dtype=bool)))
        empty = {"features": np.zeros((0, self.num_features), np.float32), "labels": np.zeros(0, np.int64)}
        return {f: p or [(self.origin, empty.get(f, np.zeros(0, bool)))] for f, p in out.items()}

    def _padded(self, t: str, rows, origin: str) -> np.ndarray:
        """A stored type's rows at the graph's width: as they are with one width, else zero-padded after
        the type's own width (DataError for rows of another width than the type's first)."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.widths[t]:
            raise DataError(f"{origin}: {t}'s features have shape {list(rows.shape)}, expected [rows, "
                            f"{self.widths[t]}] (the type's width). Fix: one row of {self.widths[t]} values per "
                            f"vertex in every file of the type")
        if rows.shape[1] == self.num_features:
            return rows
        out = np.zeros((rows.shape[0], self.num_features), dtype=np.float32)
        out[:, : rows.shape[1]] = rows
        return out

    def derive_features(self, group, types: GraphTypes, vtxdist, lo: int, indptr, indices, features):
        """Collective: this rank's rows' features with the derived types' filled in (module docstring)."""
        rels = list(types.relations)
        plan = derive_plan(list(self.counts), self.stored, rels, origin=f"{self.origin}: features")
        if plan:
            features = np.array(features, dtype=np.float32)  # writable, whatever the source handed over
        hi = lo + int(indptr.shape[0]) - 1
        for t, rel in plan:
            t_lo, t_hi = types.id_range(t)
            s_lo, s_hi = types.id_range(rel.src)
            a, b = max(lo, t_lo), min(hi, t_hi)
            rows = np.arange(a - lo, max(b, a) - lo, dtype=np.int64)
            sub_indptr, src = csr_rows(indptr, indices, rows)
            keep = (src >= s_lo) & (src < s_hi)
            dst = row_of_edges(sub_indptr)[keep]
            src = src[keep]
            need = np.unique(src)
            rows_of = fetch_rows(group, features, vtxdist, lo, need)
            if rows.size:
                features[a - lo:b - lo] = neighbour_mean(np.searchsorted(need, src), dst, rows.size, rows_of)
        return features


def fetch_rows(group, local: np.ndarray, vtxdist, lo: int, ids: np.ndarray) -> np.ndarray:
    """Collective: the rows of global ids `ids` (sorted, distinct) from the ranks owning them under
    vtxdist (this rank's rows lo.. are `local`), in the order of `ids`."""
    vtxdist = np.asarray(vtxdist, dtype=np.int64)
    counts = np.diff(np.searchsorted(ids, vtxdist)).astype(np.int64)
    asked = group.alltoallv(np.asarray(ids, dtype=np.int64), counts)
    asked_counts = group.alltoallv(counts.reshape(-1, 1), np.ones(group.size, dtype=np.int64)).reshape(-1)
    return group.alltoallv(np.ascontiguousarray(local[asked - lo]), asked_counts)
