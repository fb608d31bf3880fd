"""Command-line front end of the sources: add_source_arguments / load_from_args / load."""
import argparse

import numpy as np
import pytest

from preprocess.sources import SOURCES, DataError, add_source_arguments, load, load_from_args

from tests.unit.test_sources_bundle import graphs_equal
from tests.unit.test_sources_planetoid import write_miniature


def parse(argv):
    parser = argparse.ArgumentParser()
    add_source_arguments(parser)
    return parser.parse_args(argv)


def test_defaults():
    args = parse([])
    assert SOURCES == ("planetoid", "ogb", "bundle", "synthetic", "chunked")
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
