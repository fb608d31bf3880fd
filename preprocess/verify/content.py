"""verify's content checks in bounded memory: the dataset content digest and the check that
preloaded rows are copies of their home rows, reading the server files in blocks of global ids.

The digest (shards/content.py ContentHash, as build.dataset_digest) hashes the in-edge CSR, the features, the labels
and the split in
global-id order.  A server file's rows are ordered by (owner GPU, hop, global id), or with locality
blocks by (owner GPU, hop, home part, block, global id) (preprocess/partition/row_blocks.py): either way a file
is a sequence of runs sorted by global id (found where the id decreases or the GPU or hop changes; one
run per class of rows), and the rows of a block of global ids a..b-1 are one contiguous row range of
each run: each block is assembled from one h5py range read per run (inner
runs: the home rows, their world-view edges; preloaded runs: the copies to compare), hashed, and
dropped.  Held: a few int64 arrays of N and of each file's rows (ids, world row pointer, labels and
masks) and one block (BLOCK_BYTES of features and of edges); never the N x F features or the E edges.
"""
from __future__ import annotations

import contextlib

import numpy as np

from granndis_hpc.shards import open_server, read_server_arrays, server_file_name
from granndis_hpc.shards.typed_rows import feature_rows
from granndis_hpc.shards.content import CONTENT, ContentHash

BLOCK_BYTES = 32 << 20
_SPLITS = ("train", "val", "test")
_SMALL = ("vertices/global_id", "vertices/owner", "vertices/hop", "vertices/offsets", "world/offsets",
          "world/indptr", "labels", "split/train", "split/val", "split/test")


class _Runs:
    """One server file's runs sorted by global id (module docstring) and its small per-row arrays."""

    def __init__(self, path: str, manifest: dict, s: int):
        a = read_server_arrays(path, manifest, s, names=_SMALL)
        self.gid, self.owner, hop = a["vertices/global_id"], a["vertices/owner"], a["vertices/hop"]
        self.offsets, self.w_offsets, self.w_indptr = a["vertices/offsets"], a["world/offsets"], a["world/indptr"]
        self.labels, self.masks = a["labels"], {k: a[f"split/{k}"] for k in _SPLITS}
        self.is_inner = hop == 0
        change = np.flatnonzero((self.owner[1:] != self.owner[:-1]) | (hop[1:] != hop[:-1])
                                | (self.gid[1:] < self.gid[:-1])) + 1
        self.starts = np.concatenate([[0], change]).astype(np.int64)
        self.ends = np.concatenate([change, [self.gid.shape[0]]]).astype(np.int64)
        self.run_inner = hop[self.starts] == 0 if self.gid.size else np.zeros(0, dtype=bool)

    def ranges(self, a: int, b: int, inner: bool):
        """(GPU, first row, end row) of the rows with global id in a..b-1, one per inner (or preloaded)
        run (a loop over runs: GPUs x hops x locality blocks, not vertices)."""
        for lo, hi, is_inner in zip(self.starts, self.ends, self.run_inner):
            if bool(is_inner) != inner:
                continue
            ids = self.gid[lo:hi]
            r0, r1 = lo + np.searchsorted(ids, a), lo + np.searchsorted(ids, b)
            if r1 > r0:
                yield int(self.owner[lo]), int(r0), int(r1)


def content_pass(path: str, manifest: dict, files, degree: np.ndarray, digest: bool):
    """(problems of preloaded copies, the content digest or None): what verify's content checks need,
    streamed (module docstring).  `degree`: every vertex's in-degree (from the home files)."""
    ds = manifest["dataset"]
    N, F = int(ds["num_vertices"]), int(ds["num_features"])
    dtypes = dict(CONTENT)
    runs = {s: _Runs(path, manifest, s) for s in files}
    indptr = np.zeros(N + 1, dtype=dtypes["indptr"])
    np.cumsum(degree, out=indptr[1:])
    multilabel = ds.get("multilabel") is True  # labels uint8 [N, C] (shards/schema.py)
    labels = np.zeros((N, int(ds["num_classes"])) if multilabel else N, dtype="|u1" if multilabel else dtypes["labels"])
    masks = {k: np.zeros(N, dtype=bool) for k in _SPLITS}
    for r in runs.values():
        gid = r.gid[r.is_inner]
        labels[gid] = r.labels[r.is_inner]
        for k in _SPLITS:
            masks[k][gid] = r.masks[k][r.is_inner]
    differ = {s: [] for s in files}
    for s, r in runs.items():  # labels and masks are small: compared whole
        pre = ~r.is_inner
        gid = r.gid[pre]
        differ[s] += [name for name, mine, home in (("labels", r.labels[pre], labels[gid]),
                      *((f"split/{k}", r.masks[k][pre], masks[k][gid]) for k in _SPLITS))
                      if not np.array_equal(mine, home)]
    avg_degree = -(-int(indptr[-1]) // max(N, 1))
    block = max(1, BLOCK_BYTES // (4 * F + 8 * avg_degree + 8))
    h = ContentHash(ds["num_classes"], multilabel, ds.get("types")) if digest else None
    with contextlib.ExitStack() as stack:
        handles = {s: stack.enter_context(open_server(path, manifest, s)) for s in files}
        features = {s: feature_rows(f, manifest) for s, f in handles.items()}  # flat ones as rows
        if h is not None:
            h.update(indptr, h.begin("indptr", indptr.shape))
            dtype = h.begin("indices", [int(indptr[-1])])
            for a in range(0, N, block):
                h.update(_edge_block(runs, handles, indptr, a, min(N, a + block)), dtype)
            h.begin("features", [N, F])
        features_differ = set()
        for a in range(0, N, block):
            b = min(N, a + block)
            home = np.zeros((b - a, F), dtype=dtypes["features"])
            for s, r in runs.items():
                for _, r0, r1 in r.ranges(a, b, inner=True):
                    home[r.gid[r0:r1] - a] = features[s][r0:r1]
            if h is not None:
                h.update(home, dtypes["features"])
            for s, r in runs.items():
                if s in features_differ:
                    continue
                for _, r0, r1 in r.ranges(a, b, inner=False):
                    if not np.array_equal(features[s][r0:r1], home[r.gid[r0:r1] - a]):
                        features_differ.add(s)
                        break
    for s in features_differ:
        differ[s].insert(0, "features")
    if h is not None:
        for name in ("labels", "train_mask", "val_mask", "test_mask"):
            arr = labels if name == "labels" else masks[name[:-5]]
            h.update(arr, h.begin(name, arr.shape))
    problems = [f"{server_file_name(s)}: preloaded rows' {', '.join(differ[s])} differ from their home server's "
                f"rows (the file was edited after the build); rebuild the set" for s in files if differ[s]]
    return problems, (h.hexdigest() if h is not None else None)


def _edge_block(runs: dict, handles: dict, indptr: np.ndarray, a: int, b: int) -> np.ndarray:
    """The in-edge sources of vertices a..b-1 in global order, from their home files' world views
    (world row of inner row i of GPU g: w_offsets[g] + i - offsets[g]; sources sorted by global id)."""
    out = np.empty(int(indptr[b] - indptr[a]), dtype=np.int64)
    for s, r in runs.items():
        for g, r0, r1 in r.ranges(a, b, inner=True):
            w0 = int(r.w_offsets[g] + r0 - r.offsets[g])
            w1 = w0 + (r1 - r0)
            wptr = r.w_indptr[w0:w1 + 1]
            src = handles[s]["world/src_global_id"][int(wptr[0]):int(wptr[-1])]
            lengths = np.diff(wptr)
            shift = np.repeat(indptr[r.gid[r0:r1]] - indptr[a] - (wptr[:-1] - wptr[0]), lengths)
            out[shift + np.arange(src.shape[0], dtype=np.int64)] = src
    return out
