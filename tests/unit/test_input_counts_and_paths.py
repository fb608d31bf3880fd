"""Chunked and DistDGL inputs: every declared count is checked against what is read, only files under
the dataset directory are read, pickles are never loaded, and errors name the file without echoing its
content (docs/reliability.md, third round)."""
import json
import os

import numpy as np
import pytest

from preprocess.canonical import DataError
from preprocess.sources import load
from tests.conftest import run_mpi

N, E = 40, 120


def _distdgl(d, edge_format="csv", files=3):
    """A small homogeneous DistDGL chunked directory (random graph); returns (metadata dict, edges)."""
    rng = np.random.default_rng(3)
    edges = rng.integers(0, N, size=(E, 2))
    (d / "edges").mkdir(parents=True)
    (d / "node_data").mkdir()
    names = []
    for i, part in enumerate(np.array_split(edges, files)):
        if edge_format == "csv":
            names.append(f"edges/e{i}.txt")
            np.savetxt(d / names[-1], part, fmt="%d")
        else:
            names.append(f"edges/e{i}.npy")
            np.save(d / names[-1], part)
    split = rng.permutation(N)
    masks = {k: np.isin(np.arange(N), split[a:b]).astype(np.uint8)
             for k, a, b in (("train_mask", 0, 20), ("val_mask", 20, 30), ("test_mask", 30, 40))}
    node_data = {}
    for key, arr in (("feat", rng.standard_normal((N, 4)).astype(np.float32)),
                     ("label", rng.integers(0, 3, N)), *masks.items()):
        node_data[key] = {"format": {"name": "numpy"}, "data": [f"node_data/{key}.npy"]}
        np.save(d / node_data[key]["data"][0], arr)
    meta = {"graph_name": "g", "node_type": ["n"], "num_nodes_per_type": [N], "edge_type": ["n:e:n"],
            "num_edges_per_type": [E],
            "edges": {"n:e:n": {"format": {"name": edge_format, "delimiter": " "}, "data": names}},
            "node_data": {"n": node_data}}
    _write_meta(d, meta)
    return meta


def _write_meta(d, meta):
    (d / "metadata.json").write_text(json.dumps(meta))


def test_a_cut_distdgl_edge_file_is_refused_with_declared_and_found_counts(tmp_path):
    d = tmp_path / "dgl"
    _distdgl(d)
    assert load("chunked", path=str(d)).num_vertices == N  # the intact directory builds
    lines = (d / "edges/e1.txt").read_text().splitlines()
    (d / "edges/e1.txt").write_text("\n".join(lines[:10]) + "\n")  # 30 of its 40 lines lost
    with pytest.raises(DataError, match=r"metadata\.json: num_edges_per_type declares 120 edges but the edge "
                                        r"files hold 90 \(e0\.txt 40, e1\.txt 10, e2\.txt 40\)"):
        load("chunked", path=str(d))
    # An empty edge file: zero edges, the same refusal naming it (was IndexError, no file named).
    (d / "edges/e1.txt").write_text("")
    with pytest.raises(DataError, match=r"hold 80 \(e0\.txt 40, e1\.txt 0, e2\.txt 40\)"):
        load("chunked", path=str(d))


def test_a_wrong_distdgl_edge_count_is_refused_for_npy_edges_at_open(tmp_path):
    d = tmp_path / "dgl"
    meta = _distdgl(d, "numpy")
    meta["num_edges_per_type"] = [E + 5]
    _write_meta(d, meta)
    with pytest.raises(DataError, match=r"declares 125 edges but the edge chunks hold 120"):
        load("chunked", path=str(d))


def test_a_cut_edge_file_fails_a_two_rank_build_once_and_writes_nothing(tmp_path):
    d = tmp_path / "dgl"
    _distdgl(d)
    (d / "edges/e2.txt").write_text("0 1\n")
    out = tmp_path / "shards"
    r = run_mpi(["-m", "preprocess", "build", "--source", "chunked", "--path", d, "--servers", "2",
                 "--gpus-per-server", "1", "--layers", "1", "--partitioner", "metis", "--out", out], n=2, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "declares 120 edges but the edge files hold 81" in r.stderr, r.stderr
    assert "error (rank 1)" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


def test_distdgl_labels_of_two_columns_are_refused_naming_the_file(tmp_path):
    d = tmp_path / "dgl"
    _distdgl(d)
    np.save(d / "node_data/label.npy", np.zeros((N, 2), dtype=np.int64))
    with pytest.raises(DataError, match=r"node_data/label\.npy: label chunk has shape \(40, 2\), expected \[rows\]"):
        load("chunked", path=str(d))


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_files_outside_the_directory_are_never_read(tmp_path, how):
    secret = tmp_path / "secret.npy"
    np.save(secret, np.arange(N, dtype=np.int64))
    d = tmp_path / "dgl"
    meta = _distdgl(d)
    if how == "absolute":
        meta["node_data"]["n"]["label"]["data"] = [str(secret)]
    elif how == "dotdot":
        meta["node_data"]["n"]["label"]["data"] = ["../secret.npy"]
    else:
        os.remove(d / "node_data/label.npy")
        os.symlink(secret, d / "node_data/label.npy")
    _write_meta(d, meta)
    with pytest.raises(DataError, match=r"lies outside the dataset directory .* only files under the directory "
                                        r"are read"):
        load("chunked", path=str(d))


def test_chunked_format_refuses_outside_paths_and_pickles(tmp_path):
    from preprocess.__main__ import main

    d = tmp_path / "c"
    assert main(["chunk", "--source", "synthetic", "--generator", "sbm", "--vertices", "60", "--avg-degree", "4",
                 "--features", "3", "--classes", "2", "--seed", "1", "--out", str(d), "--chunks", "2"]) == 0
    meta = json.loads((d / "metadata.json").read_text())
    meta["edges"]["chunks"][0]["file"] = "/etc/passwd"
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"file /etc/passwd lies outside the dataset directory"):
        load("chunked", path=str(d))
    meta["edges"]["chunks"][0]["file"] = "edges-00000.npy"
    (d / "metadata.json").write_text(json.dumps(meta))
    # A file that is not a .npy (here text) and one holding Python objects: never offered to the
    # pickle loader, so numpy's "load it unsafely" advice cannot reach the user.
    (d / "labels-00001.npy").write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(DataError, match=r"labels-00001\.npy: not a \.npy file") as err:
        load("chunked", path=str(d))
    assert "allow_pickle" not in str(err.value) and "root:x" not in str(err.value)
    np.save(d / "labels-00001.npy", np.array([{"a": 1}] * 30, dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"holds Python objects, which are never loaded") as err:
        load("chunked", path=str(d))
    assert "allow_pickle" not in str(err.value)


def test_an_unparsable_edge_file_is_quoted_short(tmp_path):
    d = tmp_path / "dgl"
    _distdgl(d)
    (d / "edges/e0.txt").write_text("root:x:0:0:root:/root:/bin/bash:with-a-long-secret-tail\n")
    with pytest.raises(DataError, match=r"e0\.txt: cannot parse the edge file") as err:
        load("chunked", path=str(d))
    assert "secret-tail" not in str(err.value) and len(str(err.value)) < 400, str(err.value)
