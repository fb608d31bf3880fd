"""Stacks of torch_geometric convolutions for the `pyg` and `pyg-hetero` models' tests (--model pyg
--model-option module=tests.pyg_factories --model-option factory=NAME), and the plain PyG forward passes
over a whole graph that the tests compare the runner with (HeteroConv for pyg-hetero)."""
import importlib.util

import numpy as np
import torch
from torch import nn

# Options of a `pyg` model for tests that build every registered model; empty without torch_geometric.
PYG_OPTIONS = {"module": "tests.pyg_factories",
               "factory": "gatv2"} if importlib.util.find_spec("torch_geometric") else {}
PYG_HETERO_OPTIONS = dict(PYG_OPTIONS, factory="hetero_sage") if PYG_OPTIONS else {}


def attention(in_features, hidden, out_features, layers):
    """SAGEConv -> GATConv (2 heads, concatenated) -> TransformerConv (the output)."""
    from torch_geometric.nn import GATConv, SAGEConv, TransformerConv
    assert layers == 3
    return [SAGEConv(in_features, hidden), GATConv(hidden, hidden // 2, heads=2),
            TransformerConv(hidden, out_features)]


def sums(in_features, hidden, out_features, layers):
    """GCNConv(normalize=False: the runner gives the global degrees' edge weights) -> GINConv (an MLP)
    -> GraphConv (the output)."""
    from torch_geometric.nn import GCNConv, GINConv, GraphConv
    assert layers == 3
    mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
    return [GCNConv(in_features, hidden, normalize=False), GINConv(mlp, train_eps=True),
            GraphConv(hidden, out_features)]


def gatv2(in_features, hidden, out_features, layers):
    """GATv2Conv layers (2 heads averaged into each output)."""
    from torch_geometric.nn import GATv2Conv
    widths = [in_features] + [hidden] * (layers - 1) + [out_features]
    return [GATv2Conv(widths[l], widths[l + 1], heads=2, concat=False) for l in range(layers)]


def normalized_gcn(in_features, hidden, out_features, layers):
    """GCNConv with its default normalize=True: refused (it would take degrees from each rank's block)."""
    from torch_geometric.nn import GCNConv
    widths = [in_features] + [hidden] * (layers - 1) + [out_features]
    return [GCNConv(widths[l], widths[l + 1]) for l in range(layers)]


def plain_pyg_logits(model, x, edge_index):
    """The model's convs as a user runs them with PyG on the whole graph: conv -> ReLU -> conv ...,
    GCNConv(normalize=False) as PyG's normalize=True GCNConv (global degrees, add_remaining_self_loops)."""
    from torch_geometric.nn import GCNConv
    h = x
    for l, layer in enumerate(model.convs):
        conv = layer.conv
        if l:
            h = torch.relu(h)
        if isinstance(conv, GCNConv):
            conv.normalize = conv.add_self_loops = True
            try:
                h = conv(h, edge_index)
            finally:
                conv.normalize = conv.add_self_loops = False
        else:
            h = conv(h, edge_index)
    return h


def _widths(in_features, hidden, out_features, layers):
    return [in_features] + [hidden] * (layers - 1) + [out_features]


def hetero_sage(in_features, hidden, out_features, layers):
    """SAGEConv layers (--model pyg-hetero: one copy per relation)."""
    from torch_geometric.nn import SAGEConv
    w = _widths(in_features, hidden, out_features, layers)
    return [SAGEConv(w[l], w[l + 1]) for l in range(layers)]


def hetero_gat(in_features, hidden, out_features, layers):
    """GATConv layers without self loops (2 heads: concatenated, the last averaged), as PyG's
    heterogeneous examples write them."""
    from torch_geometric.nn import GATConv
    w = _widths(in_features, hidden, out_features, layers)
    return [GATConv(w[l], w[l + 1] // (1 if l == layers - 1 else 2), heads=2, concat=l < layers - 1,
                    add_self_loops=False) for l in range(layers)]


def hetero_graph(in_features, hidden, out_features, layers):
    """GraphConv layers (a sum over in-edges and a root weight)."""
    from torch_geometric.nn import GraphConv
    w = _widths(in_features, hidden, out_features, layers)
    return [GraphConv(w[l], w[l + 1]) for l in range(layers)]


def hetero_mixed(in_features, hidden, out_features, layers):
    """SAGEConv -> GraphConv -> GATConv(add_self_loops=False): a different conv in every layer."""
    from torch_geometric.nn import GATConv, GraphConv, SAGEConv
    assert layers == 3
    return [SAGEConv(in_features, hidden), GraphConv(hidden, hidden),
            GATConv(hidden, out_features, heads=2, concat=False, add_self_loops=False)]


def hetero_cheb(in_features, hidden, out_features, layers):
    """ChebConv (K=2): refused, it propagates over two hops in one layer."""
    from torch_geometric.nn import ChebConv
    w = _widths(in_features, hidden, out_features, layers)
    return [ChebConv(w[l], w[l + 1], K=2) for l in range(layers)]


def pyg_inputs(types, indptr, indices, x):
    """x_dict and edge_index_dict as a PyG user holds them: per type its rows, per relation its edges with
    each end's id local to its type; each edge's relation read from the type id ranges."""
    offsets = np.asarray(types.offsets)
    dst = np.repeat(np.arange(types.num_vertices), np.diff(indptr))
    src_t = np.searchsorted(offsets, indices, side="right") - 1
    dst_t = np.searchsorted(offsets, dst, side="right") - 1
    x_dict = {name: x[offsets[t]: offsets[t + 1]] for t, name in enumerate(types.names)}
    edges = {}
    for rel in types.relations:
        s, d = types.names.index(rel.src), types.names.index(rel.dst)
        e = (src_t == s) & (dst_t == d)
        edges[rel.key] = torch.from_numpy(np.stack([indices[e] - offsets[s], dst[e] - offsets[d]]))
    return x_dict, edges


def heteroconv_logits(model, types, indptr, indices, x):
    """A `pyg-hetero` model's convs as PyG's HeteroConv runs them (ReLU between layers), rows in global-id
    order; a type HeteroConv gives no output gets zeros."""
    from torch_geometric.nn import HeteroConv
    h, edges = pyg_inputs(types, indptr, indices, x)
    for l, layer in enumerate(model.convs):
        if l:
            h = {k: torch.relu(v) for k, v in h.items()}
        hetero = HeteroConv({rel.key: layer.rel[r].conv for r, rel in enumerate(types.relations)}, aggr="sum")
        out = hetero(h, edges)
        width = next(iter(out.values())).shape[1]
        h = {name: out.get(name, x.new_zeros(types.count(name), width)) for name in types.names}
    return torch.cat([h[name] for name in types.names])
