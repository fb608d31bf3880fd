"""Shard format v1: reader round trip against arrays computed from the Graph, atomic writes, refusals,
corruption detection by verify, check_job and read_manifest errors."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc import shards
from granndis_hpc.graph.csr import Graph, csr_from_edges
from granndis_hpc.shards import writer as shard_writer
from granndis_hpc.rundir.fingerprint import shard_set_id
from granndis_hpc.preprocess.build.pipeline import BuildConfig, dataset_digest, run_build
from granndis_hpc.preprocess.verify.command import verify_shard_set

COMM = MPI.COMM_SELF


def make_graph(n=523, m=2600, seed=0, directed=False, features=7, classes=5):
    rng = np.random.default_rng(seed)
    comm = rng.integers(0, 6, n)
    src, dst = rng.integers(0, n, 4 * m), rng.integers(0, n, 4 * m)
    keep = ((comm[src] == comm[dst]) | (rng.random(4 * m) < 0.1)) & (src != dst)
    src, dst = src[keep][:m], dst[keep][:m]
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keys = np.unique(src * n + dst)
    indptr, indices = csr_from_edges(keys // n, keys % n, n)
    split = rng.random(n)
    return Graph("toy", indptr, indices, rng.standard_normal((n, features)).astype(np.float32),
                 rng.integers(0, classes, n), split < 0.3, (split >= 0.3) & (split < 0.5), split >= 0.5, classes)


def build(graph, out, **kw):
    cfg = BuildConfig(out=str(out), **{"servers": 2, "gpus_per_server": 2, "layers": 2, "partitioner": "metis", **kw})
    return run_build(COMM, graph, cfg)


def bfs_hops(graph, inner, k):
    hop = {int(v): 0 for v in inner}
    frontier = set(hop)
    for h in range(1, k + 1):
        nxt = {int(u) for v in frontier for u in graph.indices[graph.indptr[v]:graph.indptr[v + 1]]} - set(hop)
        hop.update({u: h for u in nxt})
        frontier = nxt
    return hop


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("S,G,k", [(2, 2, 2), (3, 1, 1), (1, 3, 3)])
def test_rank_slices_equal_arrays_from_graph(tmp_path, directed, S, G, k):
    check_round_trip(make_graph(directed=directed, seed=S * 10 + G), tmp_path, S, G, k)


def test_rank_slices_equal_arrays_from_cora(tmp_path, planetoid_root):
    from granndis_hpc.preprocess.sources import load

    check_round_trip(load("planetoid", name="cora", root=str(planetoid_root)), tmp_path, 2, 2, 2)


def check_round_trip(g, tmp_path, S, G, k):
    manifest = build(g, tmp_path / "set", servers=S, gpus_per_server=G, layers=k)
    assert verify_shard_set(tmp_path / "set") == []
    deg = g.in_degree()
    slices = {(s, q): shards.read_rank_slice(tmp_path / "set", manifest, s, q) for s in range(S) for q in range(G)}
    home = {}  # global id -> global rank holding it as an inner vertex
    for (s, q), sl in slices.items():
        for v in sl.global_id[:sl.n_inner]:
            assert int(v) not in home
            home[int(v)] = s * G + q
    assert sorted(home) == list(range(g.num_vertices))
    for s in range(S):
        server_gid = np.concatenate([slices[(s, q)].global_id for q in range(G)])  # server-local id -> global
        whole = shards.read_server_arrays(tmp_path / "set", manifest, s)
        np.testing.assert_array_equal(whole["graph/in_degree"], deg[server_gid])
        w_src_in_degree = np.split(whole["world/src_in_degree"], whole["world/indptr"][1:-1])
        inner = [v for v, r in home.items() if r // G == s]
        ref_hop = bfs_hops(g, inner, k)
        assert sorted(server_gid.tolist()) == sorted(ref_hop)
        members = set(server_gid.tolist())
        for q in range(G):
            sl = slices[(s, q)]
            gid = sl.global_id
            np.testing.assert_array_equal(sl.hop, [ref_hop[int(v)] for v in gid])
            assert np.all(sl.hop[:sl.n_inner] == 0) and np.all(sl.hop[sl.n_inner:] > 0)
            np.testing.assert_array_equal(sl.features, g.features[gid])
            np.testing.assert_array_equal(sl.labels, g.labels[gid])
            np.testing.assert_array_equal(sl.train_mask, g.train_mask[gid])
            np.testing.assert_array_equal(sl.val_mask, g.val_mask[gid])
            np.testing.assert_array_equal(sl.test_mask, g.test_mask[gid])
            np.testing.assert_array_equal(sl.in_degree, deg[gid])
            np.testing.assert_array_equal(sl.server_hop, [ref_hop[int(v)] for v in server_gid])
            assert sl.indptr[0] == 0 and sl.indptr.shape[0] == gid.shape[0] + 1
            for i, v in enumerate(gid):
                got = sorted(server_gid[sl.indices[sl.indptr[i]:sl.indptr[i + 1]]].tolist())
                want = sorted(int(u) for u in g.indices[g.indptr[v]:g.indptr[v + 1]] if int(u) in members)
                assert got == want
            for i, v in enumerate(gid[:sl.n_inner]):
                src = g.indices[g.indptr[v]:g.indptr[v + 1]]
                np.testing.assert_array_equal(sl.w_src_global_id[sl.w_indptr[i]:sl.w_indptr[i + 1]], src)
                np.testing.assert_array_equal(sl.w_src_rank[sl.w_indptr[i]:sl.w_indptr[i + 1]],
                                              [home[int(u)] for u in src])
                inner_index = sum(slices[(s, p)].n_inner for p in range(q)) + i  # GPU 0's inner rows, then 1's
                np.testing.assert_array_equal(w_src_in_degree[inner_index], deg[src])


def test_dataset_digest_names_the_data_not_the_partition(tmp_path):
    """dataset.content_sha256 (what lets a checkpoint continue on another shard set, rundir/checkpoint.py):
    the same for every layout, partitioner and preload of one graph; different after any change to an
    edge, a feature value, a label, a split flag or the class count; independent of the arrays' dtypes."""
    import dataclasses

    import hashlib

    from granndis_hpc.preprocess.verify.command import format_info

    g = make_graph(n=300, m=900)
    digest = dataset_digest(g)
    # Independently: the documented byte layout, assembled with tobytes() and one concatenation.
    layout = [("indptr", "<i8"), ("indices", "<i8"), ("features", "<f4"), ("labels", "<i8"),
              ("train_mask", "|b1"), ("val_mask", "|b1"), ("test_mask", "|b1")]
    data = f"granndis-dataset-v1 classes={g.num_classes}".encode() + b"".join(
        f" {name}:{dtype}:{list(getattr(g, name).shape)};".encode() + getattr(g, name).astype(dtype).tobytes()
        for name, dtype in layout)
    assert digest == hashlib.sha256(data).hexdigest()
    builds = [build(g, tmp_path / "2x2"), build(g, tmp_path / "1x4", servers=1, gpus_per_server=4, hops=1),
              build(g, tmp_path / "3x1", servers=3, gpus_per_server=1, partitioner="random"),
              build(g, tmp_path / "eas", preload="eas", hops=1, fanout=3)]
    assert [m["dataset"]["content_sha256"] for m in builds] == [digest] * 4
    assert len({shard_set_id(m) for m in builds}) == 4  # while the shard sets differ
    assert shards.read_manifest(tmp_path / "1x4")["dataset"]["content_sha256"] == digest
    assert f"content     digest {digest} " in format_info(builds[1])

    def changed(**arrays):
        return dataset_digest(dataclasses.replace(g, **arrays))

    indices, features, labels, train = g.indices.copy(), g.features.copy(), g.labels.copy(), g.train_mask.copy()
    indices[0] = (indices[0] + 1) % g.num_vertices
    features[17, 3] += 1e-3
    labels[5] = (labels[5] + 1) % g.num_classes
    train[9] = not train[9]
    others = [changed(indices=indices), changed(features=features), changed(labels=labels),
              changed(train_mask=train), changed(num_classes=g.num_classes + 1),
              changed(val_mask=g.test_mask, test_mask=g.val_mask)]
    assert len(set(others) | {digest}) == len(others) + 1
    assert changed(features=g.features.astype(np.float64), labels=g.labels.astype(np.int32)) == digest
    # The manifest's field digests cover it: an edited content digest is refused like any other field.
    path = tmp_path / "2x2" / "manifest.json"
    m = json.loads(path.read_text())
    m["dataset"]["content_sha256"] = "0" * 64
    path.write_text(json.dumps(m))
    with pytest.raises(shards.ShardError, match="field dataset.content_sha256 was changed"):
        shards.read_manifest(tmp_path / "2x2")


def test_manifest_contents_and_feature_chunks(tmp_path):
    g = make_graph(n=3001, m=9000, features=300)
    m = build(g, tmp_path / "set", preload="eas", hops=1, fanout=3)
    assert m["format_version"] == 1 and m["servers"] == 2 and m["gpus_per_server"] == 2
    assert m["preload"] == {"kind": "eas", "hops": 1, "fanout": 3, "select": "degree"}
    assert m["dataset"] == {"name": "toy", "num_vertices": 3001, "num_edges": g.num_edges, "num_features": 300,
                            "num_classes": 5, "num_train": int(g.train_mask.sum()),
                            "num_val": int(g.val_mask.sum()), "num_test": int(g.test_mask.sum()),
                            "content_sha256": dataset_digest(g)}
    assert set(m["partitioner"]) >= {"name", "library", "constraints", "edge_cut", "edge_cut_fraction"}
    assert sorted(m["files"]) == ["server-0000.h5", "server-0001.h5"]
    on_disk = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(m))
    with h5py.File(tmp_path / "set" / "server-0000.h5", "r") as f:
        rows, cols = f["features"].chunks
        assert cols == 300 and 0 < rows * cols * 4 <= (1 << 20) and f["features"].compression is None
        assert dict(f.attrs) == {"format_version": 1, "server": 0, "servers": 2, "gpus_per_server": 2}
    assert sum(s["inner"] for s in m["stats"]["servers"]) == 3001


def test_refuses_existing_directory_without_overwrite(tmp_path):
    g = make_graph()
    build(g, tmp_path / "set")
    with pytest.raises(shards.ShardError, match="--overwrite"):
        build(g, tmp_path / "set")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(shards.ShardError, match="not a shard set"):
        build(g, tmp_path / "other", overwrite=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    m = build(g, tmp_path / "set", overwrite=True, servers=1)  # 2 servers -> 1: stale file removed
    assert sorted(os.listdir(tmp_path / "set")) == ["manifest.json", "server-0000.h5"]
    assert verify_shard_set(tmp_path / "set") == [] and m["servers"] == 1


def _crash_after_first_file(monkeypatch):
    real = shard_writer._write_h5
    calls = {"n": 0}

    def flaky(path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            real(path, *args, **kwargs)
            raise OSError("simulated crash while writing the second server file")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shard_writer, "_write_h5", flaky)


def test_crash_mid_write_keeps_old_set_and_leaves_no_manifest(tmp_path, monkeypatch):
    g = make_graph()
    out = tmp_path / "set"
    build(g, out)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    _crash_after_first_file(monkeypatch)
    with pytest.raises(OSError, match="simulated crash"):
        build(make_graph(seed=99), out, overwrite=True, layers=3)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before  # old set intact, no temporaries
    assert verify_shard_set(out) == []
    # a fresh directory: nothing that verify or a reader accepts
    _crash_after_first_file(monkeypatch)
    with pytest.raises(OSError, match="simulated crash"):
        build(g, tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "manifest.json").exists()
    problems = verify_shard_set(tmp_path / "fresh")
    assert len(problems) == 1 and "no manifest.json" in problems[0]
    with pytest.raises(shards.ShardError, match="not a complete shard set"):
        shards.read_manifest(tmp_path / "fresh")


def test_verify_names_the_corrupted_file(tmp_path):
    g = make_graph()
    out = tmp_path / "set"
    build(g, out)
    path = out / "server-0001.h5"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = verify_shard_set(out)
    assert len(problems) == 1 and "server-0001.h5" in problems[0] and "sha256" in problems[0]
    manifest = shards.read_manifest(out)
    with pytest.raises(shards.ShardError, match="server-0001.h5"):
        shards.verify_checksums(out, manifest)
    shards.verify_checksums(out, manifest, servers=[0])  # the intact file still passes
    os.unlink(path)
    assert "server-0001.h5" in verify_shard_set(out)[0]


def _tamper(out, server, name, fn):
    """Change one dataset and re-sign the manifest, so only the invariant checks can notice."""
    path = out / shards.server_file_name(server)
    with h5py.File(path, "r+") as f:
        data = f[name][()]
        f[name][...] = fn(data)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"][path.name] = {"sha256": shards.sha256_file(str(path)), "bytes": path.stat().st_size}
    (out / "manifest.json").write_text(json.dumps(manifest))


def _swap_last_two(a):
    """The last two entries swapped: the last row (or rows) no longer strictly increasing."""
    a = a.copy()
    a[-2:] = a[-2:][::-1].copy()
    return a


@pytest.mark.parametrize("edge_block", [None, 2])  # verify's default block, and blocks of about a row
@pytest.mark.parametrize("name,fn,expect", [
    ("vertices/hop", lambda h: np.concatenate([h[:-1], h[-1:] + 1]), "BFS"),  # still sorted, wrong hop
    ("vertices/hop", lambda h: np.where(h == 2, 0, h), "not sorted by hop"),  # hop-0 rows after hop-1 rows
    ("world/src_rank", lambda r: (r + 1) % 4, "src_rank"),
    ("world/src_in_degree", lambda d: np.concatenate([d[:-1], d[-1:] + 1]), "src_in_degree"),  # the last block
    ("graph/in_degree", lambda d: d + 1, "in_degree"),
    ("graph/indices", lambda ix: ix[::-1].copy(), "graph"),
    ("graph/indices", _swap_last_two, "graph: indices not strictly increasing"),
    ("graph/indices", lambda ix: np.concatenate([ix[:-1], [10 ** 6]]), "graph: indices out of range"),
    ("world/src_global_id", _swap_last_two, "world: indices not strictly increasing"),
])
def test_verify_checks_invariants_not_only_checksums(tmp_path, monkeypatch, edge_block, name, fn, expect):
    """verify reads the edge-sized datasets in row-aligned blocks (preprocess/verify/command.py EDGE_BLOCK): a
    fault in the last block is found as one in the first, with blocks of a row or two as at the default."""
    import granndis_hpc.preprocess.verify.command as verify
    if edge_block is not None:
        monkeypatch.setattr(verify, "EDGE_BLOCK", edge_block)
    out = tmp_path / "set"
    build(make_graph(), out)
    assert verify_shard_set(out) == []
    _tamper(out, 0, name, fn)
    problems = verify_shard_set(out)
    assert problems and any(expect in p and "server-0000.h5" in p for p in problems), problems


def test_verify_streamed_blocks_accept_valid_eas_and_full_sets(tmp_path, monkeypatch):
    """Blocks of 3 edges (a row split from the next at every block end) and the default agree on valid
    sets: EAS's feeds check and full preloading's BFS and world-view comparison, block by block."""
    import granndis_hpc.preprocess.verify.command as verify
    g = make_graph()
    sets = [(tmp_path / "full", {}), (tmp_path / "eas", {"preload": "eas", "hops": 2, "fanout": 3})]
    for out, kw in sets:
        build(g, out, **kw)
    for block in (3, verify.EDGE_BLOCK):
        monkeypatch.setattr(verify, "EDGE_BLOCK", block)
        for out, _ in sets:
            assert verify_shard_set(out) == [], (block, out)


def test_check_job_and_manifest_errors(tmp_path):
    out = tmp_path / "set"
    m = build(make_graph(), out, layers=3)
    shards.check_job(m, 2, 2, 3)
    shards.check_job(m, 2, 2)
    with pytest.raises(shards.ShardError) as e:
        shards.check_job(m, 4, 1)
    assert "2 servers x 2 GPUs" in str(e.value) and "4 servers x 1 GPUs" in str(e.value)
    assert "--servers 4 --gpus-per-server 1" in str(e.value)
    with pytest.raises(shards.ShardError, match="3-layer model but this job trains 2"):
        shards.check_job(m, 2, 2, 2)
    with pytest.raises(shards.ShardError, match="does not exist"):
        shards.read_manifest(tmp_path / "missing")
    bad = json.loads((out / "manifest.json").read_text())
    bad["format_version"] = 2
    (out / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(shards.ShardError, match="format_version 2"):
        shards.read_manifest(out)
    with pytest.raises(shards.ShardError, match="gpu 5 out of range"):
        shards.read_rank_slice(out, m, 0, 5)


def test_write_shards_serial_api_round_trip(tmp_path):
    # the low-level writer on hand-made arrays (one server, one GPU, two rows)
    arrays = {
        "vertices/global_id": np.array([0, 1]), "vertices/owner": np.zeros(2, np.int32),
        "vertices/hop": np.zeros(2, np.int32), "vertices/offsets": np.array([0, 2]),
        "vertices/inner_counts": np.array([2]), "graph/indptr": np.array([0, 1, 2]),
        "graph/indices": np.array([1, 0]), "graph/in_degree": np.array([1, 1]),
        "features": np.ones((2, 3), np.float32), "labels": np.array([0, 1]),
        "split/train": np.array([True, False]), "split/val": np.array([False, True]),
        "split/test": np.zeros(2, bool), "world/offsets": np.array([0, 2]), "world/indptr": np.array([0, 1, 2]),
        "world/src_global_id": np.array([1, 0]), "world/src_rank": np.zeros(2, np.int32),
        "world/src_in_degree": np.array([1, 1]),
    }
    manifest = {"format_version": 1, "servers": 1, "gpus_per_server": 1, "layers": 1,
                "dataset": {"name": "pair", "num_vertices": 2, "num_edges": 2, "num_features": 3, "num_classes": 2,
                            "num_train": 1, "num_val": 1, "num_test": 0},
                "preload": {"kind": "full", "hops": 1, "fanout": None, "select": None}}
    m = shards.write_shards(tmp_path / "pair", manifest, {0: arrays})
    assert verify_shard_set(tmp_path / "pair") == []
    sl = shards.read_rank_slice(tmp_path / "pair", m, 0, 0)
    assert sl.global_id.tolist() == [0, 1] and sl.indices.tolist() == [1, 0] and sl.n_inner == 2
    bad = dict(arrays, **{"labels": np.array([0, 1, 2])})
    with pytest.raises(shards.ShardError, match="labels has shape"):
        shards.write_shards(tmp_path / "bad", manifest, {0: bad})
    assert not [p for p in os.listdir(tmp_path / "bad") if p != ".keep"]
    shutil.rmtree(tmp_path / "pair")
