"""The `pyg` model family without MPI: each torch_geometric convolution, run by the layer runner on a
rank's block with the halo in flight, gives the rows plain PyG computes on the whole graph; the refused
convolutions name the reason; a PyG stack registered as a model of one's own (docs/models.md) trains;
the memory estimate counts the stack's parameters without drawing from torch's generator."""
import numpy as np
import pytest
import torch

from granndis_hpc.nn.rows import PendingRows
from granndis_hpc.nn.runner import call_layer
from granndis_hpc.nn.graph import LayerGraph
from tests.dense_reference import random_in_csr

pyg = pytest.importorskip("torch_geometric.nn")
N, M, HALO_AFTER = 50, 20, 25  # vertices, destination rows of the block, own source rows


def _graph(seed=0):
    rng = np.random.default_rng(seed)
    indptr, indices = random_in_csr(N, 200, rng, isolated=3)
    dst = np.repeat(np.arange(N), np.diff(indptr))
    return indptr, indices, torch.from_numpy(np.stack([indices, dst]).astype(np.int64)), dst


def _block(indptr, indices, dst):
    """The in-edges of vertices 0..M-1 over their sources (first the M destination rows, then the others),
    with global degrees and stored self loops, as a rank's layer graph."""
    sub = indices[: indptr[M]]
    order = np.concatenate([np.arange(M), np.setdiff1d(np.unique(sub), np.arange(M))])
    pos = np.full(N, -1)
    pos[order] = np.arange(order.size)
    deg = torch.as_tensor(np.diff(indptr), dtype=torch.float32)
    loops = np.bincount(dst[indices == dst], minlength=N).astype(np.float32)
    graph = LayerGraph.from_csr(indptr[: M + 1], pos[sub], order.size, dst_degree=deg[:M],
                                src_degree=deg[torch.from_numpy(order)], src_loops=torch.from_numpy(loops[order]))
    return graph, torch.from_numpy(order)


def _convs():
    torch.manual_seed(0)
    return [pyg.SAGEConv(6, 4), pyg.GATConv(6, 3, heads=2), pyg.GATv2Conv(6, 3, heads=2),
            pyg.GINConv(torch.nn.Linear(6, 4), train_eps=True), pyg.GraphConv(6, 4), pyg.TransformerConv(6, 3, heads=2),
            pyg.GCNConv(6, 4, normalize=False), pyg.LEConv(6, 4)]  # LEConv: differences over in-edges, no degrees


@pytest.mark.parametrize("index", range(8))
def test_conv_on_a_block_with_the_halo_in_flight_equals_plain_pyg(index):
    from granndis_hpc.nn.pyg import PyGLayer
    indptr, indices, edge_index, dst = _graph()
    conv = _convs()[index]
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    conv = conv.double()
    if isinstance(conv, pyg.GCNConv):  # the user's whole-graph GCN: PyG's own normalisation
        conv.normalize = conv.add_self_loops = True
        want = conv(x, edge_index)
        conv.normalize = conv.add_self_loops = False
    else:
        want = conv(x, edge_index)
    layer = PyGLayer(conv)
    graph, order = _block(indptr, indices, dst)
    xs = x[order]
    waits = []
    pending = PendingRows(xs[:HALO_AFTER], lambda: waits.append(1) or xs[HALO_AFTER:], order.numel() - HALO_AFTER)
    got = call_layer(layer, pending, graph)
    assert waits == [1]  # a PyG conv is not split: the runner waited for the halo, then called it
    torch.testing.assert_close(got, want[:M], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer(x, LayerGraph.from_csr(indptr, indices, N)), want, rtol=1e-10, atol=1e-10)


def test_convs_that_cannot_run_partitioned_are_refused_with_the_reason():
    from granndis_hpc.nn.pyg import PyGLayer
    for conv, reason in ((pyg.GCNConv(4, 4), r"normalize=True\) computes the degrees.*use GCNConv\(normalize=False\)"),
                         (pyg.GCNConv(4, 4, normalize=False, cached=True), r"cached=True"),
                         (pyg.ChebConv(4, 4, K=2), r"several hops"),
                         (torch.nn.Linear(4, 4), r"not a torch_geometric message-passing")):
        with pytest.raises(ValueError, match=reason):
            PyGLayer(conv)


def test_registered_pyg_stack_recipe_trains_and_estimates():
    """docs/models.md "A PyG stack": pyg_stack registered as a model of one's own, trained a few steps on
    the whole graph (the loss falls); the pyg family's estimate counts its parameters and draws nothing."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.nn.models import MODELS, build_model, register_model
    from granndis_hpc.nn.pyg import pyg_stack

    @register_model("recipe-pyg", linear_head=True)
    def build(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
        convs = [pyg.SAGEConv(in_features, hidden), pyg.GATv2Conv(hidden, hidden, heads=2, concat=False)]
        return pyg_stack("recipe-pyg", convs, in_features, hidden, num_classes, dropout, norm, linear_layers)

    try:
        indptr, indices, _, _ = _graph(2)
        torch.manual_seed(0)
        model = build_model("recipe-pyg", 6, 8, 3, 3, dropout=0.2, norm=True, linear_layers=1)
        x = torch.randn(N, 6, generator=torch.Generator().manual_seed(3))
        y = x[:, :3].argmax(dim=1)  # learnable from a vertex's own features
        graphs = [LayerGraph.from_csr(indptr, indices, N)] * 2
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        losses = []
        for _ in range(30):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x, graphs), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
    finally:
        MODELS.pop("recipe-pyg")
    options = {"module": "tests.pyg_factories", "factory": "gatv2"}
    state = torch.get_rng_state()
    spec = mm.ModelSpec("pyg", 6, 8, 3, 3, options=options)
    torch.manual_seed(0)
    model = build_model("pyg", 6, 8, 3, 3, **options)
    torch.set_rng_state(state)
    assert spec.parameters() == sum(p.numel() for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), state)
