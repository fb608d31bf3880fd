"""DistDGL's chunked graph format with several node and edge types, as a typed sliced source
(`--source chunked`, told from the homogeneous case by metadata.json's type lists).

    metadata.json  {"graph_name", "node_type": [T, ...],
                    "num_nodes_per_type": [N_T, ...]  (or DGL chunk_graph.py's "num_nodes_per_chunk": [[n, ...], ...]),
                    "edge_type": ["S:rel:D", ...],
                    "num_edges_per_type": [E_R, ...]  (or "num_edges_per_chunk": [[e, ...], ...]),
                    "edges": {"S:rel:D": {"format": {"name": "csv", "delimiter": " "} | {"name": "numpy"},
                                          "data": [file, ...]}},
                    "node_data": {"T": {"feat": {"format": {"name": "numpy"}, "data": [file, ...]}, ...},
                                  "<target>": {"feat": ..., "label": ..., "train_mask": ..., "val_mask": ...,
                                               "test_mask": ...}}}

An edge file holds "src dst" pairs in per-type ids (the source's ids among its type, the destination's
among its type), as text or `.npy` [E_i, 2]; node data are `.npy` chunks in per-type id order (masks
may be 0/1 integers).  The graph is the one `canonicalize_hetero` makes of the same arrays
(preprocess/sources/hetero.py, docs/heterogeneous.md): types take type-major global ids in the order of
node_type, relations in the order of edge_type, reverse relations by symmetrisation, the target type is
the one node type with a "label" (or --target-type), types without "feat" derive their features from
their in-neighbours (preprocess/sources/hetero_sliced.py).  Rank r of P reads the edge files r, r+P, ...
(all relations' files in one list) and the node data rows of its vertices; the edge total and each
relation's count are checked against the declared counts as in the homogeneous reader
(preprocess/formats/distdgl.py).  Only files
under the directory are read (preprocess/formats/inputfiles.py).
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.graph.hetero import Relation
from granndis_hpc.preprocess.formats.chunkrange import chunk_pieces
from granndis_hpc.preprocess.formats.distdgl import _bad, _npy, read_edge_file, type_counts
from granndis_hpc.preprocess.formats.inputfiles import file_under
from granndis_hpc.preprocess.sources.hetero_sliced import MASKS, TypedSource

FIX = "see DistDGL's chunked graph format (docs/preparing-data.md)"


def _names(meta: dict, key: str, mp: str, parts: int) -> list:
    names = meta.get(key)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise _bad(mp, f"{key} must be a non-empty list of names, got {names!r}", FIX)
    for n in names:
        bits = n.split(":")
        if len(bits) != parts or not all(bits) or any("__" in b for b in bits):
            raise _bad(mp, f"{key} entry {n!r} is not " + ("a name" if parts == 1 else "'src:rel:dst'")
                       + " without '__'", "rename it (':' separates the parts, '__' is reserved)")
    if len(set(names)) != len(names):
        raise _bad(mp, f"{key} lists a name twice: {names}", "list every type once")
    return names


class _Chunks:
    """One node field of one type: its `.npy` chunks, memory-mapped, with their row offsets."""

    def __init__(self, path: str, spec, mp: str, where: str, rows: int, matrix: bool):
        try:
            names = list(spec["data"])
        except (KeyError, TypeError) as exc:
            raise _bad(mp, f"{where} has no list 'data' ({exc})", FIX) from None
        if (spec.get("format") or {}).get("name", "numpy") != "numpy":
            raise _bad(mp, f"{where} is not in numpy format", "store node data as .npy chunks")
        self.files = [(f, _npy(f)) for f in (file_under(path, n, mp) for n in names)]
        for f, a in self.files:
            ok = a.ndim == 2 if matrix else (a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1))
            if not ok or (matrix and a.shape[1] != self.files[0][1].shape[1]):
                raise _bad(f, f"{where} chunk has shape {tuple(a.shape)}, expected "
                           + ("[rows, F] of one width" if matrix else "[rows]"), "one row per vertex")
        self.offsets = np.concatenate([[0], np.cumsum([a.shape[0] for _, a in self.files])]).astype(np.int64)
        if int(self.offsets[-1]) != rows:
            raise _bad(mp, f"the {where} chunks hold {int(self.offsets[-1])} rows but the type has {rows} vertices",
                       "correct the node counts or the chunks")
        self.width = int(self.files[0][1].shape[1]) if matrix and self.files else 0

    def rows(self, lo: int, hi: int):
        out = []
        for f, a, s, e in chunk_pieces(self.offsets, self.files, lo, hi):
            x = np.asarray(a[s:e])
            out.append((f, x.reshape(-1) if x.ndim == 2 and not self.width else x))
        return out


class DistDGLTypedSource(TypedSource):
    """A DistDGL chunked directory with several node or edge types (module docstring)."""

    def __init__(self, path: str, meta: dict, name: str | None = None, target_type: str | None = None):
        mp = os.path.join(path, "metadata.json")
        types, etypes = _names(meta, "node_type", mp, 1), _names(meta, "edge_type", mp, 3)
        counts, ecounts = type_counts(meta, "nodes", mp), type_counts(meta, "edges", mp)
        if len(counts) != len(types) or len(ecounts) != len(etypes) or min(counts) < 0 or min(ecounts, default=0) < 0:
            raise _bad(mp, f"{len(types)} node types with counts {counts}, {len(etypes)} edge types with counts "
                       f"{ecounts}", "give one non-negative count per type")
        counts = dict(zip(types, counts))
        self.edge_files = []  # (relation, file, format, delimiter), every relation's files in order
        for et in etypes:
            try:
                spec = meta["edges"][et]
                fmt, delim = spec["format"]["name"], spec["format"].get("delimiter", " ")
                names = list(spec["data"])
            except (KeyError, TypeError, AttributeError) as exc:
                raise _bad(mp, f"edges.{et} is missing or malformed ({exc})", FIX) from None
            if fmt not in ("csv", "numpy"):
                raise _bad(mp, f"edges.{et}: format {fmt!r} is not csv or numpy", "store edges as text or .npy")
            for f in (file_under(path, n, mp) for n in names):
                if not os.path.isfile(f):
                    raise _bad(f, "edge file not found", "restore it or correct metadata.json")
                if fmt == "numpy" and (_npy(f).ndim != 2 or _npy(f).shape[1] != 2):
                    raise _bad(f, f"edge chunk has shape {_npy(f).shape}, expected [E_i, 2]", FIX)
                self.edge_files.append((Relation(*et.split(":")), f, fmt, delim))
        # Each relation's declared count, checked against its own files (build/sliced.py).
        self.declared_per_relation = {
            et: (e, [f for rel, f, _, _ in self.edge_files if rel.key == tuple(et.split(":"))])
            for et, e in zip(etypes, ecounts)}
        self.num_edges = self.declared_edges = sum(ecounts)
        self.declared_in = f"{mp}: num_edges_per_type"
        data = meta.get("node_data") or {}
        if not isinstance(data, dict) or set(data) - set(types):
            raise _bad(mp, "node_data names types "
                           f"{sorted(set(data) - set(types)) if isinstance(data, dict) else data} "
                       f"that are not in node_type {types}", "key node_data by the node types")
        labelled = [t for t in types if "label" in (data.get(t) or {})]
        target = target_type or (labelled[0] if len(labelled) == 1 else None)
        if target is None:
            raise _bad(mp, f"node types with a 'label': {labelled}", "give the labels and splits of one node type, "
                       "or pick one with --target-type" if labelled else "give one node type label, train_mask, "
                       "val_mask and test_mask")
        if target not in types:
            raise _bad(mp, f"--target-type {target!r} is not one of the node types {types}", "name a node type")
        tdata = data.get(target) or {}
        missing = [k for k in ("label", *MASKS) if k not in tdata]
        if missing:
            raise _bad(mp, f"node_data.{target} (the target type) has no {missing}",
                       "add the target type's label and the three split masks")
        self.feats = {t: _Chunks(path, data[t]["feat"], mp, f"node_data.{t}.feat", counts[t], True)
                      for t in types if "feat" in (data.get(t) or {})}
        if not self.feats:
            raise _bad(mp, "no node type has a 'feat'", "give the features of at least one type (the others are "
                       "derived from them)")
        widths = {t: c.width for t, c in self.feats.items()}  # types of different widths: each its own
        self.target_data = {k: _Chunks(path, tdata[k], mp, f"node_data.{target}.{k}", counts[target], False)
                            for k in ("label", *MASKS)}
        name = name or str(meta.get("graph_name") or os.path.basename(os.path.normpath(path)))
        super().__init__(name, counts, [Relation(*et.split(":")) for et in etypes], set(self.feats), target,
                         widths, None, origin=mp)

    def relation_pieces(self, rank: int, size: int):
        for rel, f, fmt, delim in self.edge_files[rank::size]:
            src, dst = read_edge_file(f, fmt, delim)
            yield f, rel, src, dst

    def stored_rows(self, t: str, lo: int, hi: int):
        return self.feats[t].rows(lo, hi)

    def target_rows(self, lo: int, hi: int) -> dict:
        out = {"labels": self.target_data["label"].rows(lo, hi)}
        for m in MASKS:
            pieces = []
            for f, a in self.target_data[m].rows(lo, hi):
                if a.dtype != np.bool_ and np.issubdtype(a.dtype, np.integer):
                    if a.size and (a.min() < 0 or a.max() > 1):
                        raise _bad(f, f"{m} holds values other than 0/1", "store a boolean or 0/1 mask")
                    a = a.astype(bool)
                pieces.append((f, a))
            out[m] = pieces
        return out
