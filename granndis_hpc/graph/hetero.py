"""Vertex and edge types of a heterogeneous graph, kept beside the one canonical graph.

A heterogeneous graph is stored as one graph (granndis_hpc/graph/csr.py ``Graph``): the same CSR,
features, labels, splits, partitioning, preloading, halos and shards as any other, so every stage keeps
one code path.  What makes it heterogeneous is this record, which rides in the manifest:

- **Vertex types own contiguous id ranges.**  Type t holds the global ids
  [offsets[t], offsets[t + 1]); a vertex's type is a binary search of its id, so no per-vertex array
  travels through partitioning, preloading or the shards: every row already carries its global id.
- **An edge's type is the pair of its endpoints' types.**  Each ordered pair (source type, destination
  type) has at most one relation, so the relation of an edge u -> v is ``relation_of[type(u), type(v)]``
  and no per-edge array travels either.  A relation between vertices of one type is symmetric (as
  PyG's ``ToUndirected`` makes it); one between two types has its reverse as a relation of its own.
  The benchmark graphs of the field (ogbn-mag, IGBH, DBLP) have this form; a graph with two relations
  in the same direction between the same two types is refused where it is loaded.
- **Labels and splits belong to one target type**; vertices of other types have label -1 and are in
  no split.

Pure NumPy, no files: preprocess writes the record (``to_record``) and the engine reads it back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Relation:
    """Edges src_type -> dst_type: destination vertices (of dst_type) aggregate their sources."""

    src: str
    name: str
    dst: str

    @property
    def key(self) -> Tuple[str, str, str]:
        return (self.src, self.name, self.dst)

    def __str__(self) -> str:
        return f"{self.src}__{self.name}__{self.dst}"


class TypesError(ValueError):
    """A types record that cannot describe a graph (what is wrong, and the fix)."""


@dataclass(frozen=True)
class GraphTypes:
    """The vertex types (names, id ranges, feature width each came with) and relations of a graph."""

    names: Tuple[str, ...]
    offsets: Tuple[int, ...]  # len(names) + 1, non-decreasing, offsets[0] == 0
    relations: Tuple[Relation, ...]
    target: str
    # How each type got its features: "stored" (the source's own), or "mean:<relation>" (the mean of
    # its in-neighbours' features over that relation, derived at build time for types without any).
    feature_origin: Tuple[str, ...] = ()
    # Each type's feature width where the types' widths differ (a derived type has its source type's);
    # () where every type has the set's one width (the manifest's num_features).
    widths: Tuple[int, ...] = ()

    def __post_init__(self):
        names, offsets = tuple(self.names), tuple(int(o) for o in self.offsets)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "relations", tuple(self.relations))
        object.__setattr__(self, "feature_origin", tuple(self.feature_origin) or ("stored",) * len(names))
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        if self.widths and (len(self.widths) != len(names) or min(self.widths) < 1):
            raise TypesError(f"widths need one positive width per type ({len(names)}), got {list(self.widths)}")
        if not names or len(set(names)) != len(names):
            raise TypesError(f"vertex type names must be distinct and at least one, got {list(names)}")
        if len(offsets) != len(names) + 1 or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
            raise TypesError(f"type offsets must start at 0 and not decrease, one more than the {len(names)} "
                             f"types, got {list(offsets)}")
        if self.target not in names:
            raise TypesError(f"target type {self.target!r} is not one of the vertex types {list(names)}")
        if len(self.feature_origin) != len(names):
            raise TypesError(f"feature_origin needs one entry per type ({len(names)}), got {len(self.feature_origin)}")
        seen: Dict[Tuple[str, str], Relation] = {}
        for rel in self.relations:
            for end in (rel.src, rel.dst):
                if end not in names:
                    raise TypesError(f"relation {rel} names vertex type {end!r}, not one of {list(names)}")
            pair = (rel.src, rel.dst)
            if pair in seen:
                raise TypesError(
                    f"relations {seen[pair]} and {rel} both lead from {rel.src!r} to {rel.dst!r}: an edge's "
                    f"type is the pair of its endpoints' types, so each ordered pair may have one relation; "
                    f"merge them into one relation, or keep one of them")
            seen[pair] = rel
        if not self.relations:
            raise TypesError("a heterogeneous graph needs at least one relation")

    # ---- sizes ----------------------------------------------------------------------------------
    @property
    def num_types(self) -> int:
        return len(self.names)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    @property
    def num_vertices(self) -> int:
        return self.offsets[-1]

    def count(self, name: str) -> int:
        t = self.index(name)
        return self.offsets[t + 1] - self.offsets[t]

    @property
    def typed_widths(self) -> bool:
        """Whether the types' feature widths differ (each type's rows are stored at its own width)."""
        return bool(self.widths)

    def width_of(self, num_features: int) -> List[int]:
        """Each type's feature width: its own where the widths differ, else the set's one width."""
        return list(self.widths) if self.widths else [int(num_features)] * self.num_types

    def feature_bytes(self, num_features: int) -> List[int]:
        """Bytes of each type's feature rows in a shard set: float32 at the type's width, stored or
        derived alike (the shards hold a derived type's rows as they hold a stored type's)."""
        return [self.count(name) * w * 4 for name, w in zip(self.names, self.width_of(num_features))]

    def row_widths(self, ids) -> np.ndarray:
        """int64 feature width of each global id's row (only where the widths differ)."""
        return np.asarray(self.widths, dtype=np.int64)[self.vertex_type(ids)]

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise TypesError(f"unknown vertex type {name!r}; the graph has {list(self.names)}") from None

    def id_range(self, name: str) -> Tuple[int, int]:
        t = self.index(name)
        return self.offsets[t], self.offsets[t + 1]

    # ---- per vertex and per edge ----------------------------------------------------------------
    def vertex_type(self, ids) -> np.ndarray:
        """int64 type index of each global id."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.searchsorted(np.asarray(self.offsets[1:], dtype=np.int64), ids, side="right").astype(np.int64)

    def relation_table(self) -> np.ndarray:
        """int64 [T, T]: the relation index of edges (source type, destination type), -1 where none."""
        table = np.full((self.num_types, self.num_types), -1, dtype=np.int64)
        for r, rel in enumerate(self.relations):
            table[self.index(rel.src), self.index(rel.dst)] = r
        return table

    def edge_type(self, src_ids, dst_ids) -> np.ndarray:
        """int64 relation index of each edge src -> dst (-1: its type pair has no relation)."""
        return self.relation_table()[self.vertex_type(src_ids), self.vertex_type(dst_ids)]

    def relations_per_vertex(self) -> float:
        """The mean number of relations leading into a vertex's type, over the vertices: how many per-relation
        rows a layer holds per destination row when each relation keeps only its own type's rows."""
        into = self.destination_relations()
        n = max(self.num_vertices, 1)
        return sum(self.count(name) * len(into[t]) for t, name in enumerate(self.names)) / n

    def destination_relations(self) -> List[List[int]]:
        """For each vertex type, the relations that lead into it."""
        into: List[List[int]] = [[] for _ in self.names]
        for r, rel in enumerate(self.relations):
            into[self.index(rel.dst)].append(r)
        return into

    def check_graph(self, indptr: np.ndarray, indices: np.ndarray, labels: np.ndarray, masks: Sequence[np.ndarray],
                    origin: str) -> None:
        """Every edge has a relation; labels and splits lie on the target type only (TypesError otherwise)."""
        n = int(indptr.shape[0]) - 1
        if n != self.num_vertices:
            raise TypesError(f"{origin}: the types cover {self.num_vertices} vertices, the graph has {n}")
        self.check_rows(0, indptr, indices, labels, masks, origin)

    def check_rows(self, lo: int, indptr: np.ndarray, indices: np.ndarray, labels: np.ndarray,
                   masks: Sequence[np.ndarray], origin: str) -> None:
        """check_graph on rows lo..lo+len(indptr)-2 of the in-edge CSR alone (indptr from 0, sources and
        the rows' labels and masks): what a build rank holding one slice of the graph checks."""
        m = int(indptr.shape[0]) - 1
        dst = np.repeat(np.arange(lo, lo + m, dtype=np.int64), np.diff(indptr))
        kinds = self.edge_type(indices, dst)
        if kinds.size and int(kinds.min()) < 0:
            e = int(np.flatnonzero(kinds < 0)[0])
            s_t, d_t = self.names[self.vertex_type(indices[e])], self.names[self.vertex_type(dst[e])]
            raise TypesError(f"{origin}: edge {int(indices[e])} -> {int(dst[e])} leads from {s_t!r} to {d_t!r}, "
                             f"a pair no relation covers; add the relation or drop those edges")
        t_lo, t_hi = self.id_range(self.target)
        outside = np.ones(m, dtype=bool)
        outside[min(max(t_lo - lo, 0), m):min(max(t_hi - lo, 0), m)] = False
        for what, mask in zip(("train", "val", "test"), masks):
            if np.any(np.asarray(mask)[outside]):
                raise TypesError(f"{origin}: {what} vertices outside the target type {self.target!r}; "
                                 f"splits belong to the target type only")
        if labels.ndim == 1 and np.any(labels[outside] >= 0):
            raise TypesError(f"{origin}: vertices outside the target type {self.target!r} have labels; "
                             f"give them -1")

    # ---- the manifest's record --------------------------------------------------------------------
    def to_record(self) -> dict:
        return {"vertex_types": [{"name": name, "count": self.offsets[t + 1] - self.offsets[t],
                                  "offset": self.offsets[t], "features": self.feature_origin[t],
                                  # only where the widths differ: a set of one width keeps its record
                                  **({"width": self.widths[t]} if self.widths else {})}
                                 for t, name in enumerate(self.names)],
                "relations": [list(rel.key) for rel in self.relations],
                "target": self.target}

    @classmethod
    def from_record(cls, record: dict) -> "GraphTypes":
        try:
            types = record["vertex_types"]
            names = [t["name"] for t in types]
            offsets = [int(t["offset"]) for t in types] + [int(types[-1]["offset"]) + int(types[-1]["count"])]
            relations = [Relation(*rel) for rel in record["relations"]]
            widths = tuple(int(t["width"]) for t in types) if any("width" in t for t in types) else ()
            return cls(tuple(names), tuple(offsets), tuple(relations), record["target"],
                       tuple(t.get("features", "stored") for t in types), widths)
        except (KeyError, TypeError, IndexError, ValueError) as err:
            if isinstance(err, TypesError):
                raise
            raise TypesError(f"the manifest's types record is malformed ({err!r}); rebuild the shard set") from None


def types_of(record) -> "GraphTypes | None":
    """GraphTypes of a manifest's dataset entry (None for a homogeneous graph)."""
    entry = record.get("types") if isinstance(record, dict) else None
    return None if entry is None else GraphTypes.from_record(entry)
