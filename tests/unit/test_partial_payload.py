"""The partial-payload plan (engine/partial.py) without MPI: the counts a receiving rank reads from its
layer plan, the per-server-pair choice, and the refusals."""
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
                input_dropout=0.0, convs=[SAGEConv(4, 4), GCNConv(4, 2), GINConv(2, 2)], attn_dropout=0.0)
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
