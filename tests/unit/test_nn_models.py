"""GNN models against the independent dense reference: whole graph, shrinking prefix blocks (one-hop
graph masking), halo gather, parameter gradients, Cora, deep ResSAGE+ training, bad input."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from granndis_hpc.graph.csr import csr_rows
from granndis_hpc.nn import MODELS as REGISTERED, LayerGraph, build_model
from tests.dense_reference import dense_logits, random_in_csr

# Every registered model with a formula in tests/dense_reference.py (pyg stacks are checked against
# PyG itself: tests/unit/test_pyg_models.py, tests/mpi/test_pyg_exact.py; the typed models of
# heterogeneous graphs against tests/hetero_reference.py: tests/unit/test_hetero_layers.py).
MODELS = [name for name in REGISTERED if name != "pyg" and not REGISTERED.entry(name).get("typed")]
LAYERS = {"sage": 3, "gcn": 3, "ressage": 4, "gat": 3, "gin": 3, "sage-sum": 3, "sage-max": 3}


def _graph(seed, n=131, edges=520, isolated=7, features=11):
    rng = np.random.default_rng(seed)
    indptr, indices = random_in_csr(n, edges, rng, isolated=isolated)
    x = torch.from_numpy(rng.standard_normal((n, features)).astype(np.float32))
    return indptr, indices, x


def _model(name, seed=0, features=11, hidden=9, classes=5, layers=None, norm=True, dropout=0.0):
    torch.manual_seed(seed)
    return build_model(name, features, hidden, classes, layers or LAYERS[name], dropout=dropout, norm=norm).eval()


def _whole(indptr, indices, model):
    n = indptr.shape[0] - 1
    return [LayerGraph.from_csr(indptr, indices, n)] * model.num_layers


def _param_grads(model):
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


# CUDA runs only where torch sees a GPU (not on the development machine or CI).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _on(device, graphs):
    return [g.to(device) for g in graphs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_whole_graph_forward_equals_dense_reference(name, norm, device):
    for seed in (0, 1):
        indptr, indices, x = _graph(seed)
        model = _model(name, seed, norm=norm)
        got = model.to(device)(x.to(device), _on(device, _whole(indptr, indices, model))).cpu()
        model.cpu()
        want = dense_logits(name, model, indptr, indices, x)
        assert got.shape == (x.shape[0], 5)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        # The state_dict form of the reference gives the same numbers.
        torch.testing.assert_close(dense_logits(name, model.state_dict(), indptr, indices, x), want.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_parameter_gradients_equal_dense_reference(name, device):
    indptr, indices, x = _graph(2)
    model = _model(name, 2).to(device)
    labels = torch.from_numpy(np.random.default_rng(2).integers(0, 5, x.shape[0]))
    logits = model(x.to(device), _on(device, _whole(indptr, indices, model)))
    F.cross_entropy(logits, labels.to(device), reduction="sum").backward()
    got = {k: g.cpu() for k, g in _param_grads(model).items()}
    model.cpu().zero_grad()
    F.cross_entropy(dense_logits(name, model, indptr, indices, x), labels, reduction="sum").backward()
    want = _param_grads(model)
    assert set(got) == set(want) and len(got) > 0
    for key in got:
        torch.testing.assert_close(got[key], want[key], atol=1e-4, rtol=1e-4, msg=f"gradient of {key}")


def _hops(indptr, indices, inner, max_hop):
    """BFS hop of every vertex from the inner set along in-edges (-1: farther than max_hop)."""
    hop = np.full(indptr.shape[0] - 1, -1, dtype=np.int64)
    hop[inner] = 0
    frontier = inner
    for h in range(1, max_hop + 1):
        _, sources = csr_rows(indptr, indices, frontier)
        frontier = np.unique(sources[hop[sources] < 0])
        hop[frontier] = h
    return hop


def _shrinking_blocks(indptr, indices, inner, layers):
    """Rows ordered by hop, and per layer l the block of rows with hop <= L-1-l over rows with hop <= L-l,
    normalised with the whole graph's (global) degrees, as the engine builds them under full preload."""
    hop = _hops(indptr, indices, inner, layers)
    rows = np.flatnonzero(hop >= 0)
    rows = rows[np.argsort(hop[rows], kind="stable")]
    local = np.full(hop.shape[0], -1, dtype=np.int64)
    local[rows] = np.arange(rows.shape[0])
    degree = np.diff(indptr).astype(np.float32)
    graphs = []
    for l in range(layers):
        n_dst = int((hop[rows] <= layers - 1 - l).sum())
        n_src = int((hop[rows] <= layers - l).sum())
        sub_indptr, sub_sources = csr_rows(indptr, indices, rows[:n_dst])
        graphs.append(LayerGraph(n_dst, n_src, sub_indptr, local[sub_sources], degree[rows[:n_dst]],
                                 degree[rows[:n_src]]))
    return rows, graphs


@pytest.mark.parametrize("name", MODELS)
def test_shrinking_prefix_blocks_are_exact_on_inner_rows(name):
    """One-hop graph masking: layer l only computes rows of hop <= L-1-l, yet inner rows are exact."""
    indptr, indices, x = _graph(3, n=160, edges=330, isolated=9)
    model = _model(name, 3)
    rng = np.random.default_rng(3)
    inner = np.sort(rng.choice(indptr.shape[0] - 1, 17, replace=False))
    rows, graphs = _shrinking_blocks(indptr, indices, inner, model.num_layers)
    n_inner = inner.shape[0]
    # The test is only meaningful if the blocks really shrink and truncate neighbourhoods.
    assert graphs[0].n_src > graphs[-1].n_src > graphs[-1].n_dst == n_inner
    labels = torch.from_numpy(rng.integers(0, 5, n_inner))

    local_logits = model(x[torch.from_numpy(rows)], graphs)
    assert local_logits.shape == (n_inner, 5)
    F.cross_entropy(local_logits, labels, reduction="sum").backward()
    local_grads = _param_grads(model)
    model.zero_grad()

    whole = model(x, _whole(indptr, indices, model))
    torch.testing.assert_close(local_logits, whole[torch.from_numpy(rows[:n_inner])], atol=1e-5, rtol=1e-5)
    want = dense_logits(name, model, indptr, indices, x)[torch.from_numpy(rows[:n_inner])]
    torch.testing.assert_close(local_logits.double(), want, atol=1e-5, rtol=1e-5)
    # Loss on inner rows only: the truncated computation's gradients are the full-graph gradients.
    F.cross_entropy(want, labels, reduction="sum").backward()
    for key, grad in _param_grads(model).items():
        torch.testing.assert_close(local_grads[key], grad.float(), atol=1e-4, rtol=1e-4, msg=f"gradient of {key}")


@pytest.mark.parametrize("name", MODELS)
def test_halo_rows_come_from_gather(name):
    """A rank owning an arbitrary subset gets exact logits when gather appends its halo rows."""
    indptr, indices, x = _graph(4)
    model = _model(name, 4)
    rng = np.random.default_rng(4)
    own = rng.permutation(indptr.shape[0] - 1)[:50]  # unsorted: row order is the rank's business
    _, sources = csr_rows(indptr, indices, own)
    halo = np.setdiff1d(sources, own)
    assert halo.shape[0] > 0
    local = np.full(indptr.shape[0] - 1, -1, dtype=np.int64)
    local[np.concatenate([own, halo])] = np.arange(own.shape[0] + halo.shape[0])
    sub_indptr, sub_sources = csr_rows(indptr, indices, own)
    degree = np.diff(indptr).astype(np.float32)
    graph = LayerGraph(own.shape[0], own.shape[0] + halo.shape[0], sub_indptr, local[sub_sources], degree[own],
                       degree[np.concatenate([own, halo])])

    # The peers' rows at every layer: record what the whole-graph model hands to gather.
    recorded = {}
    whole = model(x, _whole(indptr, indices, model), gather=lambda l, h: recorded.setdefault(l, h))
    calls = []

    def gather(l, h):
        calls.append((l, tuple(h.shape)))
        return torch.cat([h, recorded[l][torch.from_numpy(halo)]])

    got = model(x[torch.from_numpy(own)], [graph] * model.num_layers, gather=gather)
    torch.testing.assert_close(got, whole[torch.from_numpy(own)], atol=1e-5, rtol=1e-5)
    assert calls == [(l, (own.shape[0], w)) for l, w in enumerate(model.conv_in_widths)]


@pytest.mark.parametrize("name", MODELS)
def test_dropout_is_applied_before_gather(name):
    """In training, gather(1, h) sees the dropped-out rows: a halo row carries its owner's mask."""
    indptr, indices, x = _graph(5)
    model = _model(name, 5, dropout=0.5)
    seen = {}
    graphs = _whole(indptr, indices, model)
    model(x, graphs, gather=lambda l, h: seen.setdefault(("eval", l), h))
    model.train()
    torch.manual_seed(0)
    model(x, graphs, gather=lambda l, h: seen.setdefault(("train", l), h))
    # Layer 0's input is identical in both modes, so layer 1's gather input is eval * mask / (1 - p).
    ev, tr = seen[("eval", 1)], seen[("train", 1)]
    kept = tr != 0
    assert 0.3 < kept.float().mean() / (ev != 0).float().mean() < 0.7
    torch.testing.assert_close(tr[kept], 2 * ev[kept])


def test_deep_ressage_trains_at_112_layers():
    """res+ blocks keep a gradient path at depth: 112 layers, 30 Adam steps, loss falls, no vanishing."""
    rng = np.random.default_rng(0)
    indptr, indices = random_in_csr(200, 800, rng, isolated=5)
    graphs = [LayerGraph.from_csr(indptr, indices, 200)] * 112
    torch.manual_seed(0)
    x = torch.randn(200, 8)
    labels = (x @ torch.randn(8, 4)).argmax(dim=1)  # learnable from the features
    model = build_model("ressage", 8, 16, 4, 112, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, graphs), labels)
        loss.backward()
        if step == 0:
            norms = [torch.cat([p.grad.flatten() for p in conv.parameters()]).norm() for conv in model.convs]
            assert min(norms) > 0.1 * max(norms), "gradients vanish across the residual blocks"
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.7 * losses[0], losses


def test_cora_matches_dense_reference(planetoid_root):
    from granndis_hpc.preprocess import sources
    cora = sources.load("planetoid", name="cora", root=planetoid_root)
    x = torch.from_numpy(np.asarray(cora.features, dtype=np.float32))
    for name in MODELS:
        torch.manual_seed(7)
        model = build_model(name, x.shape[1], 16, cora.num_classes, 2, norm=True).eval()
        got = model(x, [LayerGraph.from_csr(cora.indptr, cora.indices, cora.num_vertices)] * 2)
        want = dense_logits(name, model, cora.indptr, cora.indices, x)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5, msg=name)


def test_parameters_depend_only_on_the_seed():
    for name in MODELS:
        a, b, c = _model(name, 11), _model(name, 11), _model(name, 12)
        for (ka, pa), (kb, pb), (_, pc) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
            assert ka == kb and torch.equal(pa, pb)
        assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_widths_and_single_layer_models():
    for name in MODELS:
        model = _model(name, layers=1)
        indptr, indices, x = _graph(6)
        assert model(x, _whole(indptr, indices, model)).shape == (x.shape[0], 5)
        torch.testing.assert_close(model(x, _whole(indptr, indices, model)).double(),
                                   dense_logits(name, model, indptr, indices, x), atol=1e-5, rtol=1e-5)
    assert _model("sage", layers=3).conv_in_widths == [11, 9, 9]
    assert _model("ressage", layers=3).conv_in_widths == [9, 9, 9]


def test_bad_input_is_reported_clearly():
    with pytest.raises(ValueError, match=r"unknown model 'gatv9'; choose one of \('sage', 'gcn', 'ressage', 'gat'"):
        build_model("gatv9", 4, 8, 2, 2)
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        build_model("sage", 4, 8, 2, 0)
    with pytest.raises(ValueError, match="dropout must be in"):
        build_model("gcn", 4, 8, 2, 2, dropout=1.0)
    indptr, indices, x = _graph(7)
    model = _model("sage")
    graphs = _whole(indptr, indices, model)
    with pytest.raises(ValueError, match="3 message-passing layers but got 2 layer graphs"):
        model(x, graphs[:2])
    with pytest.raises(ValueError, match="gather must return cat"):
        model(x, graphs, gather=lambda l, h: h[:-1])
    with pytest.raises(ValueError, match="own rows but the layer graph has n_dst"):
        model(x[:10], graphs, gather=lambda l, h: h)
