"""Reading shards: one rank reads only its own rows (h5py slices) plus small per-server vectors.

RankSlice holds what the engine uses.  The file also stores graph/in_degree for every server row and
world/src_in_degree (verify checks them; a sampler reads the former through read_server_graph), but
a rank's slice does not load them: nothing at run time reads them per rank."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from .checks import (check_file_layout, check_offsets, check_pointer, check_rank_slice,
                     check_server_features, check_server_graph)
from .schema import FORMAT_VERSION, ShardError, has_train_hop, is_inductive, manifest_datasets, server_file_name
from granndis_hpc.graph.typed_features import TypedRows

from .typed_rows import flat_length, read_scattered, row_widths, widths_of

if TYPE_CHECKING:  # h5py is imported where a file is opened (_open_server)
    import h5py


@dataclass
class RankSlice:
    """What one rank (server, gpu) holds.  Row i here is server-local id offsets[gpu] + i."""

    server: int
    gpu: int
    servers: int
    gpus_per_server: int
    global_id: np.ndarray  # int64 [n]   own rows, sorted by hop (then locality block, global id)
    hop: np.ndarray  # int32 [n]
    # float32 [n, F]; types of different widths: a TypedRows, each row at its own type's width
    # (graph/typed_features.py), never padded to the widest
    features: Union[np.ndarray, TypedRows]
    labels: np.ndarray  # int64 [n] class ids, or uint8 [n, C] 0/1 in a multi-label set
    train_mask: np.ndarray  # bool [n]
    val_mask: np.ndarray
    test_mask: np.ndarray
    n_inner: int  # own rows [0, n_inner) are inner (hop 0)
    indptr: np.ndarray  # int64 [n+1] own rows' in-edges, rebased to 0
    indices: np.ndarray  # int64 [nnz] sources as server-local ids
    in_degree: np.ndarray  # int64 [n] global in-degree of own rows
    server_offsets: np.ndarray  # int64 [G+1]
    server_hop: np.ndarray  # int32 [n_s] hop of every server-local id
    w_indptr: np.ndarray  # int64 [n_inner+1] world view of own inner rows
    w_src_global_id: np.ndarray  # int64 [nnz_w]
    w_src_rank: np.ndarray  # int32 [nnz_w]
    # An inductive set's (schema.INDUCTIVE_DATASETS), None in others: the train-induced in-degree of the own
    # rows, the split code of every world-view source, and the training flag of every server row (the
    # preloaded view's edges are filtered by both endpoints).
    train_in_degree: Optional[np.ndarray] = None  # int64 [n]
    w_src_split: Optional[np.ndarray] = None  # uint8 [nnz_w]
    server_train: Optional[np.ndarray] = None  # bool [n_s]
    # An inductive set's graph/train_hop (schema.TRAIN_HOP_DATASETS) of every server row, None without it: the
    # hop of every row within the train-induced graph (the preloaded view's rows and sources are scheduled by it).
    server_train_hop: Optional[np.ndarray] = None  # uint8 [n_s]

    @property
    def num_rows(self) -> int:
        return int(self.global_id.shape[0])

    @property
    def row_offset(self) -> int:
        """Server-local id of this rank's first row."""
        return int(self.server_offsets[self.gpu])


def _open_server(path: str, manifest: dict, server: int) -> h5py.File:
    servers = int(manifest["servers"])
    if not 0 <= server < servers:
        raise ShardError(f"server {server} out of range: the shard set {path!r} has {servers} servers")
    fpath = os.path.join(os.fspath(path), server_file_name(server))
    if not os.path.exists(fpath):
        raise ShardError(f"{fpath}: missing; the shard set is incomplete, rebuild it with `granndis preprocess build`")
    import h5py  # here, not at import: a build rank's partition phase, its peak, does not hold HDF5's ~13 MiB

    try:
        f = h5py.File(fpath, "r")
    except OSError as exc:
        raise ShardError(f"{fpath}: not a readable HDF5 file ({exc}); rebuild the shard set") from exc
    version = f.attrs.get("format_version")
    if version != FORMAT_VERSION or int(f.attrs.get("server", -1)) != server:
        f.close()
        raise ShardError(f"{fpath}: attrs format_version={version!r} server={f.attrs.get('server')!r}, "
                         f"expected {FORMAT_VERSION} and {server}; rebuild the shard set")
    return f


def open_server(path, manifest: dict, server: int) -> h5py.File:
    """The server file opened for reading (attrs checked), for readers that take row ranges of its
    datasets one at a time (preprocess verify's content pass); the caller closes it."""
    return _open_server(os.fspath(path), manifest, server)


def read_rank_slice(path, manifest: dict, server: int, gpu: int) -> RankSlice:
    """Read rank (server, gpu)'s rows of its server's file, read-only, with h5py slices only."""
    G = int(manifest["gpus_per_server"])
    if not 0 <= gpu < G:
        raise ShardError(f"gpu {gpu} out of range: the shard set {path!r} has {G} GPUs per server")
    with _open_server(os.fspath(path), manifest, server) as f:
        fpath = f.filename
        # Headers first (no data read): a wrong dtype or width must never size a buffer or an MPI row.
        check_file_layout(f, manifest, fpath)
        n_server = int(f["vertices/global_id"].shape[0])
        offsets = f["vertices/offsets"][:]
        inner_counts = f["vertices/inner_counts"][:]
        w_offsets = f["world/offsets"][:]
        check_offsets(offsets, inner_counts, w_offsets, n_server, manifest, fpath)
        lo, hi = int(offsets[gpu]), int(offsets[gpu + 1])
        global_id = f["vertices/global_id"][lo:hi]
        indptr = f["graph/indptr"][lo:hi + 1]
        check_pointer(indptr, f["graph/indices"].shape[0], "graph/indptr", manifest, fpath)
        e_lo, e_hi = int(indptr[0]), int(indptr[-1])
        w_lo, w_hi = int(w_offsets[gpu]), int(w_offsets[gpu + 1])
        w_indptr = f["world/indptr"][w_lo:w_hi + 1]
        check_pointer(w_indptr, f["world/src_global_id"].shape[0], "world/indptr", manifest, fpath)
        we_lo, we_hi = int(w_indptr[0]), int(w_indptr[-1])
        sl = RankSlice(
            server=server, gpu=gpu, servers=int(manifest["servers"]), gpus_per_server=G,
            global_id=global_id,
            hop=f["vertices/hop"][lo:hi],
            features=_feature_rows(f, manifest, lo, hi, global_id),
            labels=f["labels"][lo:hi],
            train_mask=f["split/train"][lo:hi],
            val_mask=f["split/val"][lo:hi],
            test_mask=f["split/test"][lo:hi],
            n_inner=int(inner_counts[gpu]),
            indptr=indptr - e_lo,
            indices=f["graph/indices"][e_lo:e_hi],
            in_degree=f["graph/in_degree"][lo:hi],
            server_offsets=offsets,
            server_hop=f["vertices/hop"][:],
            w_indptr=w_indptr - we_lo,
            w_src_global_id=f["world/src_global_id"][we_lo:we_hi],
            w_src_rank=f["world/src_rank"][we_lo:we_hi],
        )
        if is_inductive(manifest):  # check_file_layout checked their presence, dtypes and shapes
            sl.train_in_degree = f["graph/train_in_degree"][lo:hi]
            sl.w_src_split = f["world/src_split"][we_lo:we_hi]
            sl.server_train = f["split/train"][:]
            if has_train_hop(manifest):
                sl.server_train_hop = f["graph/train_hop"][:]
    check_rank_slice(sl, manifest, fpath, n_server)
    return sl


def _feature_rows(f, manifest: dict, lo: int, hi: int, global_id: np.ndarray) -> Union[np.ndarray, TypedRows]:
    """The file rows lo..hi-1's features: float32 [hi - lo, F], or (types of different widths) a
    TypedRows of the flat entries, each row at its own width."""
    types = widths_of(manifest)
    if types is None:
        return f["features"][lo:hi]
    start = flat_length(types, f["vertices/global_id"][:lo])
    length = int(row_widths(types, global_id).sum())
    return TypedRows.from_flat(f["features"][start:start + length], types, global_id,
                               int(manifest["dataset"]["num_features"]))


@dataclass(frozen=True)
class DatasetHeader:
    """A dataset's shape and dtype without its data (what read_server_arrays gives for `headers`)."""

    shape: tuple
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def read_server_arrays(path, manifest: dict, server: int, names=None, headers=()) -> dict:
    """Every dataset of one server file (or only `names`), whole (for `verify` and tests; ranks use
    read_rank_slice); the datasets named in `headers` as a DatasetHeader only (verify reads the
    features in blocks instead of holding a server's N_s x F floats)."""
    with _open_server(os.fspath(path), manifest, server) as f:
        every = manifest_datasets(manifest)
        missing = [name for name in every if name not in f]
        if missing:
            raise ShardError(f"{f.filename}: missing datasets {missing}; rebuild the shard set")
        out = {name: (DatasetHeader(tuple(f[name].shape), f[name].dtype) if name in headers else f[name][()])
               for name in (every if names is None else names)}
        out["attrs"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        out["feature_chunks"] = f["features"].chunks
        return out


def server_file(path, server: int) -> str:
    return os.path.join(os.fspath(path), server_file_name(server))


def read_server_graph(path, manifest: dict, server: int, features: bool = False) -> dict:
    """A server's whole subgraph without features: what runtime samplers (co-batches) draw from.

    Keys: indptr, indices (server-local in-edge CSR), in_degree (global), hop, train (bool), offsets,
    global_id; with features=True also features (float32 [n_s, F], or a TypedRows where the types'
    widths differ: a batched mode keeps the server's rows in host memory, as a real loader does, instead
    of reading the file per co-batch)."""
    with _open_server(os.fspath(path), manifest, server) as f:
        check_file_layout(f, manifest, f.filename)
        out = {"indptr": f["graph/indptr"][:], "indices": f["graph/indices"][:],
               "in_degree": f["graph/in_degree"][:], "hop": f["vertices/hop"][:],
               "train": f["split/train"][:], "offsets": f["vertices/offsets"][:],
               "global_id": f["vertices/global_id"][:]}
        if features:
            out["features"] = _feature_rows(f, manifest, 0, out["global_id"].shape[0], out["global_id"])
        if is_inductive(manifest):
            out["train_in_degree"] = f["graph/train_in_degree"][:]
        check_server_graph(out, manifest, f.filename)
        return out


def read_server_features(path, manifest: dict, server: int):
    """A server's feature rows, float32 [n_s, F] or a TypedRows where the types' widths differ
    (read_server_graph's with features=True), for a loader that
    holds the server's graph structure already (read by --mode auto's co-batch set-up check)."""
    with _open_server(os.fspath(path), manifest, server) as f:
        check_file_layout(f, manifest, f.filename)
        global_id = f["vertices/global_id"][:]
        features = _feature_rows(f, manifest, 0, global_id.shape[0], global_id)
        check_server_features(features, manifest, f.filename)
        return features


def read_server_rows(path, manifest: dict, server: int, ids) -> np.ndarray:
    """Feature rows of the given server-local ids (any order, unique), as float32 [len(ids), F].

    For per-GPU mini-batches, whose rows lie anywhere in the server's file.  h5py's fancy indexing
    needs increasing indices, so the ids are read sorted and put back in the caller's order."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1:
        raise ShardError(f"read_server_rows: ids must be 1-D, got shape {ids.shape}")
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    if sorted_ids.size > 1 and np.any(sorted_ids[1:] == sorted_ids[:-1]):
        raise ShardError("read_server_rows: ids must be unique (h5py reads each row once)")
    with _open_server(os.fspath(path), manifest, server) as f:
        dset = f["features"]
        types = widths_of(manifest)
        F = int(manifest["dataset"]["num_features"])
        if types is not None:
            check_file_layout(f, manifest, f.filename)
            gid = f["vertices/global_id"][:]
            if sorted_ids.size and (sorted_ids[0] < 0 or sorted_ids[-1] >= gid.shape[0]):
                raise ShardError(f"{f.filename}: row ids must lie in [0, {gid.shape[0]}), got "
                                 f"[{int(sorted_ids[0])}, {int(sorted_ids[-1])}]")
            out = np.empty((ids.size, F), dtype=np.float32)
            out[order] = read_scattered(dset, types, gid, sorted_ids, F)
            return out
        if dset.dtype != np.float32 or dset.ndim != 2 or dset.shape[1] != F:
            check_file_layout(f, manifest, f.filename)  # names the dataset, the shapes and the fix
        if sorted_ids.size and (sorted_ids[0] < 0 or sorted_ids[-1] >= dset.shape[0]):
            raise ShardError(f"{f.filename}: row ids must lie in [0, {dset.shape[0]}), got "
                             f"[{int(sorted_ids[0])}, {int(sorted_ids[-1])}]")
        out = np.empty((ids.size, dset.shape[1]), dtype=np.float32)
        if ids.size:
            out[order] = dset[sorted_ids]
        return out
