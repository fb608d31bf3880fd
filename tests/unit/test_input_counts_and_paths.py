"""Chunked and DistDGL inputs: every declared count is checked against what is read, only files under
the dataset directory are read, pickles are never loaded, and errors name the file without echoing its
content (docs/reliability.md)."""
import json
import os

import numpy as np
import pytest

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import load

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
    from granndis_hpc.preprocess.__main__ import main

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


def test_spill_files_live_under_the_output_and_a_killed_builds_are_removed_and_named(tmp_path, capsys):
    """A build rank killed during partitioning left its granndis-spill-* directory in $TMPDIR for ever."""
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.preprocess.__main__ import main
    from granndis_hpc.preprocess.formats.chunked import open_source
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.build.slices import spill_directory, spilled
    from granndis_hpc.preprocess.verify.command import verify_shard_set

    d = tmp_path / "dgl"
    _distdgl(d)
    out = tmp_path / "set"
    out.mkdir()
    part = load_slice(self_group(), open_source(str(d)))
    with spill_directory(out), spilled(self_group(), part, ("features", "indices")):
        inside = [n for n in os.listdir(out) if n.startswith(".granndis-spill-")]
        assert len(inside) == 1 and sorted(os.listdir(out / inside[0])) == ["features.npy", "indices.npy"]
        assert part.features is None
    assert os.listdir(out) == [] and part.features.shape == (N, 4)
    # What a killed rank leaves: listed by verify, removed and named by the next build into the set.
    build = ["build", "--source", "chunked", "--path", str(d), "--servers", "1", "--gpus-per-server", "1",
             "--layers", "1", "--partitioner", "random", "--out", str(out), "--overwrite"]
    assert main(build) == 0
    (out / ".granndis-spill-k1ll3d").mkdir()
    (out / ".granndis-spill-k1ll3d" / "features.npy").write_bytes(b"\0" * 3000)
    assert any("1 temporary file(s) of an interrupted build (.granndis-spill-k1ll3d; 0.0 MiB)" in p
               for p in verify_shard_set(out)), verify_shard_set(out)
    capsys.readouterr()
    assert main(build) == 0
    assert "removed 1 temporary file(s) and spill director(ies) of an interrupted build" in capsys.readouterr().err
    assert not (out / ".granndis-spill-k1ll3d").exists() and verify_shard_set(out) == []


def test_a_full_spill_directory_says_no_space_left_in_it(tmp_path, monkeypatch):
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.preprocess.build import sliced
    from granndis_hpc.preprocess.build import slices
    from granndis_hpc.preprocess.formats.chunked import open_source

    d = tmp_path / "dgl"
    _distdgl(d)
    part = sliced.load_slice(self_group(), open_source(str(d)))

    def short_write(*a, **k):  # what numpy raises when the file system is full mid-array
        raise OSError("1200000 requested and 262112 written")
    monkeypatch.setattr(slices.np, "save", short_write)
    with pytest.raises(OSError, match=rf"no space left in {tmp_path} \(No space left on device\) for this rank"):
        with slices.spill_directory(tmp_path), slices.spilled(self_group(), part, ("features",)):
            pass
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".granndis-spill-")]
