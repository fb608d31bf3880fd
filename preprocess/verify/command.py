"""`granndis preprocess verify DIR` and `info DIR`.

verify checks, and reports every problem with the file it is in:
- the manifest (version, keys) and each server file's sha256 and size;
- per file: attrs, dataset dtypes/shapes, offsets, owners and the row order (by hop; by (hop, global id) without
blocks);
- CSR bounds, sortedness and no duplicate edges, for the stored subgraph and the world view;
- hops: full preload = BFS distance from the inner rows over the stored subgraph; EAS: hop <= h,
  every hop-t row feeds a hop t-1 row, and at most fanout x |hop t-1| rows at hop t;
- every global vertex is inner on exactly one server; global ids are unique inside a file;
- in-degree: one global value per vertex everywhere, equal to the world-view row length of inner rows;
- world view: src_rank equals the (server, GPU) that holds the source as an inner vertex;
  for full preloading the stored in-neighbours of inner rows are exactly the world-view ones;
- features are finite (NaN or infinity would make the loss NaN);
- manifest counts (vertices, splits, features, classes) against the files;
- the manifest's partition_digest against the owner of every vertex in the files;
- the manifest's content digest (dataset.content_sha256) against the graph, features, labels and split
  the files hold, recomputed with the build's digest.
Memory: one server file at a time, and of it only the per-row arrays (ids, owners, hops, row pointers,
degrees, labels, split): the edge-sized datasets (graph/indices, world/*) are read in row-aligned blocks
of EDGE_BLOCK edges, the features in blocks of FEATURE_BLOCK_BYTES of rows, so neither a file's features
nor its edges are held (the 12M graph's verify peaked at 13.1 GiB holding them, docs/performance/build-scaling.md).
Two passes: the per-file checks and the per-vertex tables (a few int arrays of N), then the cross-file
checks.  The content digest and the copy check read the files in blocks of global ids
(preprocess/verify/content.py).
"""
from __future__ import annotations

import os

import numpy as np

from granndis_hpc.graph.csr import bfs_hops, csr_rows, row_of_edges
from granndis_hpc.graph.hetero import GraphTypes, TypesError
from granndis_hpc.units import format_size
from granndis_hpc.shards import (ShardError, leftover_temporaries, open_server, read_manifest, read_server_arrays,
                                 server_file_name, verify_checksums)
from granndis_hpc.shards.schema import (FORMAT_VERSION, expected_shape, has_train_hop, is_inductive,
                                        manifest_datasets, row_block_rows)
from granndis_hpc.shards.typed_rows import feature_rows, flat_length, widths_of
from granndis_hpc.shards.writer import temporaries_bytes

from granndis_hpc.preprocess.build.halo import unique_sorted
from granndis_hpc.preprocess.partition.twolevel import partition_digest
from granndis_hpc.preprocess.verify.inductive import inductive_problems
from granndis_hpc.preprocess.verify.content import BLOCK_BYTES as FEATURE_BLOCK_BYTES, content_pass


# Edges per block where verify reads an edge-sized dataset (graph/indices, world/*): 32 MiB of int64.
EDGE_BLOCK = 4 << 20
# The datasets with one entry per edge: verify streams them (a file's other datasets have one per row).
_EDGE_SIZED = ("graph/indices", "world/src_global_id", "world/src_rank", "world/src_in_degree")


def _row_blocks(indptr: np.ndarray):
    """Row ranges [r0, r1) of a valid CSR pointer, each with at most EDGE_BLOCK edges (or a single row)."""
    n = indptr.shape[0] - 1
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + EDGE_BLOCK, side="right")) - 1
        r1 = min(n, max(r0 + 1, r1))
        yield r0, r1
        r0 = r1


def _block(indptr: np.ndarray, indices, r0: int, r1: int):
    """Rows [r0, r1) of a CSR: their indptr from 0 and their indices (`indices` an array or an h5py
    dataset, of which only this block is read)."""
    ptr = indptr[r0:r1 + 1]
    return ptr - ptr[0], np.asarray(indices[int(ptr[0]):int(ptr[-1])])


def _blocks(indptr: np.ndarray, indices):
    """(r0, r1, indptr, indices) of every block of _row_blocks, one block read at a time."""
    for r0, r1 in _row_blocks(indptr):
        yield (r0, r1) + _block(indptr, indices, r0, r1)


def _csr_problems(name: str, indptr: np.ndarray, indices, n_cols: int | None) -> list:
    if indptr.shape[0] == 0 or indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0]:
        return [f"{name}: indptr is not a valid CSR pointer (must start at 0, not decrease, end at nnz)"]
    unsorted = False
    for _, _, ptr, idx in _blocks(indptr, indices):
        if idx.size and (idx.min() < 0 or (n_cols is not None and idx.max() >= n_cols)):
            return [f"{name}: indices out of range [0, {n_cols})"]
        if idx.size > 1 and not unsorted:
            rising = idx[1:] > idx[:-1]
            starts = ptr[1:-1]  # a row's first edge need not exceed the previous row's last
            rising[starts[(starts > 0) & (starts < idx.size)] - 1] = True
            unsorted = not rising.all()
    if unsorted:
        return [f"{name}: indices not strictly increasing within a row (unsorted or duplicate edges)"]
    return []


def _in_neighbours_streamed(indptr: np.ndarray, indices, n: int):
    """bfs_hops' `expand` over a CSR read in blocks: the distinct in-neighbours of the frontier rows,
    marked in an array of n rows (never the frontier's edges at once)."""
    def expand(frontier: np.ndarray, _hop_of) -> np.ndarray:
        reached = np.zeros(n, dtype=bool)
        for r0, r1 in _row_blocks(indptr):
            lo, hi = np.searchsorted(frontier, (r0, r1))
            if lo < hi:  # only the blocks that hold frontier rows are read
                reached[csr_rows(*_block(indptr, indices, r0, r1), frontier[lo:hi] - r0)[1]] = True
        return np.flatnonzero(reached)
    return expand


def _file_problems(fname: str, a: dict, server: int, manifest: dict) -> list:
    S, G = int(manifest["servers"]), int(manifest["gpus_per_server"])
    ds = manifest["dataset"]
    out = []
    attrs = a["attrs"]
    if attrs.get("format_version") != FORMAT_VERSION or attrs.get("server") != server or \
            attrs.get("servers") != S or attrs.get("gpus_per_server") != G:
        out.append(f"{fname}: attrs {attrs} do not match format {FORMAT_VERSION}, server {server}, {S}x{G}")
    n = a["vertices/global_id"].shape[0]
    n_inner_w = a["world/indptr"].shape[0] - 1
    f = a["features"].shape[1] if a["features"].ndim == 2 else -1
    types = widths_of(manifest)  # flat features: every row at its type's width (shards/typed_rows.py)
    flat = flat_length(types, a["vertices/global_id"]) if types is not None else -1
    if types is not None and a["features"].shape == (flat,):
        f = int(ds["num_features"])
    for name, (dtype, rule) in manifest_datasets(manifest).items():
        want = expected_shape(rule, n, G, a["graph/indices"].shape[0], n_inner_w,
                              a["world/src_global_id"].shape[0], f, int(ds["num_classes"]), flat)
        if a[name].shape != want or a[name].dtype != dtype:
            out.append(f"{fname}: {name} has {a[name].dtype}{list(a[name].shape)}, expected {dtype}{list(want)}")
    if out:
        return out
    gid, owner, hop = a["vertices/global_id"], a["vertices/owner"], a["vertices/hop"]
    offsets, inner_counts = a["vertices/offsets"], a["vertices/inner_counts"]
    if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        out.append(f"{fname}: vertices/offsets {offsets.tolist()} is not a partition of the {n} rows")
        return out
    row_gpu = np.repeat(np.arange(G), np.diff(offsets))
    if np.any(owner != row_gpu):
        out.append(f"{fname}: vertices/owner disagrees with vertices/offsets (rows of a GPU must be contiguous)")
    if n > 1:
        same = row_gpu[1:] == row_gpu[:-1]
        if row_block_rows(manifest):  # by hop, then by locality block: the blocks are not stored
            order_ok, order = hop[1:] >= hop[:-1], "hop"
        else:
            order_ok, order = (hop[1:] > hop[:-1]) | ((hop[1:] == hop[:-1]) & (gid[1:] > gid[:-1])), "(hop, global id)"
        if np.any(same & ~order_ok):
            out.append(f"{fname}: rows of a GPU are not sorted by {order}")
    if np.any(hop < 0):
        out.append(f"{fname}: negative hops")
    if not np.array_equal(np.bincount(owner[hop == 0], minlength=G), inner_counts):
        out.append(f"{fname}: vertices/inner_counts {inner_counts.tolist()} differ from the hop-0 rows per GPU")
    if not np.array_equal(a["world/offsets"], np.concatenate([[0], np.cumsum(inner_counts)])):
        out.append(f"{fname}: world/offsets is not the cumulative sum of vertices/inner_counts")
    if gid.size and (gid.min() < 0 or gid.max() >= ds["num_vertices"]):
        out.append(f"{fname}: global ids out of range [0, {ds['num_vertices']})")
        return out
    if unique_sorted(gid).shape[0] != n:
        out.append(f"{fname}: a global vertex appears in more than one row (owned by more than one GPU)")
    out += _csr_problems(f"{fname}: graph", a["graph/indptr"], a["graph/indices"], n)
    out += _csr_problems(f"{fname}: world", a["world/indptr"], a["world/src_global_id"], ds["num_vertices"])
    if f != ds["num_features"]:
        out.append(f"{fname}: {f} features, manifest says {ds['num_features']}")
    labels = a["labels"]
    top = 2 if labels.ndim == 2 else ds["num_classes"]  # multi-label: 0/1 per class
    # -1 marks an unlabelled vertex (canonical.py allows it outside the splits: a heterogeneous graph's
    # other types, a partly labelled dataset); a vertex in a split needs a class.
    in_split = a["split/train"] | a["split/val"] | a["split/test"]
    if labels.size and (labels.min() < (0 if labels.ndim == 2 else -1) or labels.max() >= top):
        out.append(f"{fname}: labels outside [{0 if labels.ndim == 2 else -1}, {top})")
    elif labels.ndim == 1 and np.any(labels[in_split] < 0):
        out.append(f"{fname}: {int(np.count_nonzero(labels[in_split] < 0))} vertices of a train/val/test split "
                   f"have no label (-1)")
    bad, first = a["nonfinite_rows"]()
    if bad:  # the build refuses such input; training would stop with a NaN loss
        out.append(f"{fname}: features are not finite (NaN or infinity) in {bad} rows "
                   f"(first: global id {int(gid[first])}); rebuild the set from its source")
    if out:
        return out

    indptr, indices = a["graph/indptr"], a["graph/indices"]
    inner_rows = np.flatnonzero(hop == 0)
    pre = manifest["preload"]
    h = int(pre["hops"])
    if pre["kind"] == "full":
        dist = bfs_hops(indptr, None, inner_rows, h, expand=_in_neighbours_streamed(indptr, indices, n))
        if not np.array_equal(dist, hop):
            bad = int(np.count_nonzero(dist != hop))
            out.append(f"{fname}: {bad} rows have a hop that differs from the BFS distance from the inner "
                       f"vertices over the stored subgraph")
    else:
        if hop.size and hop.max() > h:
            out.append(f"{fname}: EAS rows at hop {int(hop.max())} > --hops {h}")
        fed = np.zeros(n, dtype=bool)
        for r0, _, ptr, idx in _blocks(indptr, indices):
            feeds = hop[idx] == hop[r0 + row_of_edges(ptr)] + 1
            fed[idx[feeds]] = True
        if np.any(~fed[hop > 0]):
            out.append(f"{fname}: EAS rows that feed no row one hop closer to the inner vertices")
        per_hop = np.bincount(hop, minlength=h + 1)
        fanout = int(pre["fanout"])
        if np.any(per_hop[1:] > fanout * per_hop[:-1]):
            out.append(f"{fname}: EAS hop sizes {per_hop.tolist()} exceed fanout {fanout} x previous hop")
    # World view rows are the inner rows in row order, and their length is the global in-degree.
    w_deg = np.diff(a["world/indptr"])
    if not np.array_equal(w_deg, a["graph/in_degree"][inner_rows]):
        out.append(f"{fname}: world-view row lengths differ from graph/in_degree of the inner rows")
    local_deg = np.diff(indptr)
    if np.any(local_deg > a["graph/in_degree"]):
        out.append(f"{fname}: a row has more stored in-edges than its global in-degree")
    if pre["kind"] == "full" and h >= 1 and not np.array_equal(local_deg[inner_rows], w_deg):
        out.append(f"{fname}: full preload but an inner row misses some of its in-neighbours in the stored subgraph")
    if pre["kind"] == "full" and h >= 1 and not out:
        # Same rows, same lengths (checked above): compare each row's sources as sorted global ids, a
        # block of rows at a time (world row j is inner row inner_rows[j]).
        w_ptr, w_src = a["world/indptr"], a["world/src_global_id"]
        for r0, r1, ptr, idx in _blocks(indptr, indices):
            j0, j1 = np.searchsorted(inner_rows, (r0, r1))
            if j0 == j1:
                continue
            sub_ptr, nbrs = csr_rows(ptr, idx, inner_rows[j0:j1] - r0)
            local_src = gid[nbrs]
            local_src = local_src[np.lexsort((local_src, row_of_edges(sub_ptr)))]
            if not np.array_equal(local_src, np.asarray(w_src[int(w_ptr[j0]):int(w_ptr[j1])])):
                out.append(f"{fname}: stored in-neighbours of inner rows differ from the world view")
                break
    return out


def _nonfinite_rows(feats) -> tuple:
    """(rows whose features hold a NaN or an infinity, the first such row or -1) of a server file's
    features dataset, read FEATURE_BLOCK_BYTES of rows at a time."""
    rows = feats.shape[0]
    step = max(1, FEATURE_BLOCK_BYTES // max(1, feats.dtype.itemsize * int(np.prod(feats.shape[1:]))))
    bad, first = 0, -1
    for lo in range(0, rows, step):
        nonfinite = ~np.isfinite(feats[lo:lo + step]).reshape(min(step, rows - lo), -1).all(axis=1)
        if nonfinite.any():
            first = lo + int(np.flatnonzero(nonfinite)[0]) if first < 0 else first
            bad += int(np.count_nonzero(nonfinite))
    return bad, first


def _partition_digest_problems(manifest: dict, inner_server: np.ndarray, inner_gpu: np.ndarray) -> list:
    """The manifest's partition_digest against the owners the files hold (hand-written sets may omit it;
    a build always records it, and removing it from the manifest is caught by the field digests)."""
    if "partition_digest" not in manifest:
        return []
    S, G = int(manifest["servers"]), int(manifest["gpus_per_server"])
    recorded, actual = manifest["partition_digest"], partition_digest(inner_server, inner_gpu, S, G)
    if recorded != actual:
        return [f"manifest.json: partition_digest {str(recorded)[:16]}... but the server files' owners hash to "
                f"{actual[:16]}... (the files are not the partition the build recorded); rebuild the set"]
    return []


def _temporaries_problem(path: str) -> list:
    """Temporaries of an interrupted build: harmless to readers, but they can be large."""
    names = leftover_temporaries(path)
    if not names:
        return []
    size = temporaries_bytes(path, names)
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return [f"{path}: {len(names)} temporary file(s) of an interrupted build ({shown}; {size / 2**20:.1f} MiB): "
            f"delete them, or re-run the build with --overwrite, which removes them"]


def verify_shard_set(path) -> list:
    """All problems found (an empty list means the set is valid)."""
    path = os.fspath(path)
    return _set_problems(path) + (_temporaries_problem(path) if os.path.isdir(path) else [])


def _set_problems(path: str) -> list:
    try:
        manifest = read_manifest(path)
    except ShardError as exc:
        return [str(exc)]
    problems = []
    S, G = int(manifest["servers"]), int(manifest["gpus_per_server"])
    for s in range(S):
        try:
            verify_checksums(path, manifest, servers=[s])
        except ShardError as exc:
            problems.append(str(exc))
    if problems:
        return problems
    ds = manifest["dataset"]
    N = int(ds["num_vertices"])
    inner_server = np.full(N, -1, dtype=np.int32)  # int32: three of the four tables of N at half width
    inner_gpu = np.full(N, -1, dtype=np.int32)
    inner_hits = np.zeros(N, dtype=np.int32)
    degree = np.full(N, -1, dtype=np.int64)
    files = {}
    counts = {"train": 0, "val": 0, "test": 0}
    for s in range(S):
        fname = server_file_name(s)
        try:  # the per-row arrays whole; the features and the edge-sized datasets in blocks
            a = read_server_arrays(path, manifest, s, headers=("features", "world/src_split") + _EDGE_SIZED)
        except ShardError as exc:
            problems.append(str(exc))
            continue
        with open_server(path, manifest, s) as f:
            a.update({name: f[name] for name in _EDGE_SIZED})  # h5py datasets: shape, dtype, slices
            a["nonfinite_rows"] = lambda: _nonfinite_rows(feature_rows(f, manifest))  # after the shape checks
            file_problems = _file_problems(fname, a, s, manifest)
        problems += file_problems
        if file_problems:
            continue
        files[s] = True
        inner = a["vertices/hop"] == 0
        gid = a["vertices/global_id"][inner]
        np.add.at(inner_hits, gid, 1)
        inner_server[gid] = s
        inner_gpu[gid] = a["vertices/owner"][inner]
        degree[gid] = a["graph/in_degree"][inner]
        for k in counts:
            counts[k] += int(a[f"split/{k}"][inner].sum())
        del a  # one server file in memory at a time (a set can be far larger than one process)
    if problems:
        return problems
    if np.any(inner_hits != 1):
        problems.append(f"{int(np.count_nonzero(inner_hits == 0))} vertices are inner on no server and "
                        f"{int(np.count_nonzero(inner_hits > 1))} on more than one (each must be inner on exactly one)")
        return problems
    problems += _partition_digest_problems(manifest, inner_server, inner_gpu)
    for s in files:  # second pass, again one server at a time, reading only what the cross checks need
        fname = server_file_name(s)
        a = read_server_arrays(path, manifest, s, names=("vertices/global_id", "graph/in_degree"))
        if not np.array_equal(a["graph/in_degree"], degree[a["vertices/global_id"]]):
            problems.append(f"{fname}: graph/in_degree disagrees with the in-degree stored by the vertex's home server")
        with open_server(path, manifest, s) as f:  # the world view's sources, EDGE_BLOCK at a time
            src_ds, deg_ds, rank_ds = f["world/src_global_id"], f["world/src_in_degree"], f["world/src_rank"]
            bad_degree = bad_rank = False
            for lo in range(0, src_ds.shape[0], EDGE_BLOCK):
                src = src_ds[lo:lo + EDGE_BLOCK]
                bad_degree = bad_degree or not np.array_equal(deg_ds[lo:lo + EDGE_BLOCK], degree[src])
                bad_rank = bad_rank or not np.array_equal(rank_ds[lo:lo + EDGE_BLOCK],
                                                          inner_server[src] * G + inner_gpu[src])
        if bad_degree:
            problems.append(f"{fname}: world/src_in_degree disagrees with the sources' in-degree")
        if bad_rank:
            problems.append(f"{fname}: world/src_rank disagrees with the GPU that holds the source as inner vertex")
    if int(degree.sum()) != int(ds["num_edges"]):
        problems.append(f"manifest.json: num_edges {ds['num_edges']} but the in-degrees sum to {int(degree.sum())}")
    for k, v in counts.items():
        if v != int(ds[f"num_{k}"]):
            problems.append(f"manifest.json: num_{k} {ds[f'num_{k}']} but the files hold {v} inner {k} vertices")
    if int(ds["num_classes"]) > max(N, 1):
        problems.append(f"manifest.json: num_classes {ds['num_classes']} exceeds the {N} vertices (a model would "
                        f"allocate an output layer that large); rebuild the set from its source")
    if "types" in ds:  # a heterogeneous set's types record (granndis_hpc/graph/hetero.py)
        try:
            types = GraphTypes.from_record(ds["types"])
            if types.num_vertices != N:
                problems.append(f"manifest.json: the types record covers {types.num_vertices} vertices, the set "
                                f"has {N}; rebuild the set from its source")
        except TypesError as exc:
            problems.append(f"manifest.json: {exc}")
    if int(ds["num_train"]) == 0:
        problems.append("manifest.json: num_train is 0: the set has no training vertices, so no mode can train "
                        "on it; build it from a dataset whose split marks training vertices")
    if not problems and is_inductive(manifest):  # the train-induced degrees and source splits
        problems += inductive_problems(path, manifest, list(files))
    checked = not problems  # the arrays are consistent: compare contents
    recorded = ds.get("content_sha256")
    if checked:  # preloaded rows are copies of their home server's inner rows (flx trains on them)
        copies, actual = content_pass(path, manifest, list(files), degree, digest=recorded is not None)
        problems += copies
        if recorded is not None and actual != recorded:
            problems.append(f"manifest.json: dataset.content_sha256 {str(recorded)[:16]}... but the server files' "
                            f"graph, features, labels and split hash to {actual[:16]}...: the files were edited "
                            f"after the build (their checksums recomputed); rebuild the set from its source")
    return problems


def types_line(record: dict, num_features: int) -> str:
    """A heterogeneous set's vertex types (count, feature bytes, feature origin) and relations, for `info`."""
    types = GraphTypes.from_record(record)
    wide = types.width_of(num_features) if types.typed_widths else [None] * types.num_types
    kinds = ", ".join(f"{name} {types.count(name)} ({'' if w is None else f'{w} wide, '}{format_size(nbytes)} features"
                      + (", target)" if name == types.target else ")")
                      + ("" if origin == "stored" else f" [features {origin}]")
                      for name, origin, nbytes, w in zip(types.names, types.feature_origin,
                                                         types.feature_bytes(num_features), wide))
    return f"types       {kinds}; relations {', '.join(str(r) for r in types.relations)}"


def _widest(ds: dict) -> str:
    """" (the widest type's)" where the vertex types' widths differ (the types line gives each)."""
    types = ds.get("types")
    return " (the widest type's)" if isinstance(types, dict) and widths_of({"dataset": ds}) is not None else ""


def format_info(manifest: dict) -> str:
    """Human-readable statistics of a shard set (what `info` prints)."""
    ds, pre = manifest["dataset"], manifest["preload"]
    part = manifest.get("partitioner") if isinstance(manifest.get("partitioner"), dict) else {}
    st = manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {}
    lines = [
        f"dataset     {ds['name']}: {ds['num_vertices']} vertices, {ds['num_edges']} edges, "
        f"{ds['num_features']} features{_widest(ds)}, {ds['num_classes']} "
        f"{'binary tasks (multi-label)' if ds.get('multilabel') is True else 'classes'}, train/val/test "
        f"{ds['num_train']}/{ds['num_val']}/{ds['num_test']}",
        f"content     digest {ds.get('content_sha256', 'not recorded')} (equal digests = the same graph, features, "
        f"labels and split: a checkpoint of fb/flx may continue on either set)",
        f"layout      {manifest['servers']} servers x {manifest['gpus_per_server']} GPUs, layers {manifest['layers']}, "
        f"format v{manifest['format_version']}",
        f"features    normalization {manifest.get('features', {}).get('normalization', 'none')}",
        f"preload     {pre['kind']} hops={pre['hops']}" + (f" fanout={pre['fanout']} select={pre['select']}"
                                                         if pre["kind"] == "eas" else ""),
        f"partitioner {part.get('name')} [{part.get('library')}] constraints={part.get('constraints')} "
        f"edge cut {part.get('edge_cut')} ({100 * float(part.get('edge_cut_fraction', 0)):.2f}% of edges) "
        f"vertex balance {float(part.get('vertex_balance', 1)):.3f} train balance "
        f"{float(part.get('train_balance', 1)):.3f}",
        f"partition   digest {manifest.get('partition_digest', 'not recorded')} (seed {manifest.get('seed')}; "
        f"equal digests = the same server and GPU for every vertex)",
        "row order   " + (f"by hop, then METIS locality blocks of about {row_block_rows(manifest)} rows"
                          if row_block_rows(manifest) else "by hop, then global id (built with --row-block-rows 0)"),
        "protocol    " + (("inductive: train-induced degrees, source splits and hops stored (granndis-train "
                           "--inductive)" if has_train_hop(manifest) else
                           "inductive: train-induced degrees and source splits stored, no train-induced hops (built "
                           "by an earlier version: --inductive flx and eas need a rebuild)")
                          if is_inductive(manifest) else "transductive (granndis-train --inductive needs a set "
                                                         "built with --inductive)"),
    ]
    if "types" in ds:
        lines.insert(1, types_line(ds["types"], int(ds["num_features"])))
    if st:
        lines.append(f"replication {st['replication_factor']:.3f} rows per inner vertex; server inner balance "
                     f"{st['server_inner_balance']:.3f}, rows balance {st['server_rows_balance']:.3f}, train balance "
                     f"{st['server_train_balance']:.3f}; worst GPU row balance {st['gpu_row_balance_max']:.3f}, "
                     f"worst GPU train balance {st['gpu_train_balance_max']:.3f}")
        lines.append(f"{'server':>6} {'inner':>9} {'preloaded':>10} {'share':>6} {'train':>7} {'edges':>10} "
                     f"{'rows/GPU':<28} {'train/GPU':<24}")
        for s in st.get("servers", []):
            lines.append(f"{s['server']:>6} {s['inner']:>9} {s['preloaded']:>10} {s['preloaded_share']:>6.3f} "
                         f"{s['train']:>7} {s['edges']:>10} {str(s['rows_per_gpu']):<28} {str(s['train_per_gpu']):<24}")
    files = manifest.get("files", {})
    total = sum(int(v["bytes"]) for v in files.values())
    lines.append(f"files       {len(files)} server files, {total / 2**20:.1f} MiB; command: "
                 f"{manifest.get('command', '')}")
    return "\n".join(lines)
