"""The partial-payload plan (engine/partial.py) without MPI: the counts a receiving rank reads from its
layer plan, the per-server-pair choice, the refusals, and the layer runner's call over rows and partials
(nn/runner.py), blocking and with the rows in flight."""
from types import SimpleNamespace

import numpy as np
import pytest

from granndis_hpc.engine import partial
from granndis_hpc.nn.edge_layers import GINConv, SAGEMaxConv
from granndis_hpc.nn.layers import GCNConv, SAGEConv


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
    ({"mode": "flx"}, "--mode fb"),
    ({"row_dtype": "bf16"}, "--precision fp32"), ({"input_dropout": 0.1}, "--input-dropout"),
    ({"convs": [SAGEConv(4, 4), SAGEMaxConv(4, 4)]}, "SAGEMaxConv"), ({"convs": []}, "weighted sum")])
def test_refusals_say_what_and_how(change, words):
    assert _problem() is None and _problem("rows", mode="flx") is None
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

    def partials(m_own, kind):
        assert kind == "mean" and m_own.shape == (n_dst, 3)
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
