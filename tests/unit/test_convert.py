"""save_bundle: a graph in memory (NumPy/SciPy arrays, torch tensors, a PyG Data or DGL graph; the two
libraries' objects by small stand-ins with their attributes where the libraries are absent) written as a
bundle and read back by the bundle loader, against the independent reference of the OGB miniature; bad
input refused before anything is written."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources.convert import from_dgl, save_bundle
from granndis_hpc.preprocess.sources import load
from tests.unit.test_sources_bundle import graphs_equal
from tests.unit.test_sources_ogb import check_against_reference, make_raw


def labels_of(raw):
    return np.where(np.isnan(raw["labels"]), -1, np.nan_to_num(raw["labels"])).astype(np.int64)


def masks_of(raw):
    out = {}
    for part, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        m = np.zeros(raw["n"], bool)
        m[raw[part]] = True
        out[key] = m
    return out


class PygData:
    """What save_bundle reads of torch_geometric.data.Data: x, edge_index, y, the masks, num_nodes."""

    def __init__(self, raw):
        self.x = torch.from_numpy(raw["feats"])
        self.edge_index = torch.from_numpy(np.stack([raw["src"], raw["dst"]]))
        self.y = torch.from_numpy(labels_of(raw))
        for key, m in masks_of(raw).items():
            setattr(self, key, torch.from_numpy(m))
        self.num_nodes = raw["n"]


class DglGraph:
    """What save_bundle reads of a dgl.DGLGraph: edges(), ndata, ntypes, num_nodes()."""

    def __init__(self, raw, ntypes=("_N",), feature_key="feat"):
        self._edges = (torch.from_numpy(raw["src"]), torch.from_numpy(raw["dst"]))
        self.ndata = {feature_key: torch.from_numpy(raw["feats"]), "label": torch.from_numpy(labels_of(raw)),
                      **{k: torch.from_numpy(m) for k, m in masks_of(raw).items()}}
        self.ntypes, self._n = list(ntypes), raw["n"]

    def edges(self):
        return self._edges

    def num_nodes(self):
        return self._n


@pytest.mark.parametrize("ext", [".npz", ".h5"])
def test_arrays_round_trip(tmp_path, ext):
    raw = make_raw(seed=20)
    path = save_bundle(tmp_path / f"g{ext}", edge_index=np.stack([raw["src"], raw["dst"]]), features=raw["feats"],
                       labels=labels_of(raw), num_classes=raw["c"], **masks_of(raw))
    assert path == str(tmp_path / f"g{ext}")
    check_against_reference(load("bundle", path=path), raw)


def test_scipy_adjacency_and_id_splits(tmp_path):
    """Entry (i, j) of the adjacency is the edge i -> j; splits as id arrays."""
    raw = make_raw(seed=21)
    adj = sp.csr_matrix((np.ones(raw["src"].size), (raw["src"], raw["dst"])), shape=(raw["n"], raw["n"]))
    path = save_bundle(tmp_path / "a.npz", adjacency=adj, features=raw["feats"], labels=labels_of(raw),
                       train_idx=raw["train"], val_idx=raw["valid"], test_idx=raw["test"], num_classes=raw["c"])
    check_against_reference(load("bundle", path=path), raw)
    directed = load("bundle", path=path, symmetrize=False, self_loops="keep")
    rows = np.repeat(np.arange(raw["n"]), np.diff(directed.indptr))
    assert set(zip(directed.indices.tolist(), rows.tolist())) == set(zip(raw["src"].tolist(), raw["dst"].tolist()))


def test_pyg_and_dgl_objects_round_trip(tmp_path):
    raw = make_raw(seed=22)
    pyg = load("bundle", path=save_bundle(tmp_path / "pyg.npz", PygData(raw), num_classes=raw["c"]))
    check_against_reference(pyg, raw)
    dgl = load("bundle", path=save_bundle(tmp_path / "dgl.npz", DglGraph(raw), num_classes=raw["c"]))
    graphs_equal(dgl, pyg)
    # other ndata names, and keywords replacing what the object holds
    g = DglGraph(raw, feature_key="features")
    path = save_bundle(tmp_path / "k.npz", **from_dgl(g, feature_key="features"), num_classes=raw["c"])
    graphs_equal(load("bundle", path=path), pyg)
    swapped = save_bundle(tmp_path / "s.npz", PygData(raw), train_idx=raw["valid"], val_idx=raw["train"],
                          test_idx=raw["test"], num_classes=raw["c"])
    got = load("bundle", path=swapped)
    assert np.array_equal(got.train_mask, pyg.val_mask) and np.array_equal(got.val_mask, pyg.train_mask)


def test_real_pyg_data_where_installed(tmp_path):
    data_mod = pytest.importorskip("torch_geometric.data")
    raw = make_raw(seed=23)
    d = PygData(raw)
    data = data_mod.Data(x=d.x, edge_index=d.edge_index, y=d.y, train_mask=d.train_mask, val_mask=d.val_mask,
                         test_mask=d.test_mask)
    check_against_reference(load("bundle", path=save_bundle(tmp_path / "p.npz", data, num_classes=raw["c"])), raw)


def _bad(raw, **change):
    args = dict(edge_index=np.stack([raw["src"], raw["dst"]]), features=raw["feats"], labels=labels_of(raw),
                **masks_of(raw))
    args.update(change)
    return {k: v for k, v in args.items() if v is not None}


@pytest.mark.parametrize("change, message", [
    (lambda raw: _bad(raw, edge_index=np.array([[0, 1], [2, raw["n"]]])), r"save_bundle: edge destination ids span"),
    (lambda raw: _bad(raw, edge_index=np.zeros((3, 4), np.int64)), r"edge_index must have shape \[2, E\]"),
    (lambda raw: _bad(raw, labels=None), "no labels"),
    (lambda raw: _bad(raw, test_mask=None), r"no complete train/val/test split \(given: train_mask, val_mask\)"),
    (lambda raw: _bad(raw, train_mask=np.ones(raw["n"], bool)), "more than one of train/val/test"),
    (lambda raw: _bad(raw, adjacency=np.eye(raw["n"])), "exactly one of edge_index"),
    (lambda raw: _bad(raw, edge_index=None, adjacency=sp.eye(raw["n"] + 1, format="csr")), "adjacency is 158 x 158"),
    (lambda raw: {"graph": DglGraph(raw, ntypes=("paper", "author"))}, "2 node types"),
    (lambda raw: {"graph": DglGraph(raw, feature_key="x")}, r"no ndata\['feat'\]"),
    (lambda raw: {"graph": object()}, "neither a PyG Data nor a DGL graph"),
])
def test_bad_input_writes_nothing(tmp_path, change, message):
    raw = make_raw(seed=24)
    path = tmp_path / "g.npz"
    path.write_bytes(b"previous")
    with pytest.raises(DataError, match=message):
        save_bundle(path, **change(raw))
    assert path.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["g.npz"]
    with pytest.raises(DataError, match=r"a bundle is \.npz or \.h5"):
        save_bundle(tmp_path / "g.csv", **_bad(raw))
