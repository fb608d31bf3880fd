"""bench/bench_single.py's equivalence check: this project's SAGE and PyG's SAGEConv (CSR adj_t and
edge_index) give the same loss and gradients from the same weights, and a wrong weight is caught.
PyG is optional (the `bench` extra), so without it this module is skipped."""
import argparse

import pytest
import torch

pytest.importorskip("torch_geometric")
import bench_single  # noqa: E402  (bench/ is on pytest's pythonpath: pyproject.toml)


def _setup():
    args = argparse.Namespace(vertices=300, degree=8.0, features=12, layers=3, hidden=16)
    graph = bench_single.build_graph(args)
    impls, missing = bench_single.make_implementations(graph, args)
    assert missing is None and [i.name for i in impls] == ["granndis", "pyg-csr", "pyg-edges"]
    x, labels = torch.from_numpy(graph.features), torch.from_numpy(graph.labels)
    train = torch.from_numpy(graph.train_mask.nonzero()[0])
    return impls, x, labels, train


def test_same_weights_give_the_same_loss_and_gradients():
    impls, x, labels, train = _setup()
    lines = bench_single.check_same_function(impls, x, labels, train)
    assert len(lines) == 3 and all("loss" in line for line in lines)


def test_a_different_weight_is_caught():
    impls, x, labels, train = _setup()
    with torch.no_grad():
        impls[1].convs[1].lin_r.weight.mul_(1.01)
    with pytest.raises(SystemExit, match="pyg-csr does not compute what granndis computes"):
        bench_single.check_same_function(impls, x, labels, train)
