"""Command-line front end of the sources: add_source_arguments / load_from_args / load."""
import argparse

import numpy as np
import pytest

from granndis_hpc.preprocess.sources import SOURCES, add_source_arguments, load, load_from_args
from granndis_hpc.preprocess.sources.canonical import DataError

from tests.unit.test_sources_bundle import graphs_equal
from tests.unit.test_sources_planetoid import write_miniature


def parse(argv):
    parser = argparse.ArgumentParser()
    add_source_arguments(parser)
    return parser.parse_args(argv)


def test_defaults():
    args = parse([])
    assert tuple(SOURCES) == ("planetoid", "ogb", "reddit", "igb", "igbh", "bundle", "synthetic", "chunked")
    assert args.source == "synthetic"
    assert (args.vertices, args.avg_degree, args.features, args.classes, args.seed) == (100_000, 25.0, 100, 16, 0)
    assert args.communities is None and args.symmetrize is True and args.self_loops == "remove"


def test_args_equal_programmatic_load():
    argv = ["--vertices", "900", "--avg-degree", "6", "--features", "4", "--classes", "3", "--communities",
            "6", "--seed", "9", "--train-frac", "0.2", "--val-frac", "0.3", "--self-loops", "add"]
    g = load_from_args(parse(argv))
    ref = load("synthetic", vertices=900, avg_degree=6, features=4, classes=3, communities=6, seed=9,
               train_frac=0.2, val_frac=0.3, self_loops="add")
    graphs_equal(g, ref)
    assert (g.train_mask.sum(), g.val_mask.sum()) == (180, 270)
    rows = np.repeat(np.arange(900), np.diff(g.indptr))
    assert np.count_nonzero(rows == g.indices) == 900  # --self-loops add


def test_no_symmetrize_flag(tmp_path):
    write_miniature(tmp_path, name="pubmed")
    sym = load_from_args(parse(["--source", "planetoid", "--name", "pubmed", "--root", str(tmp_path)]))
    directed = load_from_args(parse(["--source", "planetoid", "--name", "pubmed", "--root", str(tmp_path),
                                     "--no-symmetrize"]))
    assert directed.num_edges < sym.num_edges
    rows = np.repeat(np.arange(sym.num_vertices), np.diff(directed.indptr))
    key = rows * sym.num_vertices + directed.indices
    rows_s = np.repeat(np.arange(sym.num_vertices), np.diff(sym.indptr))
    assert np.isin(key, rows_s * sym.num_vertices + sym.indices).all()


def test_errors():
    with pytest.raises(DataError, match=r"unknown options \['vertexes'\]"):
        load("synthetic", vertexes=10)
    with pytest.raises(DataError, match=r"'csv': unknown source"):
        load("csv")
    with pytest.raises(DataError, match=r"planetoid: no --name"):
        load("planetoid", root="/nonexistent")
    with pytest.raises(DataError, match=r"/nonexistent: not a directory"):
        load("planetoid", name="cora", root="/nonexistent")
    with pytest.raises(SystemExit):
        parse(["--source", "csv"])


def _load_ring(name=None, symmetrize=True, self_loops="remove"):
    """The recipe's source: a 12-vertex directed ring, vertex v's features (v, 1), class v % 3."""
    from granndis_hpc.preprocess.sources.canonical import canonicalize

    n = 12
    ids = np.arange(n)
    masks = [ids < 6, (ids >= 6) & (ids < 9), ids >= 9]
    return canonicalize(name or "ring", n, ids, (ids + 1) % n, np.stack([ids, np.ones(n)], 1).astype(np.float32),
                        ids % 3, *masks, symmetrize=symmetrize, self_loops=self_loops)


def test_a_dataset_source_is_one_loader_and_one_registry_line():
    """docs/extending.md "add a dataset source": the loader above plus the one line below, and the
    source is a choice of --source, loads with the shared canonicalisation options, and is loaded whole
    (it declares no sliced opener)."""
    from granndis_hpc.preprocess import sources

    sources.SOURCES.register("ring", _load_ring, uses=("name",))
    try:
        g = load_from_args(parse(["--source", "ring", "--name", "r12"]))
        assert g.name == "r12" and g.num_vertices == 12
        # symmetrised by default: v aggregates v-1 and v+1 (the in-edge CSR, sources sorted)
        expected = np.sort(np.stack([(np.arange(12) - 1) % 12, (np.arange(12) + 1) % 12], 1), axis=1).ravel()
        assert np.array_equal(np.diff(g.indptr), np.full(12, 2)) and np.array_equal(g.indices, expected)
        directed = load("ring", symmetrize=False)
        assert np.array_equal(directed.indices, (np.arange(12) - 1) % 12)  # v aggregates only v-1
        assert sources.sliced_source("ring") is None
    finally:
        del sources.SOURCES["ring"]
    with pytest.raises(SystemExit):
        parse(["--source", "ring"])  # gone with its registry line
