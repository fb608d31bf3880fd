"""The chunked input format: `preprocess chunk` from every source, `--source chunked`, and the
strict validation of chunk files (a clear error naming the file, exit non-zero, nothing written)."""
import json
import os

import numpy as np
import pytest

from granndis_hpc.preprocess.__main__ import main
from granndis_hpc.preprocess.build.pipeline import dataset_digest
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.formats.chunked import open_chunked
from granndis_hpc.preprocess.sources import load
from tests.unit.test_sources_bundle import graphs_equal

SYNTH = ["--source", "synthetic", "--generator", "sbm", "--vertices", "1500", "--avg-degree", "6",
         "--features", "5", "--classes", "3", "--seed", "4"]


@pytest.fixture(scope="module")
def cora_dir(tmp_path_factory):
    from tests.conftest import require_planetoid

    out = tmp_path_factory.mktemp("chunks") / "cora"
    assert main(["chunk", "--source", "planetoid", "--name", "cora", "--root", str(require_planetoid()),
                 "--out", str(out), "--chunks", "4"]) == 0
    return out


def test_cora_round_trip_is_the_same_dataset(cora_dir, planetoid_root):
    meta = json.loads((cora_dir / "metadata.json").read_text())
    assert meta["format"] == "granndis-chunked-v1" and len(meta["edges"]["chunks"]) == 4
    assert meta["nodes"]["rows"] == [677, 677, 677, 677] and meta["num_edges"] == 10556
    arr = np.load(cora_dir / "edges-00000.npy", mmap_mode="r")
    assert isinstance(arr, np.memmap) and arr.dtype == np.int64 and arr.shape == (2, 2639)
    ref = load("planetoid", name="cora", root=str(planetoid_root))
    got = load("chunked", path=str(cora_dir))
    graphs_equal(got, ref)
    assert got.name == "cora" and dataset_digest(got) == dataset_digest(ref)


def test_synthetic_streams_into_chunks(tmp_path):
    out = tmp_path / "syn"
    assert main(["chunk", *SYNTH, "--out", str(out), "--chunks", "3"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["canonical"] is None  # raw draws: the build canonicalises them
    ref = load("synthetic", generator="sbm", vertices=1500, avg_degree=6, features=5, classes=3, seed=4)
    graphs_equal(load("chunked", path=str(out), name="synthetic"), ref)


def test_bundle_and_chunked_sources_convert(tmp_path, cora_dir, planetoid_root):
    """Every source converts: a bundle (.npz) and a chunked directory itself (re-chunked)."""
    ref = load("planetoid", name="cora", root=str(planetoid_root))
    rows = np.repeat(np.arange(ref.num_vertices), np.diff(ref.indptr))
    bundle = tmp_path / "cora.npz"
    np.savez(bundle, edge_index=np.stack([ref.indices, rows]), features=ref.features, labels=ref.labels,
             train_mask=ref.train_mask, val_mask=ref.val_mask, test_mask=ref.test_mask)
    assert main(["chunk", "--source", "bundle", "--path", str(bundle), "--out", str(tmp_path / "b"),
                 "--chunks", "2"]) == 0
    graphs_equal(load("chunked", path=str(tmp_path / "b")), ref)
    assert main(["chunk", "--source", "chunked", "--path", str(cora_dir), "--out", str(tmp_path / "r"),
                 "--chunks", "5"]) == 0
    assert len(json.loads((tmp_path / "r" / "metadata.json").read_text())["edges"]["chunks"]) == 5
    graphs_equal(load("chunked", path=str(tmp_path / "r")), ref)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _edit_meta(d, fn):
    meta = json.loads((d / "metadata.json").read_text())
    fn(meta)
    (d / "metadata.json").write_text(json.dumps(meta))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 40)


@pytest.mark.parametrize("damage,pattern", [
    (lambda d: os.remove(d / "features-00002.npy"), r"features-00002\.npy: chunk file not found"),
    (lambda d: _truncate(d / "edges-00001.npy"), r"edges-00001\.npy: cannot read .*truncated"),
    (lambda d: np.save(d / "labels-00001.npy", np.zeros(677, np.float64)),
     r"labels-00001\.npy: dtype float64 but metadata.json declares int64"),
    (lambda d: np.save(d / "train_mask-00003.npy", np.zeros(600, bool)),
     r"train_mask-00003\.npy: shape \(600,\) but metadata.json declares \(677,\)"),
    (lambda d: np.save(d / "edges-00002.npy", np.array([[0, 1], [2, 99999]], np.int64)),
     r"edges-00002\.npy: shape \(2, 2\) but metadata.json declares \(2, 2639\)"),
    (lambda d: _edit_meta(d, lambda m: m.update(num_edges=m["num_edges"] + 1)),
     r"metadata\.json: the edge chunks hold 10556 edges but num_edges is 10557"),
    (lambda d: _edit_meta(d, lambda m: m["nodes"]["rows"].__setitem__(0, 676)),
     r"metadata\.json: the node chunks hold 2707 rows but num_vertices is 2708"),
    (lambda d: os.remove(d / "metadata.json"), r"metadata\.json: file not found"),
])
def test_bad_chunks_are_refused_naming_the_file(tmp_path, cora_dir, damage, pattern):
    d = _copy(cora_dir, tmp_path / "bad")
    damage(d)
    with pytest.raises(DataError, match=pattern):
        load("chunked", path=str(d))


def test_ids_out_of_range_and_bad_values_name_the_chunk(tmp_path, cora_dir):
    d = _copy(cora_dir, tmp_path / "ids")
    e = np.load(d / "edges-00003.npy")
    e[1, 5] = 2708
    np.save(d / "edges-00003.npy", e)
    with pytest.raises(DataError, match=r"edges-00003\.npy: edge destination ids span \[\d+, 2708\] but there are "
                                        r"2708 vertices"):
        load("chunked", path=str(d))
    d = _copy(cora_dir, tmp_path / "nan")
    x = np.load(d / "features-00001.npy")
    x[3, 0] = np.nan
    np.save(d / "features-00001.npy", x)
    with pytest.raises(DataError, match=r"features-00001\.npy: features of 1 vertices contain NaN .*vertex 680"):
        load("chunked", path=str(d))


def test_chunk_refuses_a_non_empty_output_and_leaves_nothing(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("keep")
    assert main(["chunk", *SYNTH, "--out", str(out)]) == 1
    assert os.listdir(out) == ["x"]
    # A failure while writing (vertices not covered) leaves neither the output nor a staging directory.
    from granndis_hpc.preprocess.formats.chunked import write_chunked

    with pytest.raises(DataError, match="node chunks hold 2 rows, expected 3"):
        write_chunked(tmp_path / "new", name="t", num_vertices=3, num_features=1, num_classes=1,
                      edge_pieces=iter([(np.array([0]), np.array([1]))]),
                      node_pieces=iter([{"features": np.zeros((2, 1)), "labels": np.zeros(2), "train_mask": np.ones(2),
                                         "val_mask": np.zeros(2), "test_mask": np.zeros(2)}]))
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def test_open_chunked_reads_headers_only(cora_dir):
    ds = open_chunked(cora_dir)
    assert ds.num_vertices == 2708 and ds.num_classes == 7 and ds.edge_offsets.tolist() == [0, 2639, 5278, 7917, 10556]
    # a slice across two node chunks
    rows = np.concatenate([a for _, a in ds.node_range("labels", 670, 690)])
    assert np.array_equal(rows, load("chunked", path=str(cora_dir)).labels[670:690])


@pytest.mark.parametrize("edge_format", ["csv", "numpy"])
def test_distdgl_homogeneous_chunked_format(tmp_path, planetoid_root, edge_format):
    """A directory in DistDGL's chunked graph format (text or .npy edge files, 0/1 integer masks) builds as it is."""
    ref = load("planetoid", name="cora", root=str(planetoid_root))
    rows = np.repeat(np.arange(ref.num_vertices), np.diff(ref.indptr))
    d = tmp_path / "dgl"
    (d / "edges").mkdir(parents=True)
    (d / "node_data").mkdir()
    edges = np.stack([ref.indices, rows], axis=1)
    files = []
    for i, part in enumerate(np.array_split(edges, 3)):
        if edge_format == "csv":
            files.append(f"edges/cites{i}.txt")
            np.savetxt(d / files[-1], part, fmt="%d", delimiter=" ")
        else:
            files.append(f"edges/cites{i}.npy")
            np.save(d / files[-1], part)
    node_data = {}
    for key, arr in (("feat", ref.features), ("label", ref.labels), ("train_mask", ref.train_mask.astype(np.uint8)),
                     ("val_mask", ref.val_mask.astype(np.uint8)), ("test_mask", ref.test_mask.astype(np.uint8))):
        names = []
        for j, part in enumerate(np.array_split(arr, 2)):
            names.append(f"node_data/paper-{key}-{j}.npy")
            np.save(d / names[-1], part)
        node_data[key] = {"format": {"name": "numpy"}, "data": names}
    meta = {"graph_name": "cora", "node_type": ["paper"], "num_nodes_per_type": [ref.num_vertices],
            "edge_type": ["paper:cites:paper"], "num_edges_per_type": [int(edges.shape[0])],
            "edges": {"paper:cites:paper": {"format": {"name": edge_format, "delimiter": " "}, "data": files}},
            "node_data": {"paper": node_data}}
    (d / "metadata.json").write_text(json.dumps(meta))
    got = load("chunked", path=str(d))
    graphs_equal(got, ref)
    assert got.name == "cora"
    os.remove(d / "node_data/paper-label-1.npy")
    with pytest.raises(DataError, match=r"paper-label-1\.npy: chunk file not found"):
        load("chunked", path=str(d))
