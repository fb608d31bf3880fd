"""bench/bench_single_rank.py's PyG side (bench/single_rank_pyg.py): PyG's SAGE, GCN (normalize=False over
the GCN-normalised adjacency) and ResSAGE+ stacks compute what granndis_hpc's models compute from the
same weights, checkpointed or not.  PyG is optional (the `bench` extra): without it this is skipped."""
import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
import single_rank_pyg  # noqa: E402  (bench/ is on pytest's pythonpath: pyproject.toml)

from granndis_hpc.nn import LayerGraph, PassSettings, build_model  # noqa: E402
from tests.dense_reference import random_in_csr  # noqa: E402


def _graph(n=150, features=7):
    rng = np.random.default_rng(5)
    indptr, indices = random_in_csr(n, 900, rng, isolated=5)
    return LayerGraph.from_csr(indptr, indices, n), torch.from_numpy(rng.standard_normal((n,
                                                                                          features)).astype(np.float32))


@pytest.mark.parametrize("name,layers", [("sage", 3), ("gcn", 3), ("ressage", 5)])
def test_pyg_stack_equals_the_model_from_the_same_weights(name, layers):
    graph, x = _graph()
    torch.manual_seed(0)
    ours = build_model(name, 7, 16, 4, layers, dropout=0.0).train()
    pyg = single_rank_pyg.PygNet(name, 7, 16, 4, layers, 0.0, checkpoint=name == "ressage").train()
    adj = single_rank_pyg.adjacency(graph, "gcn" if name == "gcn" else "mean")
    torch.manual_seed(1)
    other = single_rank_pyg.PygNet(name, 7, 16, 4, layers, 0.0).train()  # its own weights: not the same
    assert not torch.allclose(other(x, adj), ours(x, [graph] * layers), atol=1e-3)
    pyg.copy_from(ours)
    a, b = ours(x, [graph] * layers, settings=PassSettings(checkpoint_activations=name == "ressage")), pyg(x, adj)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    ours_grads = dict(ours.named_parameters())
    assert sum(p.numel() for p in pyg.parameters()) == sum(p.numel() for p in ours.parameters())
    # The first conv's projections (named differently): the gradients agree too.
    first = pyg.convs[0]
    if name == "gcn":
        torch.testing.assert_close(first.lin.weight.grad, ours_grads["convs.0.lin.weight"].grad, rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(first.lin_l.weight.grad, ours_grads["convs.0.lin_neigh.weight"].grad,
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(first.lin_r.weight.grad, ours_grads["convs.0.lin_self.weight"].grad,
                                   rtol=1e-4, atol=1e-5)
