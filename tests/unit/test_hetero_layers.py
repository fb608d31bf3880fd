"""The relational layers (nn/hetero_layers.py) and models (nn/hetero_models.py) on a small random typed graph
(3 types, 6 relations, type-major ids): each layer equals PyG's (RGCNConv; HeteroConv of GATConvs without
self loops, summed) after copying the parameters, forward and gradients; the own/halo split the engine's
runner makes while the halo is in flight, and a permuted row order keyed by source_ids, equal the whole
graph; the models equal tests/hetero_reference.py's plain-torch logits."""
import numpy as np
import pytest
import torch

from granndis_hpc.nn.rows import PendingRows, RowSplit
from granndis_hpc.nn.runner import call_layer
from granndis_hpc.graph.csr import csr_rows
from granndis_hpc.nn import LayerGraph, build_model
from granndis_hpc.nn.hetero_layers import RGATConv, RGCNConv, TypeTables, relation_graphs
from granndis_hpc.registry import model_options
from tests.hetero_reference import edge_relations, random_typed_graph, reference_logits

pyg = pytest.importorskip("torch_geometric.nn")
IN, OUT = 5, 4


def _problem(seed=0):
    types, indptr, indices = random_typed_graph(seed)
    n = types.num_vertices
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, IN))).double()
    return types, indptr, indices, x


def _conv(kind, types, **kw):
    torch.manual_seed(1)
    R = types.num_relations
    conv = RGCNConv(IN, OUT, R, types=types, **kw) if kind == "rgcn" else RGATConv(IN, OUT, R, types=types, **kw)
    return conv.double()


def _pyg_twin(kind, conv, types, **kw):
    """The PyG layer with conv's parameters, and a function of x giving its output rows in global-id order."""
    if kind == "rgcn":
        twin = pyg.RGCNConv(IN, OUT, types.num_relations, num_bases=kw.get("num_bases")).double()
        twin.load_state_dict(conv.state_dict())
        return twin, lambda x, dst, src, rel: twin(x, torch.stack([src, dst]), rel)
    heads = kw.get("heads", 1)
    twin = pyg.HeteroConv({rel.key: pyg.GATConv(IN, OUT, heads=heads, add_self_loops=False)
                           for rel in types.relations}, aggr="sum").double()
    with torch.no_grad():
        for rel, ours in zip(types.relations, conv.rel):
            theirs = twin.convs[rel.key]
            theirs.lin.weight.copy_(ours.lin.weight)
            theirs.att_src.copy_(ours.att_src.view(1, heads, OUT))
            theirs.att_dst.copy_(ours.att_dst.view(1, heads, OUT))
            theirs.bias.copy_(ours.bias)

    def run(x, dst, src, rel):
        xs = {name: x[slice(*types.id_range(name))] for name in types.names}
        edges = {}
        for r, relation in enumerate(types.relations):
            e = rel == r
            edges[relation.key] = torch.stack([src[e] - types.id_range(relation.src)[0],
                                               dst[e] - types.id_range(relation.dst)[0]])
        out = twin(xs, edges)
        return torch.cat([out[name] for name in types.names])
    return twin, run


CASES = [("rgcn", {}), ("rgcn", {"num_bases": 2}), ("rgat", {"heads": 2})]


@pytest.mark.parametrize("kind,kw", CASES)
def test_layer_equals_pyg_forward_and_gradients(kind, kw):
    types, indptr, indices, x = _problem()
    conv = _conv(kind, types, **kw)
    twin, run = _pyg_twin(kind, conv, types, **kw)
    assert types.destination_relations() and all(types.destination_relations())  # every type gets an output
    graph = LayerGraph.from_csr(indptr, indices, types.num_vertices)
    ours_x, their_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = conv(ours_x, graph)
    theirs = run(their_x, *edge_relations(types, indptr, indices))
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)
    weight = torch.linspace(-1, 1, ours.numel(), dtype=ours.dtype).view_as(ours)
    (ours * weight).sum().backward()
    (theirs * weight).sum().backward()
    torch.testing.assert_close(ours_x.grad, their_x.grad, atol=1e-10, rtol=1e-10)
    our_grads = [p.grad for p in conv.parameters()]
    their_grads = [p.grad for p in twin.parameters()]
    if kind == "rgat":  # PyG's attention vectors are [1, H, C]
        their_grads = [g.view_as(o) for g, o in zip(their_grads, our_grads)]
    for a, b in zip(our_grads, their_grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_rgcn_loads_a_pyg_state_dict_and_initialises_as_pyg():
    types, *_ = _problem()
    twin = pyg.RGCNConv(IN, OUT, types.num_relations, num_bases=3)
    conv = RGCNConv(IN, OUT, types.num_relations, 3, types=types)
    assert {k: v.shape for k, v in conv.state_dict().items()} == {k: v.shape for k, v in twin.state_dict().items()}
    conv.load_state_dict(twin.state_dict())
    assert float(conv.bias.detach().abs().sum()) == 0
    assert float(conv.root.detach().abs().max()) <= (6 / (IN + OUT)) ** 0.5


def _rank(indptr, indices, own, degree):
    """A rank's layer graph over its own rows (in the given order) and their halo, keyed by source_ids."""
    _, sources = csr_rows(indptr, indices, own)
    halo = np.setdiff1d(sources, own)
    rows = np.concatenate([own, halo])
    local = np.full(len(indptr) - 1, -1, dtype=np.int64)
    local[rows] = np.arange(rows.shape[0])
    sub_indptr, sub_sources = csr_rows(indptr, indices, own)
    graph = LayerGraph(own.shape[0], rows.shape[0], sub_indptr, local[sub_sources], degree[own], degree[rows],
                       n_own=own.shape[0])
    graph.source_ids = torch.from_numpy(rows)
    return graph, halo


@pytest.mark.parametrize("kind,kw", CASES)
def test_split_sources_and_permuted_rows_equal_the_whole_graph(kind, kw):
    types, indptr, indices, x = _problem(3)
    conv = _conv(kind, types, **kw)
    n = types.num_vertices
    whole = conv(x, LayerGraph.from_csr(indptr, indices, n))
    degree = np.diff(indptr).astype(np.float32)
    rng = np.random.default_rng(4)

    # Every row, permuted: source_ids carry the types and relations.
    order = rng.permutation(n)
    graph, halo = _rank(indptr, indices, order, degree)
    assert halo.size == 0
    torch.testing.assert_close(conv(x[torch.from_numpy(order)], graph), whole[torch.from_numpy(order)])

    # A rank's subset with the halo in flight: own part, then the halo part, combined.
    own = rng.permutation(n)[: n // 2]
    graph, halo = _rank(indptr, indices, own, degree)
    assert halo.size and bool((graph.indices >= graph.n_dst).any())
    h = x.clone().requires_grad_(True)
    waits = []
    pending = PendingRows(h[torch.from_numpy(own)], lambda: waits.append(1) or h[torch.from_numpy(halo)], halo.size)
    got = call_layer(conv, pending, graph)
    assert waits == [1]
    torch.testing.assert_close(got, whole[torch.from_numpy(own)])
    weight = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).view_as(got)
    (got * weight).sum().backward()
    want = x.clone().requires_grad_(True)
    (conv(want, LayerGraph.from_csr(indptr, indices, n))[torch.from_numpy(own)] * weight).sum().backward()
    torch.testing.assert_close(h.grad, want.grad)

    if conv.splits_rows:  # boundary-first: the first rows, then the rest, own and halo parts each
        split = RowSplit(torch.tensor([0, 3, 5]), graph.n_dst)
        pending = PendingRows(x[torch.from_numpy(own)], lambda: x[torch.from_numpy(halo)], halo.size)
        torch.testing.assert_close(call_layer(conv, pending, graph, split=split).merge(), whole[torch.from_numpy(own)])


def test_relation_graphs_split_the_edges_and_count_in_degrees_per_relation():
    types, indptr, indices, _ = _problem(5)
    graph = LayerGraph.from_csr(indptr, indices, types.num_vertices)
    tables = TypeTables(types)
    views = relation_graphs(graph, tables)
    assert relation_graphs(graph, TypeTables(types)) is views  # cached with the graph
    dst, src, rel = edge_relations(types, indptr, indices)
    assert torch.equal(views.edge_relation, rel)
    assert sum(g.nnz for g in views.graphs) == graph.nnz
    for r, g in enumerate(views.graphs):
        assert torch.equal(g.indices, src[rel == r]) and torch.equal(g.edge_rows(), dst[rel == r])
        want = torch.bincount(dst[rel == r], minlength=graph.n_dst).float()
        assert torch.equal(g.dst_degree, want)
    assert torch.equal(views.dst_type, torch.from_numpy(types.vertex_type(np.arange(types.num_vertices))))


@pytest.mark.parametrize("name,options,linear_layers,norm", [
    ("rgcn", {}, 0, False), ("rgcn", {"num_bases": 2}, 1, True), ("rgat", {"heads": 2}, 0, False),
    ("rgat", {"heads": 2, "out_heads": 2}, 1, True)])
def test_model_equals_the_plain_torch_reference(name, options, linear_layers, norm):
    types, indptr, indices, x = _problem(6)
    torch.manual_seed(0)
    model = build_model(name, IN, 3, 4, 3, dropout=0.5, norm=norm, linear_layers=linear_layers, types=types,
                        **options).double().eval()
    assert model.contract.source_ids == "all" and model.num_layers == 3 - linear_layers
    graphs = [LayerGraph.from_csr(indptr, indices, types.num_vertices)] * model.num_layers
    got = model(x, graphs)
    want = reference_logits(model.state_dict(), types, indptr, indices, x, 3, name, linear_layers, norm)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_typed_models_need_types_and_parse_their_options():
    with pytest.raises(ValueError, match=r"model 'rgcn' needs a heterogeneous shard set \(vertex and edge types\); "
                                         r"build one from a heterogeneous source \(docs/heterogeneous.md\)"):
        build_model("rgcn", IN, 3, 4, 2)
    types, *_ = _problem()
    torch.manual_seed(0)
    assert build_model("sage", IN, 3, 4, 2, types=types).name == "sage"  # an untyped model ignores them
    assert model_options("rgcn", ["num_bases=3"]) == {"num_bases": 3, "embed": "", "project": 0}
    assert model_options("rgat", ["heads=2", "attn_dropout=0.3"]) == {"heads": 2, "out_heads": 1, "attn_dropout": 0.3,
                                                                  "embed": "", "project": 0}
    with pytest.raises(ValueError, match=r"num_bases must be of type int >= 0"):
        model_options("rgcn", ["num_bases=-1"])
    with pytest.raises(ValueError, match="num_relations=2 but the types have 6"):
        RGCNConv(IN, OUT, 2, types=types)


@pytest.mark.parametrize("name,options", [("rgcn", {"num_bases": 0}), ("rgcn", {"num_bases": 2}),
                                          ("rgat", {"heads": 2})])
def test_memory_estimate_counts_the_parameters(name, options):
    from granndis_hpc import memory_model as mm

    types, *_ = _problem()
    torch.manual_seed(0)
    model = build_model(name, IN, 8, 4, 3, norm=True, linear_layers=1, types=types, **options)
    spec = mm.ModelSpec(name, IN, 8, 4, 2, norm=True, options=options, linear_layers=1,
                        relations=types.num_relations)
    assert spec.parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,options", [("rgcn", {"num_bases": 2}), ("rgat", {"heads": 2, "attn_dropout": 0.5})])
def test_model_on_a_rank_subset_with_dropout_equals_the_whole_graph(name, options):
    """A rank's rows (unsorted) and halo, the halo in flight at layer 1, feature and attention dropout keyed
    by global ids (source_ids): the rank's logits are the whole graph's."""
    from granndis_hpc.nn import RowDropout

    types, indptr, indices, x = _problem(7)
    n = types.num_vertices
    torch.manual_seed(0)
    model = build_model(name, IN, 3, 4, 2, dropout=0.3, types=types, **options).double().train()
    recorded = {}
    whole = model(x, [LayerGraph.from_csr(indptr, indices, n)] * 2,
                  gather=lambda l, h: recorded.setdefault(l, h.detach()), dropout=RowDropout(11, 3))
    own = np.random.default_rng(8).permutation(n)[: n // 2]
    graph, halo = _rank(indptr, indices, own, np.diff(indptr).astype(np.float32))

    def gather(l, h):
        rows = recorded[l][torch.from_numpy(halo)]
        return torch.cat([h, rows]) if l == 0 else PendingRows(h, lambda: rows, rows.shape[0])
    got = model(x[torch.from_numpy(own)], [graph] * 2, gather=gather, dropout=RowDropout(11, 3, torch.from_numpy(own)))
    torch.testing.assert_close(got, whole[torch.from_numpy(own)])
    assert not torch.allclose(whole, model(x, [LayerGraph.from_csr(indptr, indices, n)] * 2, dropout=RowDropout(11, 4)))


@pytest.mark.parametrize("name,options", [("rgcn", {"num_bases": 2}), ("rgat", {"heads": 2})])
def test_memory_estimate_grows_with_the_relations(name, options):
    from granndis_hpc import memory_model as mm
    from tests.unit.test_memory_model import _random_plan

    rows, _, _ = _random_plan(np.random.default_rng(5), 3, features=16)
    total = {r: mm.estimate(rows, mm.ModelSpec(name, 16, 8, 5, 3, options=options, relations=r))["total"]
             for r in (2, 6)}
    assert 0 < total[2] < total[6]
    assert mm.estimate(rows, mm.ModelSpec(name, 16, 8, 5, 3, options=options))["total"] > total[6]  # 8 assumed


def test_embedded_types_replace_their_input_rows():
    """Option embed: the embedded types' rows are their tables' rows (the plain-torch reference agrees), on
    rows in any order (looked up by their global ids), and an unknown type is refused."""
    from tests.hetero_graphs import typed_graph
    from tests.hetero_reference import reference_logits

    g = typed_graph()
    torch.manual_seed(0)
    model = build_model("rgcn", g.num_features, 8, g.num_classes, 2, dropout=0.0, types=g.types,
                        embed="author, field").eval()
    assert {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("embeddings.")} == \
        {"embeddings.author": (90, 16), "embeddings.field": (12, 16)}
    graph = LayerGraph.from_csr(g.indptr, g.indices, g.num_vertices)
    x = torch.from_numpy(g.features)
    want = reference_logits(model.state_dict(), g.types, g.indptr, g.indices, g.features, 2)
    assert torch.allclose(model(x, [graph, graph]).double(), want, atol=1e-5)
    ids = torch.randperm(g.num_vertices)
    graph.source_ids = ids  # the rows in another order: each row's embedding follows its id
    assert torch.equal(model.embedded(x[ids], graph)[ids.argsort()], model.embedded(x, LayerGraph.from_csr(
        g.indptr, g.indices, g.num_vertices)))
    with pytest.raises(ValueError, match="'venue' is not a vertex type"):
        build_model("rgcn", g.num_features, 8, g.num_classes, 2, types=g.types, embed="venue")


@pytest.mark.parametrize("name,dropout,options", [("rgcn", 0.0, {}), ("rgcn", 0.5, {}), ("rgat", 0.0, {"heads": 2}),
                                                  ("rgat", 0.5, {"heads": 2, "attn_dropout": 0.3})])
def test_rgcn_and_rgat_estimates_are_close_to_the_bytes_autograd_saves(name, dropout, options):
    """The memory model's R-GCN and R-GAT counts (each relation's mean, or projection and attention sums,
    over its own type's rows, relations_per_vertex of them per row) against the tensors a step saves,
    whole graph in one process: within 20 % (the per-relation rows are counted from the type shares,
    not per row)."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.engine.epoch import SavedBytes
    from tests.hetero_graphs import typed_graph

    g, layers = typed_graph(), 3
    n = g.num_vertices
    graph = LayerGraph.from_csr(g.indptr, g.indices, n)
    lr = mm.LayerRows(n_own_in=n, n_halo=0, n_dst=n, nnz=g.num_edges, n_send=0)
    view = mm.ViewRows("server", n, 0, 0, (lr,) * layers)
    rows = mm.RankRows(rank=0, features=g.num_features, num_classes=g.num_classes, n_inner=n, n_train=n // 2,
                       layers=layers, k=layers, world=mm.ViewRows("world", n, 0, 0, (lr,) * layers), server=view)
    torch.manual_seed(0)
    options = model_options(name, [f"{k}={v}" for k, v in options.items()])
    model = build_model(name, g.num_features, 16, g.num_classes, layers, dropout=dropout, types=g.types, **options)
    saved = SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        logits = model(torch.from_numpy(g.features), [graph] * layers)
        labels = torch.from_numpy(np.maximum(g.labels, 0))
        loss = torch.nn.functional.cross_entropy(logits[: n // 2], labels[: n // 2], reduction="sum") / 7.0
    loss.backward()
    spec = mm.ModelSpec(name, g.num_features, 16, g.num_classes, layers, dropout, relations=g.types.num_relations,
                        relation_rows=g.types.relations_per_vertex(), options=options)
    estimate = mm.activation_layers(rows, spec, device="cpu")["saved"]
    assert 0.8 < estimate / saved.total < 1.2, (estimate, saved.total)
