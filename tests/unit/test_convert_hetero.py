"""A PyG HeteroData through the converter: save_bundle writes the heterogeneous layout, the bundle source
loads it back to the graph canonicalize_hetero makes of the same arrays, and graph_arrays / the API's
canonical graph agree with it."""
import numpy as np
import pytest
import torch

from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.convert import from_pyg, graph_arrays, save_bundle
from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero
from tests.unit.test_sources_bundle import graphs_equal

pyg_data = pytest.importorskip("torch_geometric.data")


def hetero_data(seed=0, paper_width=5):
    rng = np.random.default_rng(seed)
    data = pyg_data.HeteroData()
    data["author"].x = torch.tensor(rng.random((6, 5)), dtype=torch.float32)
    data["author"].y = torch.tensor(rng.integers(0, 3, 6))
    for split, ids in (("train", [0, 1, 2]), ("val", [3]), ("test", [4, 5])):
        mask = torch.zeros(6, dtype=torch.bool)
        mask[ids] = True
        data["author"][f"{split}_mask"] = mask
    data["paper"].x = torch.tensor(rng.random((8, paper_width)), dtype=torch.float32)
    data["term"].num_nodes = 4
    data["author", "writes", "paper"].edge_index = torch.tensor(np.stack([rng.integers(0, 6, 12),
                                                                          rng.integers(0, 8, 12)]))
    data["paper", "cites", "paper"].edge_index = torch.tensor(np.stack([rng.integers(0, 8, 10),
                                                                        rng.integers(0, 8, 10)]))
    data["paper", "has", "term"].edge_index = torch.tensor(np.stack([np.arange(8), np.arange(8) % 4]))
    return data


@pytest.mark.parametrize("paper_width", [5, 9])  # 9: types of different widths, each kept
def test_round_trip_through_the_heterogeneous_bundle(tmp_path, paper_width):
    data = hetero_data(paper_width=paper_width)
    arrays = from_pyg(data)
    assert list(arrays)[:3] == ["x_author", "x_paper", "num_nodes_term"]
    assert "edge_index_author__writes__paper" in arrays and arrays["train_author"].tolist() == [0, 1, 2]
    for ext in ("npz", "h5"):
        path = save_bundle(tmp_path / f"g.{ext}", data)
        g = load("bundle", path=str(path))
        expected = canonicalize_hetero(
            "g", {"author": 6, "paper": 8, "term": 4},
            {"author": data["author"].x.numpy(), "paper": data["paper"].x.numpy()},
            {key: (data[key].edge_index[0].numpy(), data[key].edge_index[1].numpy()) for key in data.edge_types},
            data["author"].y.numpy(), {s: data["author"][f"{s}_mask"].numpy() for s in ("train", "val", "test")},
            "author")
        if ext == "npz":  # HDF5 lists its arrays by name: the same types, possibly in another order
            graphs_equal(g, expected)
        assert set(g.types.names) == {"author", "paper", "term"} and g.types.target == "author"
        assert dict(zip(g.types.names, g.types.feature_origin))["term"] == "mean:has"
        widths = dict(zip(g.types.names, g.types.width_of(g.num_features)))
        assert widths == {"author": 5, "paper": paper_width, "term": paper_width}
        assert g.types.typed_widths == (paper_width != 5)
    a = graph_arrays(data)
    assert a["target"] == "author" and a["counts"] == {"author": 6, "paper": 8, "term": 4}


def test_the_api_builds_a_heterodata_in_memory():
    from granndis_hpc.api.graphs import canonical, is_graph

    data = hetero_data(1)
    assert is_graph(data)
    g = canonical(data, "mem")
    assert g.types is not None and g.types.names == ("author", "paper", "term") and g.num_vertices == 18


def test_target_type_and_bad_heterodata_refused(tmp_path):
    data = hetero_data()
    data["paper"].y = torch.zeros(8, dtype=torch.long)
    with pytest.raises(DataError, match="target_type="):
        save_bundle(tmp_path / "g.npz", data)
    with pytest.raises(DataError, match="no train_mask"):
        save_bundle(tmp_path / "g.npz", data, target_type="paper")
    ids = dict(train_idx=[0, 1], val_idx=[2], test_idx=[3])
    path = save_bundle(tmp_path / "g.npz", data, target_type="paper", **ids)
    assert load("bundle", path=str(path), target_type="paper").types.target == "paper"
    data = hetero_data()
    data["author", "writes", "paper"].edge_index = torch.tensor([[0], [99]])
    with pytest.raises(DataError, match="valid ids 0..7"):
        save_bundle(tmp_path / "bad.npz", data)
    assert not (tmp_path / "bad.npz").exists()
