"""DistDGL's chunked graph format, homogeneous graphs, as a sliced source (`--source chunked`); graphs with
several node or edge types are read by preprocess/formats/distdgl_hetero.py.

A directory prepared for DistDGL's distributed partitioning pipeline can be built as it is:

    metadata.json  {"graph_name", "node_type": [T], "num_nodes_per_type": [N], "edge_type": ["T:rel:T"],
                    "num_edges_per_type": [E],
                    "edges": {"T:rel:T": {"format": {"name": "csv", "delimiter": " "} | {"name": "numpy"},
                                          "data": [file, ...]}},
                    "node_data": {"T": {"feat": {"format": {"name": "numpy"}, "data": [file, ...]},
                                        "label": ..., "train_mask": ..., "val_mask": ..., "test_mask": ...}}}

Edge files: text "src dst" per line (csv with the given delimiter) or `.npy` [E_i, 2]; node data `.npy`
chunks in id order (masks may be 0/1 integers).  Text edge files cannot be sliced without parsing, so
rank r of P reads whole edge files r, r+P, ...; `.npy` files are memory-mapped.  Every rank checks the
metadata and every `.npy` header (dtype, shape, row counts against num_nodes_per_type, the `.npy` edge
rows against num_edges_per_type) before work; the edges read from text files are counted while they
are read and their total checked against num_edges_per_type (sliced.load_slice, `declared_edges`), so
a cut or missing part of an edge file is refused, never built.  Only files under the directory are
read (preprocess/formats/inputfiles.py).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.formats.chunkrange import chunk_pieces
from granndis_hpc.preprocess.formats.inputfiles import file_under, load_npy, short_error

FIELDS = {"features": "feat", "labels": "label", "train_mask": "train_mask", "val_mask": "val_mask",
          "test_mask": "test_mask"}


def is_distdgl(meta: dict) -> bool:
    return isinstance(meta, dict) and "edges" in meta and ("num_nodes_per_type" in meta
                                                            or "num_nodes_per_chunk" in meta)


def _bad(path, problem, fix="see DistDGL's chunked graph format (homogeneous graphs only)") -> DataError:
    return DataError(f"{path}: {problem}. Fix: {fix}")


def _npy(path):
    return load_npy(path, "write the chunk again (np.save of a plain numeric array)")


def read_edge_file(f: str, fmt: str, delimiter: str = " "):
    """(src, dst) of one edge file: `.npy` [E_i, 2] or text "src dst" per line (csv with `delimiter`)."""
    if fmt == "numpy":
        a = np.asarray(_npy(f))
        if a.ndim != 2 or a.shape[1] != 2:
            raise _bad(f, f"edge chunk has shape {a.shape}, expected [E_i, 2]")
        return a[:, 0], a[:, 1]
    try:
        with warnings.catch_warnings():  # an empty file is zero edges (the count check follows)
            warnings.simplefilter("ignore", UserWarning)
            a = np.loadtxt(f, dtype=np.int64, ndmin=2, delimiter=None if delimiter == " " else delimiter)
    except ValueError as exc:
        raise _bad(f, f"cannot parse the edge file ({short_error(exc)})",
                   "one 'src dst' pair of integers per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(f, f"cannot read the edge file ({short_error(exc)})",
                   "one 'src dst' pair of integers per line, as text") from None
    if a.size == 0:
        a = np.zeros((0, 2), dtype=np.int64)
    if a.shape[1] != 2:
        raise _bad(f, f"{a.shape[1]} columns per line, expected 2 (src dst)")
    return a[:, 0], a[:, 1]


def type_counts(meta: dict, what: str, mp: str) -> list:
    """The per-type vertex or edge counts (`what`: nodes or edges) of metadata.json: DGL's documented
    `num_<what>_per_type`, or the per-chunk lists `num_<what>_per_chunk` that DGL's chunk_graph.py
    writes, summed per type."""
    per_type, per_chunk = meta.get(f"num_{what}_per_type"), meta.get(f"num_{what}_per_chunk")
    try:
        if per_type is not None:
            return [int(c) for c in per_type]
        return [int(sum(int(c) for c in chunks)) for chunks in per_chunk]
    except (TypeError, ValueError) as exc:
        raise _bad(mp, f"num_{what}_per_type / num_{what}_per_chunk is malformed ({exc})",
                   f"give num_{what}_per_type as one count per type") from None


class DistDGLSource:
    """The sliced-source protocol (preprocess/build/sliced.py) over a DistDGL chunked directory."""

    canonical = None

    def __init__(self, path: str, meta: dict, name: str | None = None):
        mp = os.path.join(path, "metadata.json")
        types, etypes = meta.get("node_type"), meta.get("edge_type")
        if not (isinstance(types, list) and len(types) == 1 and isinstance(etypes, list) and len(etypes) == 1):
            raise _bad(mp, f"node types {types} and edge types {etypes}: only homogeneous graphs (one node "
                       "type, one edge type) are read", "convert the graph to a homogeneous one")
        ntype, etype = types[0], etypes[0]
        try:
            self.num_vertices = type_counts(meta, "nodes", mp)[0]
            self.num_edges = type_counts(meta, "edges", mp)[0]
            espec = meta["edges"][etype]
            self.edge_format = espec["format"]["name"]
            self.delimiter = espec["format"].get("delimiter", " ")
            edge_names = list(espec["data"])
            nspec = meta["node_data"][ntype]
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise _bad(mp, f"missing or malformed entry {exc}") from None
        if self.num_edges < 0 or self.num_vertices < 1:
            raise _bad(mp, f"num_nodes_per_type {self.num_vertices} / num_edges_per_type {self.num_edges}: "
                       "expected a vertex count >= 1 and an edge count >= 0", "correct metadata.json")
        self.edge_files = [file_under(path, f, mp) for f in edge_names]
        # Checked against the edges read (sliced.load_slice): every count metadata.json declares is.
        self.declared_edges, self.declared_in = self.num_edges, f"{mp}: num_edges_per_type"
        if self.edge_format not in ("csv", "numpy"):
            raise _bad(mp, f"edge format {self.edge_format!r} is not csv or numpy", "store edges as text or .npy")
        self.name = name or str(meta.get("graph_name") or os.path.basename(os.path.normpath(path)))
        self.node_files = {}
        for field, key in FIELDS.items():
            if key not in nspec:
                raise _bad(mp, f"node_data.{ntype} has no {key!r} (found {sorted(nspec)})",
                           f"add the {key} chunks (features, labels and the three split masks are needed)")
            try:
                names = list(nspec[key]["data"])
            except (KeyError, TypeError) as exc:
                raise _bad(mp, f"node_data.{ntype}.{key} has no list 'data' ({exc})") from None
            files = [file_under(path, f, mp) for f in names]
            arrays = [(f, _npy(f)) for f in files]
            for f, a in arrays:
                want = "[rows, F]" if field == "features" else "[rows] (or [rows, 1] for labels)"
                ok = a.ndim == 2 if field == "features" else (a.ndim == 1 or (field == "labels" and a.ndim == 2
                                                                               and a.shape[1] == 1))
                if not ok or (field == "features" and a.shape[1] != arrays[0][1].shape[1]):
                    raise _bad(f, f"{key} chunk has shape {tuple(a.shape)}, expected {want}"
                               + (" with the width of the first chunk" if ok else ""),
                               f"store one {'row of features' if field == 'features' else 'value'} per vertex")
            rows = sum(a.shape[0] for _, a in arrays)
            if rows != self.num_vertices:
                raise _bad(mp, f"the {key} chunks hold {rows} rows but num_nodes_per_type is {self.num_vertices}",
                           "correct num_nodes_per_type or the chunks")
            self.node_files[field] = arrays
        self.row_offsets = {f: np.concatenate([[0], np.cumsum([a.shape[0] for _, a in arr])])
                            for f, arr in self.node_files.items()}
        feats = self.node_files["features"][0][1]
        if feats.ndim != 2:
            raise _bad(self.node_files["features"][0][0], f"feat has shape {feats.shape}, expected [rows, F]")
        self.num_features = int(feats.shape[1])
        self.num_classes = None
        if self.edge_format == "numpy":
            found = 0
            for f in self.edge_files:
                a = _npy(f)
                if a.ndim != 2 or a.shape[1] != 2:
                    raise _bad(f, f"edge chunk has shape {a.shape}, expected [E_i, 2]")
                found += int(a.shape[0])
            if found != self.num_edges:
                raise _bad(mp, f"num_edges_per_type declares {self.num_edges} edges but the edge chunks hold "
                           f"{found}", "restore the edge chunks or correct num_edges_per_type")
        else:
            for f in self.edge_files:
                if not os.path.isfile(f):
                    raise _bad(f, "edge file not found", "restore it or correct metadata.json")

    def edge_pieces(self, rank: int, size: int):
        for f in self.edge_files[rank::size]:
            src, dst = read_edge_file(f, self.edge_format, self.delimiter)
            yield f, src, dst

    def nodes(self, lo: int, hi: int) -> dict:
        """{field: [(file, rows)]} for vertices lo..hi-1; 0/1 integer masks become booleans."""
        out = {}
        for field, files in self.node_files.items():
            pieces = []
            for path, arr, s, e in chunk_pieces(self.row_offsets[field], files, lo, hi):
                a = np.asarray(arr[s:e])
                if field.endswith("_mask") and a.dtype != np.bool_ and np.issubdtype(a.dtype, np.integer):
                    if a.size and (a.min() < 0 or a.max() > 1):
                        raise _bad(path, f"{field} holds values other than 0/1", "store a boolean or 0/1 mask")
                    a = a.astype(bool)
                if field == "labels" and a.ndim == 2 and a.shape[1] == 1:
                    a = a[:, 0]
                pieces.append((path, a))
            out[field] = pieces or [(files[0][0], np.zeros((0,) + files[0][1].shape[1:], files[0][1].dtype))]
        return out
