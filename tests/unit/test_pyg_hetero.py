"""`--model pyg-hetero` without MPI on small random typed graphs (tests/hetero_reference.py): the model's
forward equals PyG's own ``HeteroConv({relation: the model's conv of that relation}, aggr="sum")`` run
layer by layer on x_dict and edge_index_dict built here from the global-id-ordered arrays (not from the
model's relation views); a rank's block with the halo in flight and a permuted row order equal the
whole graph; every relation's conv is a copy drawn afresh as to_hetero draws it; the refused
convolutions name the reason; the estimate counts the parameters."""
import copy

import numpy as np
import pytest
import torch

from granndis_hpc.nn.rows import PendingRows
from granndis_hpc.nn.runner import call_layer
from granndis_hpc.nn import LayerGraph, build_model
from tests import pyg_factories
from tests.pyg_factories import heteroconv_logits as _heteroconv_logits
from tests.hetero_reference import random_typed_graph
from tests.unit.test_hetero_layers import _rank

pyg = pytest.importorskip("torch_geometric.nn")
IN, HIDDEN, CLASSES = 5, 8, 3
FACTORIES = ["hetero_sage", "hetero_gat", "hetero_graph", "hetero_mixed"]


def _model(types, factory, layers=3, seed=0, norm=False, **kw):
    torch.manual_seed(seed)
    return build_model("pyg-hetero", IN, HIDDEN, CLASSES, layers, dropout=0.0, norm=norm, types=types,
                       module="tests.pyg_factories", factory=factory, **kw).double().eval()


@pytest.mark.parametrize("factory", FACTORIES)
def test_forward_equals_pyg_heteroconv(factory):
    types, indptr, indices = random_typed_graph(1)
    n = types.num_vertices
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((n, IN)))
    model = _model(types, factory)
    graph = LayerGraph.from_csr(indptr, indices, n)
    with torch.no_grad():
        got = model(x, [graph] * 3)
        want = _heteroconv_logits(model, types, indptr, indices, x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    names = [name for name, _ in model.named_parameters()]
    assert names[0].startswith("convs.0.rel.0.conv.") and any(n.startswith("convs.2.rel.5.conv.") for n in names)


@pytest.mark.parametrize("factory", ["hetero_sage", "hetero_gat"])
def test_a_ranks_block_and_permuted_rows_equal_the_whole_graph(factory):
    types, indptr, indices = random_typed_graph(3)
    n = types.num_vertices
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((n, IN)))
    layer = _model(types, factory).convs[0]
    whole = layer(x, LayerGraph.from_csr(indptr, indices, n))
    degree = np.diff(indptr).astype(np.float32)
    rng = np.random.default_rng(4)
    order = rng.permutation(n)
    graph, _ = _rank(indptr, indices, order, degree)
    torch.testing.assert_close(layer(x[torch.from_numpy(order)], graph), whole[torch.from_numpy(order)])
    own = rng.permutation(n)[: n // 2]
    graph, halo = _rank(indptr, indices, own, degree)
    h = x.clone().requires_grad_(True)
    waits = []
    pending = PendingRows(h[torch.from_numpy(own)], lambda: waits.append(1) or h[torch.from_numpy(halo)], halo.size)
    got = call_layer(layer, pending, graph)
    assert waits == [1]  # not split: the runner waited for the halo, then called it on the block
    torch.testing.assert_close(got, whole[torch.from_numpy(own)])
    got.sum().backward()
    want = x.clone().requires_grad_(True)
    layer(want, LayerGraph.from_csr(indptr, indices, n))[torch.from_numpy(own)].sum().backward()
    torch.testing.assert_close(h.grad, want.grad)


def test_every_relation_draws_its_own_copy_as_to_hetero():
    types, _, _ = random_typed_graph(0)
    model = _model(types, "hetero_sage", seed=7)
    torch.manual_seed(7)
    convs = pyg_factories.hetero_sage(IN, HIDDEN, CLASSES, 3)
    for l, conv in enumerate(convs):
        for r in range(types.num_relations):
            mine = copy.deepcopy(conv)
            mine.reset_parameters()
            for name, p in mine.state_dict().items():
                assert torch.equal(model.state_dict()[f"convs.{l}.rel.{r}.conv.{name}"].float(), p), (l, r, name)
    first = model.convs[0]
    assert not torch.equal(first.rel[0].conv.lin_l.weight, first.rel[1].conv.lin_l.weight)


def test_a_type_no_relation_leads_into_gets_zeros():
    types, indptr, indices = random_typed_graph(2, pairs=((0, 0), (0, 1), (1, 0), (2, 1)))
    assert not types.destination_relations()[2]
    n = types.num_vertices
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((n, IN)))
    model = _model(types, "hetero_graph", layers=1)
    with torch.no_grad():
        got = model(x, [LayerGraph.from_csr(indptr, indices, n)])
        want = _heteroconv_logits(model, types, indptr, indices, x)
    lo, hi = types.id_range("c")
    assert float(got[lo:hi].abs().max()) == 0.0
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_self_loops_on_relations_within_one_type_equal_pyg():
    """GATConv adds self loops (PyG's default): on relations within one type the loops join each vertex
    to itself, as HeteroConv's conv(x_dict[type]) does."""
    from granndis_hpc.nn.pyg_hetero import PyGHeteroLayer
    types, indptr, indices = random_typed_graph(5, pairs=((0, 0), (1, 1), (2, 2)))
    n = types.num_vertices
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((n, IN)))
    torch.manual_seed(0)
    layer = PyGHeteroLayer(pyg.GATConv(IN, 4, heads=2), types).double()
    model = torch.nn.Module()
    model.convs = [layer]
    got = layer(x, LayerGraph.from_csr(indptr, indices, n))
    torch.testing.assert_close(got, _heteroconv_logits(model, types, indptr, indices, x), rtol=1e-10, atol=1e-10)


def test_convs_that_cannot_serve_relations_are_refused_with_the_reason():
    from granndis_hpc.nn.pyg_hetero import PyGHeteroLayer
    types, _, _ = random_typed_graph(0)
    with pytest.raises(ValueError, match=r"--model pyg-hetero: ChebConv propagates over several hops"):
        _model(types, "hetero_cheb")
    for conv, reason in ((pyg.GCNConv(4, 4, normalize=False), r"GCNConv has no form for two vertex types"),
                         (pyg.GATConv(4, 4), r"GATConv\(add_self_loops=True\) would join vertices of two types "
                                             r"over relation a__r01__b"),
                         (pyg.AGNNConv(add_self_loops=False), r"AGNNConv takes one set of rows.*relation a__r01__b"),
                         (pyg.SGConv(4, 4, K=2), r"several hops")):
        with pytest.raises(ValueError, match=reason):
            PyGHeteroLayer(conv, types)


def test_options_estimate_and_norm_linear_layers():
    from granndis_hpc import memory_model as mm
    from granndis_hpc import registry
    types, indptr, indices = random_typed_graph(0)
    from granndis_hpc.model_code import code_refusal
    assert registry.code_options("pyg-hetero") == ("module", "factory") and registry.typed("pyg-hetero")
    recorded = registry.model_options("pyg-hetero", ["module=tests.pyg_factories", "factory=hetero_sage"])
    assert "a file never chooses the code that runs" in code_refusal("pyg-hetero", recorded, [], "RUN/best-model.pt")
    model = _model(types, "hetero_mixed", layers=4, linear_layers=1, norm=True)
    assert [type(layer.rel[0].conv).__name__ for layer in model.convs] == ["SAGEConv", "GraphConv", "GATConv"]
    assert len(model.linears) == 1 and len(model.norms) == 3 and model.contract.source_ids == "all"
    n = types.num_vertices
    assert model(torch.randn(n, IN).double(), [LayerGraph.from_csr(indptr, indices, n)] * 3).shape == (n, CLASSES)
    options = {"module": "tests.pyg_factories", "factory": "hetero_gat"}
    state = torch.get_rng_state()
    spec = mm.ModelSpec("pyg-hetero", IN, HIDDEN, CLASSES, 3, options=options, relations=types.num_relations)
    assert spec.parameters() == sum(p.numel() for p in _model(types, "hetero_gat").parameters())
    torch.set_rng_state(state)
    spec.parameters()
    assert torch.equal(torch.get_rng_state(), state)  # the estimate draws nothing


@pytest.mark.parametrize("factory", ["hetero_sage", "hetero_gat"])
def test_projected_input_equals_heteroconv_of_the_projected_rows(factory):
    """Types of different widths (zero-padded rows): each type's own columns through its Linear, then the
    stack, equals PyG's HeteroConv of the rows projected by hand; the estimate counts its parameters."""
    import dataclasses

    from granndis_hpc import memory_model as mm
    types, indptr, indices = random_typed_graph(2)
    widths = (5, 3, 4)
    types = dataclasses.replace(types, widths=widths)
    n, rng = types.num_vertices, np.random.default_rng(2)
    x = torch.zeros(n, max(widths), dtype=torch.float64)
    for t, w in enumerate(widths):
        lo, hi = types.offsets[t], types.offsets[t + 1]
        x[lo:hi, :w] = torch.from_numpy(rng.standard_normal((hi - lo, w)))
    model = _model(types, factory)
    assert [model.inputs[t].in_features for t in types.names] == list(widths)
    graph = LayerGraph.from_csr(indptr, indices, n)
    h0 = torch.cat([x[types.offsets[t]:types.offsets[t + 1], :w] @ model.inputs[name].weight.T
                    + model.inputs[name].bias for t, (name, w) in enumerate(zip(types.names, widths))])
    with torch.no_grad():
        got = model(x, [graph] * 3)
        want = _heteroconv_logits(model, types, indptr, indices, h0)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    spec = mm.ModelSpec("pyg-hetero", max(widths), HIDDEN, CLASSES, 3, relations=types.num_relations,
                        type_widths=widths, options=(("module", "tests.pyg_factories"), ("factory", factory)))
    assert spec.estimator.parameters(spec) == sum(p.numel() for p in model.parameters())
