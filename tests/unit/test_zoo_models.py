"""GAT, GIN, SAGE-sum, SAGE-max (nn/zoo.py) beyond the whole-graph checks of test_nn_models.py (which
runs every registered model): the halo in flight (PendingRows: own edges first, then halo edges, the
softmax and maximum combined from the two parts), attention dropout keyed by edge ids (the same masks
on a rank's subset as on the whole graph, and as the dense reference draws them), and the options."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from granndis_hpc.graph.csr import csr_rows
from granndis_hpc.nn.rows import PendingRows
from granndis_hpc.nn import LayerGraph, RowDropout, build_model, keep_mask
from granndis_hpc.nn.edge_layers import attention_key, edge_ids
from granndis_hpc.registry import model_options
from tests.dense_reference import EDGE_MODELS, dense_logits, random_in_csr

N, FEATURES, CLASSES = 90, 7, 4


def _graph(seed):
    rng = np.random.default_rng(seed)
    indptr, indices = random_in_csr(N, 400, rng, isolated=4)
    x = torch.from_numpy(rng.standard_normal((N, FEATURES)).astype(np.float32))
    return rng, indptr, indices, x


def _model(name, seed=0, **kw):
    torch.manual_seed(seed)
    options = {"heads": 3} if name == "gat" else {}
    options.update(kw.pop("options", {}))
    return build_model(name, FEATURES, 5, CLASSES, 2, **kw, **options)


def _subset(rng, indptr, indices, n_own=35):
    """A rank's own rows (unsorted) and halo rows, with the layer graph over them (global degrees)."""
    own = rng.permutation(N)[:n_own]
    _, sources = csr_rows(indptr, indices, own)
    halo = np.setdiff1d(sources, own)
    rows = np.concatenate([own, halo])
    local = np.full(N, -1, dtype=np.int64)
    local[rows] = np.arange(rows.shape[0])
    sub_indptr, sub_sources = csr_rows(indptr, indices, own)
    degree = np.diff(indptr).astype(np.float32)
    graph = LayerGraph(own.shape[0], rows.shape[0], sub_indptr, local[sub_sources], degree[own], degree[rows])
    return own, halo, graph


def _recording(recorded):
    """gather of a single process (identity) that records every layer's source rows (autograd-connected:
    a halo row's gradient flows back into the whole-graph pass that computed it, as to its owner)."""
    def gather(l, h):
        recorded[l] = h
        return h
    return gather


def _pending_gather(recorded, halo, waits):
    def gather(l, h):
        rows = recorded[l][torch.from_numpy(halo)]
        if l == 0:  # layer 0: the static halo, one tensor (as the engine's gather)
            return torch.cat([h, rows])

        def wait():
            waits.append(l)
            return rows
        return PendingRows(h, wait, rows.shape[0])
    return gather


@pytest.mark.parametrize("name", EDGE_MODELS)
def test_halo_in_flight_gives_the_whole_graph_rows_and_gradients(name):
    rng, indptr, indices, x = _graph(1)
    model = _model(name, 1, dropout=0.0)
    whole_graphs = [LayerGraph.from_csr(indptr, indices, N)] * 2
    own, halo, graph = _subset(rng, indptr, indices)
    assert graph.n_src > graph.n_dst and bool((graph.indices >= graph.n_dst).any())
    labels = torch.from_numpy(rng.integers(0, CLASSES, own.shape[0]))

    recorded = {}
    whole = model(x, whole_graphs, gather=_recording(recorded))
    F.cross_entropy(whole[torch.from_numpy(own)], labels, reduction="sum").backward(retain_graph=True)
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()

    waits = []
    got = model(x[torch.from_numpy(own)], [graph] * 2, gather=_pending_gather(recorded, halo, waits))
    assert waits == [1]  # the halo was waited for once, after the own edges
    torch.testing.assert_close(got, whole[torch.from_numpy(own)], atol=1e-5, rtol=1e-5)
    F.cross_entropy(got, labels, reduction="sum").backward()
    for key, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[key], atol=1e-4, rtol=1e-4, msg=f"gradient of {key}")


def _reference_dropouts(seed, epoch, n, p_feat, p_attn):
    ids = torch.arange(n)

    def drop(layer, h):
        return h * keep_mask(seed, epoch, layer, ids, h.shape[1], p_feat).to(h.dtype) / (1 - p_feat)

    def attention(layer, dst, src, alpha):
        keep = keep_mask(seed, epoch, attention_key(layer), edge_ids(dst, src), alpha.shape[1], p_attn)
        return alpha * keep.to(alpha.dtype) / (1 - p_attn)
    return drop, attention


def test_attention_dropout_is_keyed_by_edge_and_equals_the_reference_on_any_subset():
    rng, indptr, indices, x = _graph(2)
    model = _model("gat", 2, dropout=0.3, options={"attn_dropout": 0.5}).train()
    assert model.contract.source_ids == "training"
    whole_graphs = [LayerGraph.from_csr(indptr, indices, N)] * 2
    recorded = {}
    whole = model(x, whole_graphs, gather=lambda l, h: recorded.setdefault(l, h.detach()),
                  dropout=RowDropout(11, 3))
    drop, attention = _reference_dropouts(11, 3, N, 0.3, 0.5)
    want = dense_logits("gat", model, indptr, indices, x, dropout=drop, attention_dropout=attention)
    torch.testing.assert_close(whole.double(), want, atol=1e-5, rtol=1e-5)
    # Another epoch draws other masks; no attention dropout differs too.
    assert not torch.allclose(whole, model(x, whole_graphs, dropout=RowDropout(11, 4)))

    # A rank's subset: rows keyed by their global ids, edges by (destination, source) ids.
    own, halo, graph = _subset(rng, indptr, indices)
    graph.source_ids = torch.from_numpy(np.concatenate([own, halo]))
    got = model(x[torch.from_numpy(own)], [graph] * 2, gather=_pending_gather(recorded, halo, []),
                dropout=RowDropout(11, 3, torch.from_numpy(own)))
    torch.testing.assert_close(got, whole[torch.from_numpy(own)], atol=1e-5, rtol=1e-5)


def test_gat_options_and_bad_values():
    assert model_options("gat", ["concat=false", "heads=2", "attn_dropout=0.6"]) == {
        "heads": 2, "out_heads": 1, "concat": False, "attn_dropout": 0.6, "negative_slope": 0.2}
    model = _model("gat", options={"heads": 2, "out_heads": 3, "concat": False})
    assert model.conv_in_widths == [FEATURES, 5]
    assert _model("gat", options={"heads": 2}).conv_in_widths == [FEATURES, 10]
    rng, indptr, indices, x = _graph(3)
    graphs = [LayerGraph.from_csr(indptr, indices, N)] * 2
    torch.testing.assert_close(model.eval()(x, graphs).double(), dense_logits("gat", model, indptr, indices, x),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="concat must be of type bool, got 'maybe'"):
        model_options("gat", ["concat=maybe"])
    with pytest.raises(ValueError, match=r"heads must be of type int >= 1, got '0'"):
        model_options("gat", ["heads=0"])
    with pytest.raises(ValueError, match=r"attn_dropout must be of type float in \[0, 1\), got '1'"):
        model_options("gat", ["attn_dropout=1"])
    with pytest.raises(ValueError, match="heads=0: model 'gat' needs heads >= 1"):
        _model("gat", options={"heads": 0})
    with pytest.raises(ValueError, match="attn_dropout=1.0: must be in"):
        _model("gat", options={"attn_dropout": 1.0})
    assert model_options("gin", ["eps=0.5"]) == {"eps": 0.5}
    torch.manual_seed(0)
    assert build_model("gin", 3, 4, 2, 2, eps=0.5).convs[0].eps.item() == 0.5


def test_bring_your_own_layer_recipe():
    """docs/models.md "Bring your own layer": a layer of the contract (nn/contract.py) stacked by EdgeGNN
    and registered runs on the whole graph and, with the halo in flight, on a rank's subset; both equal
    the formula out_v = W1 h_v + W2 sum_u h_u (+ ReLU between layers) computed densely here."""
    from torch import nn

    from granndis_hpc.nn.contract import Layer
    from granndis_hpc.nn.graph import aggregate
    from granndis_hpc.nn.models import MODELS, register_model
    from granndis_hpc.nn.zoo import EdgeGNN
    from tests.dense_reference import dense_adjacency

    class GraphConv(Layer):
        def __init__(self, win, wout):
            super().__init__()
            self.lin_self, self.lin_neigh = nn.Linear(win, wout), nn.Linear(win, wout, bias=False)

        def aggregate_part(self, part, m, call):  # any part of the edges: own, halo or all
            return aggregate(part, m, "sum")

        def update(self, h_dst, aggregated, call):  # combine: the parts' sum (the default)
            return self.lin_self(h_dst) + self.lin_neigh(aggregated)

    @register_model("recipe-graphconv", linear_head=True)
    def build(in_features, hidden, num_classes, layers, dropout, norm, linear_layers=0):
        widths = [in_features] + [hidden] * (layers - 1) + [num_classes]
        return EdgeGNN("recipe-graphconv", [GraphConv(widths[l], widths[l + 1]) for l in range(layers - linear_layers)],
                       widths, dropout, norm)

    try:
        rng, indptr, indices, x = _graph(4)
        torch.manual_seed(0)
        model = build_model("recipe-graphconv", FEATURES, 5, CLASSES, 2).eval()
        recorded = {}
        whole = model(x, [LayerGraph.from_csr(indptr, indices, N)] * 2, gather=_recording(recorded))
        a, h = dense_adjacency(indptr, indices), x.double()
        for l, conv in enumerate(model.convs):
            h = torch.relu(h) if l else h
            h = h @ conv.lin_self.weight.double().T + conv.lin_self.bias.double() \
                + (a @ h) @ conv.lin_neigh.weight.double().T
        torch.testing.assert_close(whole.double(), h.detach(), atol=1e-5, rtol=1e-5)
        own, halo, graph = _subset(rng, indptr, indices)
        got = model(x[torch.from_numpy(own)], [graph] * 2, gather=_pending_gather(recorded, halo, []))
        torch.testing.assert_close(got, whole[torch.from_numpy(own)], atol=1e-5, rtol=1e-5)
    finally:
        MODELS.pop("recipe-graphconv")
