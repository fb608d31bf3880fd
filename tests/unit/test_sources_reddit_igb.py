"""Reddit and IGB sources: miniatures written here in exactly the downloaded layouts (DGL/PyG's Reddit .npz
pair, IGB's processed/ tree of .npy files and its headerless large/full variant) against an independent
reference, `preprocess chunk` from each, and damaged inputs (an error naming the file)."""
import numpy as np
import pytest
import scipy.sparse as sp

from granndis_hpc.preprocess.__main__ import main
from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.canonical import DataError
from tests.unit.test_sources_bundle import graphs_equal
from tests.unit.test_sources_ogb import check_against_reference, make_raw


# ---------------------------------------------------------------------------------------------
# Reddit


def reddit_raw(**kw):
    """make_raw's graph as reddit.zip has it: every vertex labelled and in one split (node types 1-3), the
    vertices make_raw leaves out of the splits in the test split."""
    raw = make_raw(**kw)
    rest = np.setdiff1d(np.arange(raw["n"]), np.concatenate([raw["train"], raw["valid"], raw["test"]]))
    raw["labels"][rest] = 0
    raw["test"] = np.concatenate([raw["test"], rest])
    return raw


def write_reddit(base, raw, fmt="coo"):
    """reddit_data.npz + reddit_graph.npz as in reddit.zip (node types 1 train, 2 validation, 3 test)."""
    base.mkdir(parents=True, exist_ok=True)
    n = raw["n"]
    node_types = np.zeros(n, np.int64)
    for code, part in ((1, "train"), (2, "valid"), (3, "test")):
        node_types[raw[part]] = code
    labels = np.where(np.isnan(raw["labels"]), -1, np.nan_to_num(raw["labels"])).astype(np.int64)
    np.savez(base / "reddit_data.npz", feature=raw["feats"], label=labels, node_types=node_types)
    adj = sp.coo_matrix((np.ones(raw["src"].size, np.float32), (raw["src"], raw["dst"])), shape=(n, n))
    sp.save_npz(base / "reddit_graph.npz", adj.asformat(fmt))
    return base


@pytest.mark.parametrize("fmt, sub", [("coo", ""), ("csr", "raw"), ("csc", "reddit")])
def test_reddit_miniature_matches_reference(tmp_path, fmt, sub):
    """Entry (i, j) of the adjacency is the edge i -> j; --root is the files' directory, PyG's root (raw/)
    or DGL's download directory (reddit/)."""
    raw = reddit_raw(seed=5)
    write_reddit(tmp_path / sub if sub else tmp_path, raw, fmt)
    g = load("reddit", root=tmp_path)
    check_against_reference(g, raw)
    assert g.name == "reddit"
    directed = load("reddit", root=tmp_path, symmetrize=False, self_loops="keep")
    rows = np.repeat(np.arange(raw["n"]), np.diff(directed.indptr))
    want = {(int(s), int(d)) for s, d in zip(raw["src"], raw["dst"])}
    assert set(zip(directed.indices.tolist(), rows.tolist())) == want  # (source, destination)


def _rewrite_graph(base, **arrays):
    np.savez(base / "reddit_graph.npz", **arrays)


@pytest.mark.parametrize("damage, file, message", [
    (lambda b, n: (b / "reddit_graph.npz").unlink(), "reddit_graph.npz", "file not found"),
    (lambda b, n: (b / "reddit_data.npz").unlink(), "reddit_data.npz", "file not found"),
    (lambda b, n: _rewrite_graph(b, format=b"coo", shape=np.array([n + 1, n + 1]), row=np.array([0]),
                                 col=np.array([1]), data=np.ones(1)), "reddit_graph.npz", "adjacency is"),
    (lambda b, n: _rewrite_graph(b, format=b"coo", shape=np.array([n, n]), row=np.array([0, n]),
                                 col=np.array([1, 2]), data=np.ones(2)), "reddit_graph.npz", r"ids span \[0, "),
    (lambda b, n: _rewrite_graph(b, format=b"dia", shape=np.array([n, n]), offsets=np.array([0]),
                                 data=np.ones((1, n))), "reddit_graph.npz", "'dia' is not supported"),
    (lambda b, n: np.savez(b / "reddit_data.npz", feature=np.zeros((n, 3), np.float32), label=np.zeros(n, np.int64),
                           node_types=np.ones(n - 1, np.int64)), "reddit_data.npz", "'node_types' must be"),
    (lambda b, n: np.savez(b / "reddit_data.npz", feature=np.zeros((n, 3), np.float32), label=np.zeros(n, np.int64)),
     "reddit_data.npz", r"missing keys \['node_types'\]"),
])
def test_reddit_bad_input_names_the_file(tmp_path, damage, file, message):
    raw = reddit_raw(seed=6, n=40, e=100)
    base = write_reddit(tmp_path, raw)
    damage(base, raw["n"])
    with pytest.raises(DataError, match=message) as err:
        load("reddit", root=tmp_path)
    assert file in str(err.value), str(err.value)


def test_reddit_node_types_outside_the_split_codes_are_refused(tmp_path):
    """A node type outside 1-3 left its vertex in no split, without a word."""
    raw = reddit_raw(seed=7, n=40, e=100)
    base = write_reddit(tmp_path, raw)
    with np.load(base / "reddit_data.npz") as data:
        arrays = dict(data)
    arrays["node_types"][[3, 17, 30]] = [0, 4, -1]
    np.savez(base / "reddit_data.npz", **arrays)
    with pytest.raises(DataError) as err:
        load("reddit", root=tmp_path)
    expected = (f"{base / 'reddit_data.npz'}: 3 of 40 'node_types' values are not 1 (train), 2 "
                "(validation) or 3 (test), e.g. vertex 3: 0, vertex 17: 4, vertex 30: -1")
    assert str(err.value).startswith(expected), err.value


def test_reddit_missing_root(tmp_path):
    with pytest.raises(DataError, match=r"reddit_data\.npz: file not found.*unzipped reddit\.zip"):
        load("reddit", root=tmp_path / "nowhere")
    with pytest.raises(DataError, match="no --root"):
        load("reddit")


# ---------------------------------------------------------------------------------------------
# IGB


def igb_raw(seed=7, n=157, f=6, headerless=False):
    """make_raw's graph with every vertex labelled and IGB's split, computed here by hand for n = 157:
    int(0.6 * 157) = 94 train, int(0.2 * 157) = 31 validation, the other 32 test."""
    raw = make_raw(seed=seed, n=n, f=1024 if headerless else f)
    rng = np.random.default_rng(seed)
    raw["labels"] = rng.integers(0, raw["c"], n).astype(np.float64)
    assert n == 157
    raw["train"], raw["valid"], raw["test"] = np.arange(0, 94), np.arange(94, 125), np.arange(125, 157)
    return raw


def write_igb(root, raw, size="small", headerless=False, classes=19):
    """IGB's download layout: ROOT/SIZE/processed/{paper, paper__cites__paper}/; the large/full variant
    stores features and labels as raw float32 without a .npy header."""
    proc = root / size / "processed"
    (proc / "paper").mkdir(parents=True)
    (proc / "paper__cites__paper").mkdir()
    label_file = {19: "node_label_19.npy", 2983: "node_label_2K.npy"}[classes]
    if headerless:
        raw["feats"].astype(np.float32).tofile(proc / "paper" / "node_feat.npy")
        raw["labels"].astype(np.float32).tofile(proc / "paper" / label_file)
    else:
        np.save(proc / "paper" / "node_feat.npy", raw["feats"].astype(np.float32))
        np.save(proc / "paper" / label_file, raw["labels"].astype(np.float32))
    np.save(proc / "paper__cites__paper" / "edge_index.npy", np.stack([raw["src"], raw["dst"]], axis=1))
    return proc


def test_igb_miniature_matches_reference(tmp_path):
    raw = igb_raw()
    raw["c"] = 19
    proc = write_igb(tmp_path, raw)
    g = load("igb", root=tmp_path, name="small")
    check_against_reference(g, raw)
    assert g.name == "igb-small"
    base = g.features
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert base is not None  # a view of the memory-mapped file, not a copy read whole
    graphs_equal(load("igb", root=proc), g)               # --root = processed/ itself
    graphs_equal(load("igb", root=proc.parent), g)        # --root = the size directory


def test_igb_2k_labels_and_headerless_layout(tmp_path):
    raw = igb_raw(seed=8, headerless=True)
    raw["c"] = 2983
    raw["labels"][:3] = [2982, 1500, 0]
    write_igb(tmp_path, raw, size="large", headerless=True, classes=2983)
    g = load("igb", root=tmp_path, name="large", num_classes=2983)
    check_against_reference(g, raw)
    assert g.features.shape == (157, 1024)
    with pytest.raises(DataError, match=r"node_label_19\.npy: file not found"):
        load("igb", root=tmp_path, name="large")


def test_igb_split_of_the_full_graph(tmp_path, monkeypatch):
    """On the full graph IGB's fractions apply to the labelled prefix only; the tail is in no split and
    its label values (whatever the file holds there) are ignored.  Checked on a miniature standing in for
    the full graph (its vertex count and labelled prefix patched)."""
    from granndis_hpc.preprocess.sources import igb

    assert igb.labelled_prefix(igb.IGB_FULL_VERTICES, 19) == 227_130_858
    assert igb.labelled_prefix(igb.IGB_FULL_VERTICES, 2983) == 157_675_969
    assert igb.labelled_prefix(1000, 19) == 1000
    raw = igb_raw(seed=12)
    raw["c"] = 19
    raw["labels"][100:] = 12345.0  # not a class: must not matter outside the split
    write_igb(tmp_path, raw, size="full")
    monkeypatch.setattr(igb, "IGB_FULL_VERTICES", 157)
    monkeypatch.setattr(igb, "IGB_FULL_LABELLED", {19: 100, 2983: 50})
    # int(0.6 * 100) = 60 train, int(0.2 * 100) = 20 validation, 20 test, 57 vertices in no split.
    raw["train"], raw["valid"], raw["test"] = np.arange(0, 60), np.arange(60, 80), np.arange(80, 100)
    raw["labels"][100:] = np.nan
    check_against_reference(load("igb", root=tmp_path, name="full"), raw)


def test_igb_sliced_source_reads_each_rank_its_share(tmp_path):
    """The distributed build's view of IGB: rank r of P gets rows split_ranges(E, P)[r:r+2] of
    edge_index.npy and exactly the rows it asks for of every vertex field; the one-rank load through
    the distributed code (sliced.load_slice + assemble) equals the whole-graph loader."""
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.preprocess.build.sliced import assemble, load_slice
    from granndis_hpc.preprocess.sources import sliced_source
    from granndis_hpc.preprocess.sources.igb import IgbSource

    raw = igb_raw(seed=13)
    raw["c"] = 19
    write_igb(tmp_path, raw)
    source = sliced_source("igb", root=str(tmp_path), name="small", num_classes=19)
    assert isinstance(source, IgbSource) and (source.num_vertices, source.num_features) == (157, 6)
    for P in (1, 3, 5):
        pieces = [p for r in range(P) for p in source.edge_pieces(r, P)]
        assert np.array_equal(np.concatenate([p[1] for p in pieces]), raw["src"])
        assert np.array_equal(np.concatenate([p[2] for p in pieces]), raw["dst"])
    whole = load("igb", root=tmp_path, name="small")
    got = source.nodes(40, 101)
    assert np.array_equal(got["features"][0][1], raw["feats"][40:101])
    assert np.array_equal(got["labels"][0][1], whole.labels[40:101])
    for key in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(got[key][0][1], getattr(whole, key)[40:101])
    for symmetrize, self_loops in ((True, "remove"), (False, "add")):
        graphs_equal(assemble(self_group(), load_slice(self_group(), source, symmetrize, self_loops)),
                     load("igb", root=tmp_path, name="small", symmetrize=symmetrize, self_loops=self_loops))
    np.save(tmp_path / "small" / "processed" / "paper" / "node_label_19.npy", np.full(157, 0.5, np.float32))
    with pytest.raises(DataError, match=r"node_label_19\.npy: labels hold non-integer values"):
        IgbSource(root=str(tmp_path), name="small").nodes(0, 10)


def _edges(proc):
    return proc / "paper__cites__paper" / "edge_index.npy"


@pytest.mark.parametrize("damage, file, message", [
    (lambda p, n: _edges(p).unlink(), "edge_index.npy", "file not found"),
    (lambda p, n: np.save(_edges(p), np.zeros((2, 7), np.int64)), "edge_index.npy", r"shape \[E, 2\]"),
    (lambda p, n: np.save(_edges(p), np.array([[0, 1], [n, 2]])), "edge_index.npy", r"ids span \[0, 157\]"),
    (lambda p, n: np.save(p / "paper" / "node_label_19.npy", np.zeros(n - 1, np.float32)), "node_label_19.npy",
     "156 labels for the 157 vertices"),
    (lambda p, n: (p / "paper" / "node_feat.npy").write_bytes(b"\x93NUMPY\x01\x00garbage"), "node_feat.npy",
     "cannot read it"),
    (lambda p, n: _edges(p).write_bytes(_edges(p).read_bytes()[:-50]), "edge_index.npy", "truncated or damaged"),
    (lambda p, n: (p / "paper" / "node_feat.npy").write_bytes(b"\0" * 4100), "node_feat.npy",
     "neither a .npy file nor raw float32 rows of 4096 bytes"),
    (lambda p, n: np.save(p / "paper" / "node_label_19.npy", np.full(n, 19, np.float32)), "node_label_19.npy",
     r"labels span \[19, 19\] but num_classes=19"),
])
def test_igb_bad_input_names_the_file(tmp_path, damage, file, message):
    raw = igb_raw(seed=9)
    proc = write_igb(tmp_path, raw)
    damage(proc, raw["n"])
    with pytest.raises(DataError, match=message) as err:
        load("igb", root=proc)
    assert file in str(err.value), str(err.value)
    # the distributed build's reading of the same files names the file too
    from granndis_hpc.cluster.group import self_group
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.sources import sliced_source

    with pytest.raises(DataError) as err:
        load_slice(self_group(), sliced_source("igb", root=str(proc)))
    assert file in str(err.value), str(err.value)


def test_igb_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"no IGB processed/paper/ directory found.*medium/processed"):
        load("igb", root=tmp_path, name="medium")


# ---------------------------------------------------------------------------------------------
# Both through `preprocess chunk` (the distributed build's input)


@pytest.mark.parametrize("source", ["reddit", "igb"])
def test_chunk_from_reddit_and_igb(tmp_path, source):
    if source == "reddit":
        write_reddit(tmp_path / "in", reddit_raw(seed=10))
        args = ["--root", str(tmp_path / "in")]
    else:
        write_igb(tmp_path / "in", igb_raw(seed=11))
        args = ["--root", str(tmp_path / "in"), "--name", "small", "--num-classes", "19"]
    assert main(["chunk", "--source", source, *args, "--out", str(tmp_path / "c"), "--chunks", "3"]) == 0
    ref = load(source, root=str(tmp_path / "in"), name=None if source == "reddit" else "small")
    got = load("chunked", path=str(tmp_path / "c"))
    graphs_equal(got, ref)
    assert got.name == ref.name
    bad = main(["chunk", "--source", source, "--root", str(tmp_path / "none"), "--out", str(tmp_path / "d")])
    assert bad == 1 and not (tmp_path / "d").exists()
