"""`verify` of an inductive set's datasets (preprocess/build/inductive.py), recomputed from the set itself.

Per vertex, from its home server's inner row: its split code and its train-induced in-degree, which
must equal the number of its world-view in-edges whose source is a training vertex (the world view
holds every in-edge).  Then every row's stored train-induced degree and every world-view source's split
code must equal its home values; and (a set that stores them) every row's train-induced hop must equal the BFS
recomputed over the file's own edges (inductive.train_hops).  One server file at a time; N + 8N bytes per
vertex meanwhile, and one file's edges for the hops."""
from __future__ import annotations

import numpy as np

from granndis_hpc.shards import SPLIT_BITS, has_train_hop, open_server, server_file_name, split_code

from granndis_hpc.preprocess.build.inductive import train_hops

EDGE_BLOCK = 1 << 22


def inductive_problems(path, manifest: dict, servers) -> list:
    N = int(manifest["dataset"]["num_vertices"])
    code = np.zeros(N, dtype=np.uint8)
    train_degree = np.zeros(N, dtype=np.int64)
    problems = []
    for s in servers:
        with open_server(path, manifest, s) as f:
            inner = f["vertices/hop"][:] == 0
            gid = f["vertices/global_id"][:][inner]
            code[gid] = split_code(f["split/train"][:][inner], f["split/val"][:][inner], f["split/test"][:][inner])
            train_degree[gid] = f["graph/train_in_degree"][:][inner]
            w_ptr, split_ds = f["world/indptr"][:], f["world/src_split"]
            is_train = np.zeros(split_ds.shape[0] + 1, dtype=np.int64)
            for lo in range(0, split_ds.shape[0], EDGE_BLOCK):
                block = split_ds[lo:lo + EDGE_BLOCK]
                is_train[lo + 1:lo + 1 + block.shape[0]] = (block & SPLIT_BITS["train"]) != 0
            np.cumsum(is_train, out=is_train)
            counted = is_train[w_ptr[1:]] - is_train[w_ptr[:-1]]
        if not np.array_equal(counted, train_degree[gid]):
            problems.append(f"{server_file_name(s)}: graph/train_in_degree of the inner rows differs from their "
                            f"world-view in-edges from training vertices (world/src_split)")
    for s in servers:
        fname = server_file_name(s)
        with open_server(path, manifest, s) as f:
            if not np.array_equal(f["graph/train_in_degree"][:], train_degree[f["vertices/global_id"][:]]):
                problems.append(f"{fname}: graph/train_in_degree disagrees with the degree stored by the vertex's "
                                f"home server")
            src_ds, split_ds = f["world/src_global_id"], f["world/src_split"]
            if any(not np.array_equal(split_ds[lo:lo + EDGE_BLOCK], code[src_ds[lo:lo + EDGE_BLOCK]])
                   for lo in range(0, src_ds.shape[0], EDGE_BLOCK)):
                problems.append(f"{fname}: world/src_split disagrees with the split of the sources' home rows")
            if has_train_hop(manifest):
                want = train_hops(f["graph/indptr"][:], f["graph/indices"][:], f["vertices/hop"][:],
                                  f["split/train"][:], int(manifest["preload"]["hops"]))
                bad = np.flatnonzero(f["graph/train_hop"][:] != want)
                if bad.size:
                    problems.append(f"{fname}: graph/train_hop of {bad.size} rows (first row {int(bad[0])}) differs "
                                    "from "
                                    f"the BFS from the inner training rows over the file's edges between training rows")
    return problems
