"""granndis_hpc/report/linkmodel.py: the overlap limit models what the run overlaps (summary.json's plan:
overlap, overlap_halos) and what cannot overlap (boundary rows before the post, halo edges after the
wait), from the per-layer counts of the epoch record.  Every number below is worked by hand."""
import pytest

from granndis_hpc.report import linkmodel
from granndis_hpc.report.linkmodel import layer_counts, overlap_limit, run_limit

BW = (1e7, 1e9)  # inter, intra bytes/s
GRAD = 500 / 1e7  # one leader's 500 gradient bytes between servers


def _layer(group, halo=200, send=100, rows=1000, edges=10_000, halo_edges=1_000):
    return {"group": group, "rows_computed": rows, "rows_held": rows + halo, "send_rows": send,
            "halo_rows": halo, "edges": edges, "halo_edges": halo_edges}


def _run(groups_per_layer, inter_halo_s=1.0, intra_bytes=0, model="sage", **layer):
    """A run whose busiest server sends inter_halo_s x 1e7 halo bytes plus 500 gradient bytes."""
    return {"layers": len(groups_per_layer), "model": model,
            "bytes": {"inter_grad": 1000, "intra_grad": 0, "inter_halo": 0, "intra_halo": 0},
            "inter_bytes_max_server": int(inter_halo_s * 1e7) + 500, "intra_bytes_max_rank": intra_bytes,
            "layer_counts": [_layer(g, **layer) for g in groups_per_layer]}


def test_fb_hides_each_exchange_behind_the_window_its_order_allows():
    """3 layers on the world view, compute 0.6 s: c = 0.1 s per layer and direction; s = 100 / 1000
    send rows, h = 1,000 / 10,000 halo edges.  The 1 s of halo wire splits over layers 1 and 2 by their
    halo rows (200 each), half forward and half backward: 0.25 s per exchange.
    layer 1: window = c0 (1 - s) + c1 (1 - h) s (layer 1 itself computes layer 2's send rows first)
                    = 0.09 + 0.009 = 0.099 -> exposed 2 x 0.151
    layer 2: window = c1 (1 - s) + c2 (1 - h) = 0.09 + 0.09 = 0.18      -> exposed 2 x 0.07"""
    run = _run(["world"] * 3)
    assert overlap_limit(run, 0.6, BW, 2, groups={"world"}) == pytest.approx(0.6 + 0.302 + 0.14 + GRAD)
    # Without overlap (or with only the server view overlapping) nothing hides: the additive C + W.
    for groups in (set(), {"server"}):
        assert overlap_limit(run, 0.6, BW, 2, groups=groups) == pytest.approx(0.6 + 1.0 + GRAD)
    # The run's own setting, as summary.json's plan gives it.
    assert overlap_limit(dict(run, overlap=True, overlap_halos=["world"]), 0.6, BW, 2) == \
        pytest.approx(0.6 + 0.302 + 0.14 + GRAD)
    assert overlap_limit(dict(run, overlap=False, overlap_halos=[]), 0.6, BW, 2) == pytest.approx(1.6 + GRAD)
    # Compute-bound: 0.1 s of halo wire (0.05 s per exchange) hides entirely.
    assert overlap_limit(_run(["world"] * 3, inter_halo_s=0.1), 0.6, BW, 2, groups={"world"}) == \
        pytest.approx(0.6 + GRAD)


def test_wire_splits_by_halo_rows_and_only_world_layers_carry_the_inter_bytes():
    """flx k = 1: layer 0 on the server view (static input halo), layers 1-2 on the world view.  Halo rows
    300 and 100: the 1 s of inter wire is 0.75 s and 0.25 s (0.375 s and 0.125 s per exchange); the 2 ms
    of intra wire (2e6 B at 1e9 B/s) splits over all exchanging layers by halo rows too: 1.5 ms and 0.5 ms
    (0.75 ms and 0.25 ms per exchange).  Windows as in the fb case (0.099 s and 0.18 s): layer 2's
    exchange hides entirely."""
    run = _run(["server", "world", "world"], intra_bytes=2_000_000)
    run["layer_counts"][1]["halo_rows"], run["layer_counts"][2]["halo_rows"] = 300, 100
    expected = 0.6 + 2 * (0.375 + 0.00075 - 0.099) + GRAD
    assert overlap_limit(run, 0.6, BW, 2, groups={"world"}) == pytest.approx(expected)


def test_server_view_exchanges_are_additive_under_the_default():
    """eas / flx k = L: every layer on the server view, no inter-server halo, 4 ms of intra wire (4e6 B at
    1e9 B/s: 1 ms per exchange, layers 1 and 2 forward and backward).  Default ('world'): the server
    exchanges block, all 4 ms add; 'all': each hides behind its window."""
    run = _run(["server"] * 3, inter_halo_s=0.0, intra_bytes=4_000_000)
    assert overlap_limit(run, 0.6, BW, 2, groups={"world"}) == pytest.approx(0.6 + 0.004 + GRAD)
    assert overlap_limit(run, 0.6, BW, 2, groups={"world", "server"}) == pytest.approx(0.6 + GRAD)


def test_ressage_exchanges_at_layer_0_and_posts_after_the_whole_layer():
    """ResSAGE: layer 0 exchanges too and no layer computes its send rows first, so the window is only
    the layer's own-edge share: c (1 - h) = 0.2 x 0.9 = 0.18 s (2 layers, compute 0.8 s: c = 0.2 s);
    1 s of wire over 2 layers, forward and backward: 0.25 s per exchange."""
    run = _run(["world"] * 2, model="ressage")
    assert overlap_limit(run, 0.8, BW, 2, groups={"world"}) == pytest.approx(0.8 + 4 * (0.25 - 0.18) + GRAD)


def test_the_limit_lies_between_the_bounds_and_needs_the_counts():
    """Never below max(C, W) nor above C + W (the windows are disjoint pieces of C); an overlapped run
    without per-layer counts (an older record) gets a clear error, a blocking one does not need them."""
    for inter in (0.01, 0.1, 0.5, 1.0, 5.0):
        limit = overlap_limit(_run(["world"] * 3, inter_halo_s=inter), 0.6, BW, 2, groups={"world"}) - GRAD
        assert max(0.6, inter) - 1e-12 <= limit <= 0.6 + inter + 1e-12
    old = dict(_run(["world"] * 3), layer_counts=None)
    with pytest.raises(ValueError, match="per-layer row and edge counts"):
        overlap_limit(old, 0.6, BW, 2, groups={"world"})
    assert overlap_limit(old, 0.6, BW, 2, groups=set()) == pytest.approx(1.6 + GRAD)


def test_layer_counts_sum_the_ranks_of_an_epoch_record():
    rank = {"rows_computed": [10, 8], "rows_held": [12, 11], "send_rows": [2, 3], "halo_rows": [2, 3],
            "edges": [40, 30], "halo_edges": [4, 6], "group": ["server", "world"]}
    rec = {"rows_per_layer": [dict(rank, rank=0), dict(rank, rank=1)]}
    assert layer_counts(rec) == [
        {"group": "server", "rows_computed": 20, "rows_held": 24, "send_rows": 4, "halo_rows": 4, "edges": 80,
         "halo_edges": 8},
        {"group": "world", "rows_computed": 16, "rows_held": 22, "send_rows": 6, "halo_rows": 6, "edges": 60,
         "halo_edges": 12}]
    assert layer_counts({"rows_per_layer": [{"rank": 0, "rows_computed": [1], "rows_held": [1]}]}) is None


def test_run_limit_reads_the_plan_of_summary_json():
    """`granndis report`'s path: the summary's plan says what overlapped (a plan without overlap_halos
    predates the option: every halo overlapped), the median record the counts and busiest bytes."""
    run = _run(["world"] * 3)
    per_rank = {k: [c[k] for c in run["layer_counts"]] for k in linkmodel.COUNT_KEYS + ("group",)}
    record = {"rows_per_layer": [dict(per_rank, rank=0)], "inter_bytes_per_server": [run["inter_bytes_max_server"], 0],
              "max_rank_bytes": {"intra_halo": 0, "intra_grad": 0}}
    summary = {"layers": 3, "model": "sage", "servers": 2, "bytes_per_epoch": run["bytes"],
               "seconds_per_epoch": {"compute": 0.5, "sampling": 0.1},
               "plan": {"overlap": True, "overlap_halos": ["world"]}}
    link = {"label": "x", "rate_bps": None, "bw_Bps": 1e7, "intra_Bps": 1e9}
    assert run_limit(summary, record, link) == pytest.approx(0.6 + 0.302 + 0.14 + GRAD)
    summary["plan"] = {"overlap": False, "overlap_halos": []}
    assert run_limit(summary, record, link) == pytest.approx(1.6 + GRAD)
    summary["plan"] = {"overlap": True}  # before --overlap-halos: all
    assert linkmodel.overlapped_groups(True, None) == {"server", "world"}
    assert run_limit(summary, record, link) == pytest.approx(0.6 + 0.302 + 0.14 + GRAD)


def _ranks(forward, backward, server, rest=None):
    """An epoch record's layer_compute_s: every rank's compute is its layers' plus `rest`."""
    rest = rest or [0.0] * len(server)
    return {"forward": forward, "backward": backward, "server": server,
            "compute": [sum(f) + sum(b) + x for f, b, x in zip(forward, backward, rest)]}


def test_per_rank_blocking_exchanges_wait_for_the_slowest_rank_of_every_layer():
    """fb --no-overlap on 2 ranks (one per server), wire 0.25 s per exchange (1 s over layers 1-2,
    forward and backward).  Forward c = [0.1, 0.2, 0.1] on A, [0.2, 0.1, 0.1] on B, the backward the
    same; both ranks compute 0.8 s, so the slowest rank's total gives 0.8 + 1.0.  Per rank:
      forward  layer 0: A 0.1, B 0.2; block 1: both 0.2 + 0.25 = 0.45; layer 1: A 0.65, B 0.55;
               block 2: 0.65 + 0.25 = 0.9; layer 2: 1.0
      backward layer 2: 1.1; block 2: 1.35; layer 1: A 1.55, B 1.45; block 1: 1.8; layer 0: A 1.9, B 2.0
    = 2.0: the per-layer slowest compute (0.2 + 0.2 + 0.1 forward, 0.1 + 0.2 + 0.2 backward) + the wire."""
    run = _run(["world"] * 3)
    ranks = _ranks([[0.1, 0.2, 0.1], [0.2, 0.1, 0.1]], [[0.1, 0.2, 0.1], [0.2, 0.1, 0.1]], [0, 1])
    assert overlap_limit(run, 0.8, BW, 2, groups=set()) == pytest.approx(1.8 + GRAD)
    assert overlap_limit(run, None, BW, 2, groups=set(), per_rank=ranks) == pytest.approx(2.0 + GRAD)
    # equal ranks: the one-rank model of the same compute
    same = _ranks([[0.1] * 3] * 2, [[0.1] * 3] * 2, [0, 1])
    assert overlap_limit(run, None, BW, 2, groups={"world"}, per_rank=same) == \
        pytest.approx(overlap_limit(run, 0.6, BW, 2, groups={"world"}))


def test_per_rank_server_exchanges_wait_only_within_the_server():
    """eas: 2 servers x 2 ranks, every layer on the server view, no wire.  Forward c: rank 0 [.1 .1 .1],
    rank 1 [.3 .1 .1], rank 2 [.1 .3 .1], rank 3 [.1 .1 .1]; backward 0.1 everywhere; rank 0 has 0.1 s of
    rest (loss, optimizer).  Forward: layer 0 -> (.1 .3 .1 .1); block 1 (per server) -> (.3 .3 .1 .1);
    layer 1 -> (.4 .4 .4 .2); block 2 -> .4 everywhere; layer 2 -> .5; rest -> (.6 .5 .5 .5).  Backward:
    server 0 .7, .8, .9 and server 1 .6, .7, .8 after layers 2, 1, 0; the gradient waits for all: 0.9
    (a world-wide maximum per layer would give 1.1: the servers do not wait for each other per layer)."""
    run = _run(["server"] * 3, inter_halo_s=0.0)
    ranks = _ranks([[.1, .1, .1], [.3, .1, .1], [.1, .3, .1], [.1, .1, .1]], [[.1] * 3] * 4, [0, 0, 1, 1],
                   rest=[0.1, 0, 0, 0])
    assert overlap_limit(run, None, BW, 2, groups={"world"}, per_rank=ranks) == pytest.approx(0.9 + GRAD)


def test_per_rank_overlapped_wait_ends_at_the_peers_post_plus_the_wire():
    """fb overlapped, 2 ranks, s = h = 0.1, wire 0.25 s per exchange; rank B's forward layer 0 takes 0.3 s
    (A 0.1), every other layer 0.1 s.  Forward: layer 0's send rows (0.1 of it) then post 1: A .01,
    B .03; rest of layer 0: A .1, B .3; layer 1's own part of its send rows (.09 x .1): A .109, B .309;
    wait 1 = max(own, last post .03 + .25): A .28, B .309; halo part .001, post 2: A .281, B .310; rest
    .09: A .371, B .400; layer 2 own part .09: A .461, B .490; wait 2 = .310 + .25 = .560; halo part:
    .570.  Backward, both ranks alike: layer 2's halo part .58 (post 2), own part .67, layer 1's rest
    .76, wait 2 = .58 + .25 = .83, .831 (post 1), .840, layer 0's rest .930, wait 1 = .831 + .25 = 1.081,
    its send rows' part: 1.091."""
    run = _run(["world"] * 3)
    ranks = _ranks([[.1, .1, .1], [.3, .1, .1]], [[.1] * 3] * 2, [0, 1])
    assert overlap_limit(run, None, BW, 2, groups={"world"}, per_rank=ranks) == pytest.approx(1.091 + GRAD)
    with pytest.raises(ValueError, match="does not have 3 layers"):
        overlap_limit(run, None, BW, 2, groups={"world"}, per_rank=_ranks([[.1, .1]], [[.1, .1]], [0]))


def test_run_limit_takes_every_ranks_compute_from_the_record_when_it_has_it():
    """The median record's layer_compute_s (engine/epoch.py) replaces the summary's compute: the blocking
    fb case above gives 2.0 s from the record against 1.8 s from the slowest rank's 0.8 s."""
    run = _run(["world"] * 3)
    per_rank = {k: [c[k] for c in run["layer_counts"]] for k in linkmodel.COUNT_KEYS + ("group",)}
    record = {"rows_per_layer": [dict(per_rank, rank=0)], "inter_bytes_per_server": [run["inter_bytes_max_server"], 0],
              "max_rank_bytes": {"intra_halo": 0, "intra_grad": 0},
              "layer_compute_s": _ranks([[0.1, 0.2, 0.1], [0.2, 0.1, 0.1]], [[0.1, 0.2, 0.1], [0.2, 0.1, 0.1]], [0, 1])}
    summary = {"layers": 3, "model": "sage", "servers": 2, "bytes_per_epoch": run["bytes"],
               "seconds_per_epoch": {"compute": 0.8, "sampling": 0.0}, "plan": {"overlap": False, "overlap_halos": []}}
    link = {"label": "x", "rate_bps": None, "bw_Bps": 1e7, "intra_Bps": 1e9}
    assert run_limit(summary, record, link) == pytest.approx(2.0 + GRAD)
    del record["layer_compute_s"]
    assert run_limit(summary, record, link) == pytest.approx(1.8 + GRAD)


def test_only_the_last_gradient_bucket_is_exposed_when_the_gradient_overlaps():
    """Buckets of 100, 300 and 100 bytes (posting order): the first two are posted while the backward
    still runs, so the limit charges only the last one's share of the gradient wire, 100 / 500 of GRAD;
    a --no-overlap run (or one from before the buckets: no plan entry) pays all of it."""
    run = dict(_run(["world"] * 3, inter_halo_s=0.1), overlap=True, overlap_halos=["world"])
    assert overlap_limit(run, 0.6, BW, 2) == pytest.approx(0.6 + GRAD)
    bucketed = dict(run, gradient_buckets_bytes=[100, 300, 100])
    assert overlap_limit(bucketed, 0.6, BW, 2) == pytest.approx(0.6 + GRAD / 5)
    assert overlap_limit(dict(bucketed, overlap=False, overlap_halos=[]), 0.6, BW, 2) == \
        pytest.approx(0.6 + 0.1 + GRAD)
