"""The partial-payload plan (engine/partial.py) without MPI: the counts a receiving rank reads from its
layer plan, the per-server-pair choice, the refusals, and the layer runner's call over rows and partials
(nn/runner.py), blocking and with the rows in flight."""
from types import SimpleNamespace

import numpy as np
import pytest

from granndis_hpc.engine import partial
from granndis_hpc.graph.hetero import GraphTypes, Relation
from granndis_hpc.nn.hetero_layers import RGATConv, RGCNConv
from granndis_hpc.nn.edge_layers import GINConv, SAGEMaxConv
from granndis_hpc.nn.layers import GCNConv, SAGEConv


# Two vertex types (ids 0-6 and 7-12) and three relations.
TYPES = GraphTypes(("a", "b"), (0, 7, 13), (Relation("a", "x", "a"), Relation("b", "y", "a"), Relation("a", "z", "b")),
                   "a")


def test_receiver_counts_are_distinct_rows_and_distinct_destinations():
    # 3 destination rows, 2 own source rows; halo: 2 rows from peer 1, 3 from peer 2 (columns 2..6).
    indptr = np.array([0, 3, 5, 8])
    indices = np.array([0, 2, 4, 2, 3, 4, 5, 6])  # row 0 <- 2 (p1), 4 (p2); row 1 <- 2, 3 (p1); row 2 <- 4, 5, 6 (p2)
    lp = SimpleNamespace(n_dst=3, n_own_in=2, indptr=indptr, indices=indices, recv_counts=np.array([0, 2, 3]))
    rows, partials = partial.receiver_counts(lp)
    assert rows.tolist() == [0, 2, 3]
    assert partials.tolist() == [0, 2, 2]  # peer 1 reaches rows 0, 1; peer 2 rows 0, 2


def test_choice_per_server_pair_and_layer():
    server = [0, 0, 1, 1]
    rows = np.zeros((4, 4), np.int64)  # [receiver, sender]
    partials = np.zeros((4, 4), np.int64)
    rows[2, 0], partials[2, 0] = 10, 4  # server 0 -> 1: 10 rows or 4 partials
    rows[0, 2], partials[0, 2] = 3, 5  # server 1 -> 0: 3 rows or 5 partials
    rows[1, 0], partials[1, 0] = 1, 1  # within server 0: always rows
    widths_in, widths_msg, static = [100, 16, 16], [16, 16, 7], [True, False, False]
    for payload in ("rows", "partial", "smaller"):
        use = partial.choose(payload, rows, partials, server, widths_in, widths_msg, static)
        assert not use[0].any()  # layer 0: its rows were exchanged at set-up
        assert not use[1][0, 1] and not use[2][0, 1]  # same server
        if payload == "rows":
            assert not any(u.any() for u in use)
        if payload == "partial":
            assert use[1][0, 2] and use[1][2, 0] and use[1][0, 3] and use[2][2, 0]
    use = partial.choose("smaller", rows, partials, server, widths_in, widths_msg, static)
    assert use[1][0, 2] and not use[1][2, 0]  # 4 x 16 < 10 x 16; 5 x 16 > 3 x 16
    assert use[2][0, 2] and use[2][2, 0]  # 4 x 7 < 10 x 16; 5 x 7 < 3 x 16
    inter = np.array(server)[:, None] != np.array(server)[None, :]
    assert partial.pair_bytes(rows, partials, use[1], 16, 16, inter) == (4 * 16 + 3 * 16) * 4
    # On the per-server route server 0 sends server 1 two rows (ranks 2 and 3 read the same ones), so
    # rows (2 x 16) beat partials (4 x 16) there.
    once = np.zeros((4, 2), np.int64)  # [sender, receiving server]
    once[0, 1], once[2, 0] = 2, 3
    use = partial.choose("smaller", rows, partials, server, widths_in, widths_msg, static, once)
    assert not use[1][0, 2] and not use[1][2, 0] and use[2][2, 0]


def _problem(payload="partial", **kw):
    args = dict(mode="fb", row_dtype=None,
                input_dropout=0.0, convs=[SAGEConv(4, 4), GCNConv(4, 2), GINConv(2, 2)])
    args.update(kw)
    return partial.problem(payload, **args)


@pytest.mark.parametrize("change,words", [
    ({"mode": "eas"}, "--mode fb"), ({"mode": "flx", "world_layers": [False] * 3}, "--preloaded-layers below"),
    ({"row_dtype": "bf16"}, "--precision fp32"), ({"input_dropout": 0.1}, "--input-dropout"),
    ({"convs": [SAGEConv(4, 4), SAGEMaxConv(4, 4)]}, "SAGEMaxConv"), ({"convs": []}, "weighted sum"),
    ({"convs": [RGATConv(4, 4, 3, types=TYPES)]}, "RGATConv")])
def test_refusals_say_what_and_how(change, words):
    assert _problem() is None and _problem("rows", mode="flx") is None
    assert _problem(convs=[RGCNConv(4, 4, 3, types=TYPES)]) is None
    assert _problem(mode="flx", world_layers=[False, True, True]) is None
    why = _problem(**change)
    assert why is not None and words in why and "--halo-payload rows" in why


@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_layer_over_rows_and_partials_equals_the_dense_layer(pending, split):
    """nn/runner.py's partial call: own rows, 4 halo rows sent as rows (in flight or not) and 3 rows of
    another peer sent as partial aggregates give GraphSAGE's mean over all 13 rows, computed densely here;
    over a RowSplit its two groups of rows.  The wait for the partials comes after the own edges' part."""
    import torch

    from granndis_hpc.nn.graph import LayerGraph
    from granndis_hpc.nn.rows import PartialSources, PendingRows, RowSplit
    from granndis_hpc.nn.runner import call_layer

    torch.manual_seed(0)
    n_dst, n_rows, n_src = 6, 10, 13  # sources: 6 own, 4 halo rows, 3 rows whose peer sends partials
    adj = (torch.rand(n_dst, n_src) < 0.45).float()
    adj[:, 0] = 1.0  # every row has an in-edge
    deg = adj.sum(1)
    h = torch.randn(n_src, 5)
    conv = SAGEConv(5, 3)  # narrowing: messages are lin_neigh(h), 3 wide, on every path
    with torch.no_grad():
        want = conv.lin_self(h[:n_dst]) + conv.lin_neigh(adj @ h / deg[:, None])
    kept = adj[:, :n_rows]
    rows, cols = kept.nonzero(as_tuple=True)
    graph = LayerGraph(n_dst, n_rows, torch.cat([torch.zeros(1, dtype=torch.int64), kept.sum(1).long().cumsum(0)]),
                       cols, deg, torch.ones(n_rows), None, n_own=n_dst)
    order = []

    def partials(m_own, layer):
        assert layer.weighted_sum == "mean" and m_own.shape == (n_dst, 3)
        order.append("posted")

        def wait():
            order.append("waited")
            return (adj[:, n_rows:] @ conv.lin_neigh(h[n_rows:])) / deg[:, None]
        return wait

    def halo():
        order.append("halo")
        return h[n_dst:n_rows]
    src = PendingRows(h[:n_dst], halo, n_rows - n_dst) if pending else h[:n_rows]
    row_split = RowSplit(torch.tensor([1, 4]), n_dst) if split else None
    with torch.no_grad():
        out = call_layer(conv, PartialSources(src, graph, partials), graph, split=row_split)
        got = out.merge() if split else out
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert order == (["posted", "halo", "waited"] if pending else ["posted", "waited"])


@pytest.mark.parametrize("pending", [False, True])
def test_rgcn_over_rows_and_projected_partials_equals_the_dense_layer(pending):
    """R-GCN (a RELATION_MEAN weighted sum): own rows, 4 halo rows sent as rows and 3 rows of another
    peer sent as one projected partial row per destination row (sum_r of their relation means times W_r)
    give the relation means over all 13 rows, computed densely here per relation; the graph without the
    partials' edges keeps the whole graph's relation degrees (degrees_from)."""
    import torch

    from granndis_hpc.nn.graph import LayerGraph
    from granndis_hpc.nn.rows import PartialSources, PendingRows
    from granndis_hpc.nn.runner import call_layer

    torch.manual_seed(1)
    n_dst, n_rows, n_src = 6, 10, 13
    ids = torch.tensor([0, 8, 3, 9, 5, 1, 7, 2, 10, 4, 11, 6, 12])  # both types among every group of rows
    kind = (ids >= 7).long()
    relation = torch.tensor([[0, 2], [1, -1]])[kind[None, :], kind[:n_dst, None]]  # [dst, src] (-1: none)
    adj = (torch.rand(n_dst, n_src) < 0.6) & (relation >= 0)
    adj[:, n_rows:] |= relation[:, n_rows:] >= 0  # the partials' peer reaches every row it can
    conv = RGCNConv(5, 3, 3, num_bases=2, types=TYPES)
    h = torch.randn(n_src, 5)
    with torch.no_grad():
        weights = conv.relation_weights()
        want = h[:n_dst] @ conv.root + conv.bias
        for r in range(3):
            a = (adj & (relation == r)).float()
            want += (a @ h / a.sum(1, keepdim=True).clamp(min=1)) @ weights[r]

    def csr(a):
        rows, cols = a.nonzero(as_tuple=True)
        return torch.cat([torch.zeros(1, dtype=torch.int64), a.sum(1).long().cumsum(0)]), cols

    indptr, cols = csr(adj)
    full = LayerGraph(n_dst, n_src, indptr, cols, adj.sum(1).float(), torch.ones(n_src), None, n_own=n_dst)
    full.source_ids = ids
    indptr, cols = csr(adj[:, :n_rows])
    graph = LayerGraph(n_dst, n_rows, indptr, cols, full.dst_degree, torch.ones(n_rows), None, n_own=n_dst,
                       degrees_from=full)
    graph.source_ids = ids[:n_rows]

    def partials(m_own, layer):
        assert layer is conv and m_own.shape == (n_dst, 5)

        def wait():  # what the other peer sends: its rows' relation sums with the coefficients, projected
            rel, coefficient = layer.relation_edges(full)
            rows = full.edge_rows()
            far = full.indices >= n_rows
            sums = []
            for r in range(3):
                e = far & (rel == r)
                a = torch.zeros(n_dst, n_src - n_rows)
                a[rows[e], full.indices[e] - n_rows] = coefficient[e]
                sums.append(a @ h[n_rows:])
            return layer.project_partials(sums, [torch.arange(n_dst)] * 3, n_dst)
        return wait

    src = PendingRows(h[:n_dst], lambda: h[n_dst:n_rows], n_rows - n_dst) if pending else h[:n_rows]
    with torch.no_grad():
        got = call_layer(conv, PartialSources(src, graph, partials), graph)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
