"""The chunked input format: a dataset as many small memory-mappable `.npy` files plus `metadata.json`.

Why: a build rank must be able to read its slice of a graph without touching the rest.
One `.npz`/HDF5 bundle, an OGB CSV or a Planetoid pickle is read whole by every rank; a directory of
`.npy` chunks is opened with `np.load(mmap_mode="r")`, so a rank pages in only the byte ranges it
slices, and several ranks read disjoint ranges of the same files.

Layout (docs/shard-format.md, "Chunked input"):

    DIR/metadata.json
    DIR/edges-00000.npy ...          int64 (or int32) [2, E_i]: row 0 sources, row 1 destinations
    DIR/features-00000.npy ...       float32 [N_j, F]       node chunk j holds vertices
    DIR/labels-00000.npy ...         int64 [N_j]            row_offsets[j] .. row_offsets[j+1]-1
                                     (multi-label, "multilabel": true: uint8 [N_j, C] of 0/1)
    DIR/train_mask-00000.npy ...     bool [N_j]   (also val_mask, test_mask)

    metadata.json = {"format": "granndis-chunked-v1", "name": ..., "num_vertices": N,
                     "num_edges": E, "num_features": F, "num_classes": C,
                     "edges": {"dtype": "int64", "chunks": [{"file": "edges-00000.npy", "count": E_0}, ...]},
                     "nodes": {"rows": [N_0, N_1, ...],
                               "features": {"dtype": "float32", "files": [...]},
                               "labels": {...}, "train_mask": {...}, "val_mask": {...}, "test_mask": {...}},
                     "canonical": {"symmetrize": ..., "self_loops": ...} or null}

Edges are directed src -> dst as a source produced them; the build canonicalises them (symmetrise,
deduplicate, self loops) exactly as for any source.  `canonical` records what the writer had already
applied (informational; canonicalisation is idempotent, so a canonical graph chunked and rebuilt with
the same options is the same dataset, the same content digest).

Validation (`open_chunked`): every rank checks metadata.json and the header of every chunk file
(exists, readable, dtype and shape as declared, counts adding up), so a bad directory gives the same
error naming the file on every rank before any work starts; ids out of range and bad values are
checked on the slice each rank reads, naming the chunk file.  `write_chunked` writes into a sibling
staging directory and renames it into place only when complete, so a failed conversion leaves
nothing half-written.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from granndis_hpc.fsutil import file_mode
from granndis_hpc.outputs import OutputKind, check_output_place

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.formats.chunkrange import chunk_pieces
from granndis_hpc.preprocess.formats.distdgl import DistDGLSource, is_distdgl
from granndis_hpc.preprocess.formats.inputfiles import file_under, load_npy

FORMAT = "granndis-chunked-v1"
NODE_FIELDS = ("features", "labels", "train_mask", "val_mask", "test_mask")
NODE_DTYPES = {"features": ("float32",), "labels": ("int64", "int32", "uint8"), "train_mask": ("bool",),
               "val_mask": ("bool",), "test_mask": ("bool",)}
EDGE_DTYPES = ("int64", "int32")


def _bad(path, problem: str, fix: str) -> DataError:
    return DataError(f"{path}: {problem}. Fix: {fix}")


def _open_npy(path: str, dtype: str, shape: tuple):
    """Memory-map one chunk file after checking it exists, is complete, and has the declared dtype and
    shape (only the header and the file size are read)."""
    a = load_npy(path, "write the chunk again (np.save of a plain numeric array), or write the directory "
                 "again with `granndis preprocess chunk`")
    if a.dtype != np.dtype(dtype):
        raise _bad(path, f"dtype {a.dtype} but metadata.json declares {dtype}",
                   f"store the chunk as {dtype} (or correct metadata.json)")
    if tuple(a.shape) != tuple(shape):
        raise _bad(path, f"shape {tuple(a.shape)} but metadata.json declares {tuple(shape)}",
                   "write the chunk again, or correct its count in metadata.json")
    return a


def _as_int(meta_path, value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(meta_path, f"{what} must be an integer >= {minimum}, got {value!r}", "correct metadata.json")
    return int(value)


@dataclass
class ChunkedDataset:
    """An opened, header-validated chunked directory (every file memory-mapped, nothing read yet)."""

    path: str
    name: str
    num_vertices: int
    num_edges: int
    num_features: int
    num_classes: int | None
    multilabel: bool  # labels are uint8 [rows, num_classes] of 0/1
    edge_files: list  # [(path, memmap [2, E_i])]
    edge_offsets: np.ndarray  # int64 [chunks + 1]
    row_offsets: np.ndarray  # int64 [node chunks + 1]
    nodes: dict  # field -> [(path, memmap)]
    canonical: dict | None

    def edge_range(self, lo: int, hi: int):
        """Yield (file, src, dst) for the global edge positions lo..hi-1 of the chunk concatenation."""
        for path, arr, s, e in chunk_pieces(self.edge_offsets, self.edge_files, lo, hi):
            piece = np.asarray(arr[:, s:e])
            yield path, piece[0], piece[1]

    def node_range(self, field: str, lo: int, hi: int):
        """Yield (file, rows) of node field `field` for the vertices lo..hi-1."""
        for path, arr, s, e in chunk_pieces(self.row_offsets, self.nodes[field], lo, hi):
            yield path, np.asarray(arr[s:e])


def open_chunked(path) -> ChunkedDataset:
    """Open and validate a chunked directory (see the module docstring); DataError naming the file."""
    if path is None:
        raise DataError("chunked: no --path given. Fix: pass --path DIR (a directory written by "
                        "`granndis preprocess chunk`)")
    path = os.fspath(path)
    meta_path = os.path.join(path, "metadata.json")
    if not os.path.isdir(path):
        raise _bad(path, "not a directory", "pass the directory written by `granndis preprocess chunk`")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise _bad(meta_path, "file not found", "a chunked dataset needs metadata.json (write it with "
                   "`granndis preprocess chunk`)") from None
    except (OSError, ValueError) as exc:
        raise _bad(meta_path, f"cannot parse ({exc})", "write metadata.json again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _bad(meta_path, f"format {meta.get('format') if isinstance(meta, dict) else None!r} is not {FORMAT!r}",
                   "write the directory with `granndis preprocess chunk`")
    try:
        n = _as_int(meta_path, meta["num_vertices"], "num_vertices", 1)
        e_total = _as_int(meta_path, meta["num_edges"], "num_edges")
        f_width = _as_int(meta_path, meta["num_features"], "num_features", 1)
        classes = meta.get("num_classes")
        if classes is not None:
            classes = _as_int(meta_path, classes, "num_classes", 1)
        edges, nodes = meta["edges"], meta["nodes"]
        edge_dtype = edges["dtype"]
        edge_chunks = edges["chunks"]
        rows = nodes["rows"]
        multilabel = meta.get("multilabel") is True
    except (KeyError, TypeError) as exc:
        raise _bad(meta_path, f"missing or malformed entry {exc}", "see docs/shard-format.md (Chunked input)") from None
    if edge_dtype not in EDGE_DTYPES:
        raise _bad(meta_path, f"edges dtype {edge_dtype!r} is not one of {EDGE_DTYPES}", "store ids as int64")
    if not isinstance(edge_chunks, list) or not isinstance(rows, list) or not rows:
        raise _bad(meta_path, "edges.chunks and nodes.rows must be non-empty lists", "correct metadata.json")
    counts = []
    edge_files = []
    for i, ch in enumerate(edge_chunks):
        if not isinstance(ch, dict) or "file" not in ch or "count" not in ch:
            raise _bad(meta_path, f"edges.chunks[{i}] needs 'file' and 'count'", "correct metadata.json")
        c = _as_int(meta_path, ch["count"], f"edges.chunks[{i}].count")
        fp = file_under(path, ch["file"], meta_path)
        edge_files.append((fp, _open_npy(fp, edge_dtype, (2, c))))
        counts.append(c)
    if sum(counts) != e_total:
        raise _bad(meta_path, f"the edge chunks hold {sum(counts)} edges but num_edges is {e_total}",
                   "correct num_edges or the chunk counts")
    rows = [_as_int(meta_path, r, "nodes.rows[*]") for r in rows]
    if sum(rows) != n:
        raise _bad(meta_path, f"the node chunks hold {sum(rows)} rows but num_vertices is {n}",
                   "correct num_vertices or nodes.rows")
    if multilabel and (classes is None or nodes["labels"].get("dtype") != "uint8"):
        raise _bad(meta_path, "a multi-label set (\"multilabel\": true) needs num_classes and uint8 labels",
                   "write the directory with `granndis preprocess chunk`")
    node_files = {}
    for field in NODE_FIELDS:
        try:
            spec = nodes[field]
            dtype, files = spec["dtype"], spec["files"]
        except (KeyError, TypeError):
            raise _bad(meta_path, f"nodes.{field} needs 'dtype' and 'files'", "correct metadata.json") from None
        if dtype not in NODE_DTYPES[field]:
            raise _bad(meta_path, f"nodes.{field} dtype {dtype!r} is not one of {NODE_DTYPES[field]}",
                       "store it with one of those dtypes")
        if not isinstance(files, list) or len(files) != len(rows):
            raise _bad(meta_path, f"nodes.{field} lists {len(files) if isinstance(files, list) else '?'} files "
                       f"but nodes.rows has {len(rows)} chunks", "list one file per node chunk")
        node_files[field] = []
        for j, (fname, r) in enumerate(zip(files, rows)):
            fp = file_under(path, fname, meta_path)
            shape = (r, f_width) if field == "features" else (r, classes) if field == "labels" and multilabel else (r,)
            node_files[field].append((fp, _open_npy(fp, dtype, shape)))
    edge_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=edge_offsets[1:])
    row_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=row_offsets[1:])
    return ChunkedDataset(path=path, name=str(meta.get("name") or os.path.basename(os.path.normpath(path))),
                          num_vertices=n, num_edges=e_total, num_features=f_width, num_classes=classes,
                          multilabel=multilabel,
                          edge_files=edge_files, edge_offsets=edge_offsets, row_offsets=row_offsets,
                          nodes=node_files, canonical=meta.get("canonical"))


# chunk has no overwrite option and replaces nothing: --out must not exist or be an empty directory
# (granndis_hpc/outputs.py refuses anything else, saying what is there).
CHUNKED = OutputKind(tool="granndis preprocess chunk", what="a chunked dataset", overwrite="",
                     recognise=lambda path: False)


def _stage_dir(out: str) -> str:
    check_output_place(out, CHUNKED, overwrite=False, error=DataError)
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
    # mkdtemp's 0700 would hide the directory from the group it is shared with: the umask's mode, as
    # mkdir gives (search permission wherever read permission is given).
    mode = file_mode()
    os.chmod(stage, mode | (mode & 0o444) >> 2)
    return stage


def write_chunked(out, *, name: str, num_vertices: int, num_features: int, num_classes: int | None,
                  edge_pieces, node_pieces, canonical: dict | None = None) -> dict:
    """Write a chunked directory at `out` (must not exist, or be empty) and return its metadata.

    edge_pieces: iterable of (src, dst) arrays, one output edge chunk each (written as int64 [2, E_i]);
    node_pieces: iterable of dicts {features, labels, train_mask, val_mask, test_mask}, one node chunk
    each, covering the vertices in id order.  Pieces are consumed one at a time (a generator keeps the
    memory at one chunk).  Everything goes to a staging directory renamed to `out` at the end."""
    stage = _stage_dir(out)
    try:
        chunks, total = [], 0
        for i, (src, dst) in enumerate(edge_pieces):
            arr = np.empty((2, int(np.asarray(src).shape[0])), dtype=np.int64)
            arr[0], arr[1] = src, dst
            fname = f"edges-{i:05d}.npy"
            np.save(os.path.join(stage, fname), arr)
            chunks.append({"file": fname, "count": int(arr.shape[1])})
            total += int(arr.shape[1])
            del arr
        rows = []
        files = {f: [] for f in NODE_FIELDS}
        dtypes = {"features": "float32", "labels": "int64", "train_mask": "bool", "val_mask": "bool",
                  "test_mask": "bool"}
        multilabel = False
        for j, piece in enumerate(node_pieces):
            if np.ndim(piece["labels"]) == 2 and np.shape(piece["labels"])[1] > 1:  # multi-label: 0/1
                multilabel, dtypes["labels"] = True, "uint8"
                num_classes = int(np.shape(piece["labels"])[1])
            r = int(np.asarray(piece["labels"]).shape[0])
            for f in NODE_FIELDS:
                a = np.ascontiguousarray(piece[f], dtype=dtypes[f])
                if a.shape[0] != r:
                    raise DataError(f"{out}: node chunk {j}: {f} has {a.shape[0]} rows, labels {r}. "
                                    "Fix: give every field the same rows")
                fname = f"{f}-{j:05d}.npy"
                np.save(os.path.join(stage, fname), a)
                files[f].append(fname)
            rows.append(r)
        if sum(rows) != num_vertices:
            raise DataError(f"{out}: node chunks hold {sum(rows)} rows, expected {num_vertices}. "
                            "Fix: cover every vertex exactly once")
        meta = {"format": FORMAT, "name": str(name), "num_vertices": int(num_vertices), "num_edges": int(total),
                "num_features": int(num_features),
                "num_classes": None if num_classes is None else int(num_classes),
                "edges": {"dtype": "int64", "chunks": chunks},
                "nodes": {"rows": rows, **{f: {"dtype": dtypes[f], "files": files[f]} for f in NODE_FIELDS}},
                "canonical": canonical, **({"multilabel": True} if multilabel else {})}
        with open(os.path.join(stage, "metadata.json"), "w") as fh:  # last: a directory without it is refused
            json.dump(meta, fh, indent=1)
        out = os.path.abspath(out)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked in _stage_dir)
        os.rename(stage, out)
        return meta
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def split_ranges(total: int, parts: int) -> np.ndarray:
    """Boundaries of `parts` contiguous, balanced ranges of 0..total-1."""
    return (np.arange(parts + 1, dtype=np.int64) * int(total)) // max(int(parts), 1)


def graph_pieces(graph, chunks: int):
    """(edge_pieces, node_pieces) of a canonical Graph split into `chunks` edge and node chunks."""
    e_bounds = split_ranges(graph.num_edges, chunks)
    v_bounds = split_ranges(graph.num_vertices, chunks)

    def edges():
        for i in range(chunks):
            lo, hi = int(e_bounds[i]), int(e_bounds[i + 1])
            # destination of edge positions lo..hi-1: the CSR row holding each position
            dst = np.searchsorted(graph.indptr, np.arange(lo, hi, dtype=np.int64), side="right") - 1
            yield graph.indices[lo:hi], dst

    def nodes():
        for j in range(chunks):
            lo, hi = int(v_bounds[j]), int(v_bounds[j + 1])
            yield {"features": graph.features[lo:hi], "labels": graph.labels[lo:hi],
                   "train_mask": graph.train_mask[lo:hi], "val_mask": graph.val_mask[lo:hi],
                   "test_mask": graph.test_mask[lo:hi]}

    return edges(), nodes()


class ChunkedSource:
    """A chunked directory as a sliced source (preprocess/build/sliced.py): rank r of P reads edge positions
    split_ranges(E, P)[r:r+2] of the chunk concatenation and the vertex rows it is given."""

    def __init__(self, ds: ChunkedDataset, name: str | None = None):
        self.ds = ds
        self.name = name or ds.name
        self.num_vertices, self.num_features, self.num_classes = ds.num_vertices, ds.num_features, ds.num_classes
        self.num_edges, self.canonical = ds.num_edges, ds.canonical
        self.multilabel = ds.multilabel

    def edge_pieces(self, rank: int, size: int):
        b = split_ranges(self.ds.num_edges, size)
        return self.ds.edge_range(int(b[rank]), int(b[rank + 1]))

    def nodes(self, lo: int, hi: int) -> dict:
        out = {}
        for field in NODE_FIELDS:
            pieces = list(self.ds.node_range(field, lo, hi))
            if not pieces:
                shape = (0, self.num_features) if field == "features" else (0,)
                pieces = [(self.ds.path, np.zeros(shape, dtype=self.ds.nodes[field][0][1].dtype))]
            out[field] = pieces
        return out


def open_source(path, name=None, target_type=None):
    """The sliced source of a chunked directory: ours (FORMAT), or DistDGL's chunked graph format,
    homogeneous (preprocess/formats/distdgl.py) or with several node or edge types
    (preprocess/formats/distdgl_hetero.py), told apart by metadata.json."""
    meta_path = os.path.join(os.fspath(path), "metadata.json") if path is not None else None
    if meta_path and os.path.isfile(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            meta = None  # open_chunked reports it
        if is_distdgl(meta):
            if meta.get("node_type") and meta.get("edge_type") and (len(meta["node_type"]) > 1
                                                                     or len(meta["edge_type"]) > 1):
                from granndis_hpc.preprocess.formats.distdgl_hetero import DistDGLTypedSource

                return DistDGLTypedSource(os.fspath(path), meta, name, target_type)
            return DistDGLSource(os.fspath(path), meta, name)
    return ChunkedSource(open_chunked(path), name)


def load_chunked(path, name=None, target_type=None, symmetrize=True, self_loops="remove"):
    """The whole canonical Graph of a chunked directory in this process (the one-rank case of the
    distributed load: the same code, so the two cannot disagree)."""
    from granndis_hpc.cluster.group import self_group

    from granndis_hpc.preprocess.build.sliced import assemble, load_slice

    group = self_group()
    part = load_slice(group, open_source(path, name, target_type), symmetrize, self_loops)
    return assemble(group, part)
