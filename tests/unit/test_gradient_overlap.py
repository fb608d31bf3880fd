"""The gradient's overlap with the backward in the epoch-time model (memory_model/epoch_time.py), checked
by hand: an overlapped run's gradient bytes on the link between servers hide behind the backward's
compute up to its duration, except the bucket the backward finishes last, a blocking run's are charged
whole; and `preprocess plan --inter-both-rate`
prices exactly the bytes that cross both ways at once."""
import dataclasses
import types

import pytest

import granndis_hpc.memory_model as mm
from granndis_hpc.memory_model import choice
from granndis_hpc.memory_model.epoch_time import Rates, last_bucket_share, predict, seconds, work
from tests.unit.test_epoch_time import _rank, _uneven

OVERLAPPED = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=2)  # the default: overlap on
BLOCKING = dataclasses.replace(OVERLAPPED, overlap=())  # --no-overlap
# SAGE's layer 0 reads the 8 input features with two [16, 8] weights: that share of the gradient is in the
# bucket the backward finishes last, and nothing hides it
LAST = 2 * 8 * 16 / OVERLAPPED.parameters()
FB = [_rank(0, 3), _rank(1, 3), _rank(2, 3), _rank(3, 4)]  # 2 servers x 2 GPUs


def _by_hand(rates: Rates, spec: mm.ModelSpec):
    """fb's terms on FB, counted here: (compute, backward, halo's inter-server seconds, gradient's)."""
    # per rank: layer 0 projects 2 x 10 rows at 8 x 16 over 30 edges x 8, layer 1 (narrowing: its 10 + 6
    # source rows first) 10 + 16 at 16 x 4 over 40 x 16; the ranks are alike, so the slowest rank's segments
    # add up to one rank's layers
    rows, edges = 20 * 8 * 16 + 26 * 16 * 4, 30 * 8 + 40 * 16
    compute = rates.compute_scale * (rows * rates.row_s + edges * rates.edge_s)
    backward = rates.compute_scale * (rows * rates.row_s * 2 / 3 + edges * rates.edge_s / 2)
    # layer 1's halo, 16 floats a row forward and backward: server 0 sends 2 x 3 rows (768 bytes) and
    # receives server 1's 3 + 4 (896); each server's gradient share 2 (S - 1) P x 4 / S crosses both ways
    both = rates.inter_both_Bps or rates.inter_Bps
    halo = 768 / both + 128 / rates.inter_Bps  # the busier direction's extra 128 bytes one way
    grad = 2 * 1 * spec.parameters() * 4 / 2 / both
    return compute, backward, halo, grad


@pytest.mark.parametrize("both", [None, 600.0])
def test_a_gradient_shorter_than_the_backward_costs_only_its_round(both):
    rates = Rates(inter_Bps=1e6, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, step_s=0.02, world_round_s=0.003,
                  inter_both_Bps=None if both is None else both * 1e3)
    compute, backward, halo, grad = _by_hand(rates, OVERLAPPED)
    assert grad < backward
    p = predict(FB, OVERLAPPED, servers=2, batches=1, rates=rates)
    assert p["compute_s"] == pytest.approx(compute)
    assert p["gradient_hidden_s"] == pytest.approx(grad * (1 - LAST))
    assert p["inter_s"] == pytest.approx(halo + grad * LAST)  # all hidden but the last bucket's bytes
    assert p["fixed_s"] == pytest.approx(0.02 + 2 * 0.003)  # its all-reduce round stays in the step's fixed cost
    assert p["total_s"] == pytest.approx(compute + halo + grad * LAST + p["intra_s"] + 0.026)
    blocking = predict(FB, BLOCKING, servers=2, batches=1, rates=rates)
    assert blocking["inter_s"] == pytest.approx(halo + grad) and blocking["gradient_hidden_s"] == 0.0
    assert blocking["total_s"] - p["total_s"] == pytest.approx(grad * (1 - LAST))


@pytest.mark.parametrize("both", [None, 600.0])
def test_a_gradient_longer_than_the_backward_charges_the_excess(both):
    rates = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, compute_scale=1.5, inter_both_Bps=both)
    compute, backward, halo, grad = _by_hand(rates, OVERLAPPED)
    assert grad * (1 - LAST) > backward
    p = predict(FB, OVERLAPPED, servers=2, batches=1, rates=rates)
    assert p["gradient_hidden_s"] == pytest.approx(backward)
    assert p["inter_s"] == pytest.approx(halo + grad - backward)
    assert p["total_s"] == pytest.approx(compute + halo + grad - backward + p["intra_s"])
    assert f"after {backward:.3g} of the gradient's hidden by the backward" in choice._terms(p)  # the reason says so
    blocking = predict(FB, BLOCKING, servers=2, batches=1, rates=rates)  # --no-overlap: the whole gradient
    assert blocking["inter_s"] == pytest.approx(halo + grad) and blocking["gradient_hidden_s"] == 0.0
    assert blocking["compute_s"] == p["compute_s"] and blocking["fixed_s"] == p["fixed_s"]


def test_the_backward_is_each_segment_s_slowest_rank_and_scales_with_the_steps():
    # rank 0 heavy at layer 0 (100 rows of 8 x 16, 200 projected), rank 1 at layer 1 (100 of 16 x 4, 110
    # projected); no halo, no edges: the inter-server seconds are the gradient's alone, both ways, hidden
    # behind the backward's products
    rates = Rates(inter_Bps=50.0, intra_Bps=1e4, row_s=1e-5, edge_s=1e-5)
    grad = 2 * 1 * OVERLAPPED.parameters() * 4 / 2 / 50.0
    fb = [_uneven(0, 0), _uneven(1, 1)]  # layer 1 exchanges on the world: two segments
    backward = 2 / 3 * (200 * 128 + 110 * 64) * 1e-5
    flx = [_uneven(0, 0, k=2), _uneven(1, 1, k=2)]  # one segment: the slower rank's whole step
    backward_flx = 2 / 3 * max(200 * 128 + 20 * 64, 20 * 128 + 110 * 64) * 1e-5
    for rows, back in ((fb, backward), (flx, backward_flx)):
        for batches in (1, 3):
            p = predict(rows, OVERLAPPED, servers=2, batches=batches, rates=rates)
            hidden = min(grad * (1 - LAST), back)
            assert p["gradient_hidden_s"] == pytest.approx(batches * hidden)
            assert p["inter_s"] == pytest.approx(batches * (grad - hidden))


def test_the_last_bucket_is_the_first_layers_weights_or_an_eighth_of_the_gradient():
    # Cora's SAGE: 1,433 inputs read by two [64, 1433] weights, most of the gradient
    cora = mm.ModelSpec("sage", features=1433, hidden=64, num_classes=7, layers=3)
    assert last_bucket_share(cora) == pytest.approx(2 * 1433 * 64 / cora.parameters())
    assert last_bucket_share(OVERLAPPED) == pytest.approx(LAST)
    # one input feature: its weights are a sliver, so the buckets' byte target (1/8) sets the share
    narrow = mm.ModelSpec("sage", features=1, hidden=64, num_classes=7, layers=3)
    assert 2 * 64 / narrow.parameters() < 1 / 8 and last_bucket_share(narrow) == pytest.approx(1 / 8)
    # GAT's layer 0 reads them with one [heads x hidden, F] weight
    gat = mm.ModelSpec("gat", features=1433, hidden=64, num_classes=7, layers=3)
    heads = dict(gat.options).get("heads") or 1
    assert last_bucket_share(gat) == pytest.approx(1433 * 64 * heads / gat.parameters())


def test_one_server_hides_nothing():
    p = predict([_rank(0, 0), _rank(1, 0)], OVERLAPPED, servers=1, batches=1,
                rates=Rates(inter_Bps=None, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5))
    assert p["inter_s"] == 0.0 and p["gradient_hidden_s"] == 0.0


def test_both_ways_rate_changes_exactly_the_bytes_that_cross_both_ways():
    """plan's --inter-both-rate reaches Rates (with the compute rate plan measures, stubbed here) and moves
    only the seconds of what crosses both ways at once: per server 768 halo bytes and the gradient."""
    from granndis_hpc.memory_model import compute_rate
    from granndis_hpc.preprocess.plan import command

    mp = pytest.MonkeyPatch()
    mp.setattr(compute_rate, "measure", lambda widths, degree, device: (1e-6, 1e-5))
    mp.setattr(compute_rate, "calibrate", lambda *a, **k: {"compute_scale": 1.0, "step_s": 0.0})
    group = types.SimpleNamespace(rank=0, bcast_object=lambda x: x)
    graph = types.SimpleNamespace(num_edges=80, num_vertices=10)

    def rates(**given):
        args = types.SimpleNamespace(inter_rate="8kbit", intra_rate="80kbit", inter_both_rate=None)
        for k, v in given.items():
            setattr(args, k, v)
        command.check_both_rate(args)
        return command.planned_rates(group, args, BLOCKING, graph)
    try:
        duplex, shared = rates(), rates(inter_both_rate="4kbit")
    finally:
        mp.undo()
    assert (duplex.inter_Bps, duplex.inter_both_Bps, shared.inter_both_Bps) == (1000.0, None, 500.0)
    assert dataclasses.replace(shared, inter_both_Bps=None) == duplex  # nothing else differs
    grad = 2 * 1 * BLOCKING.parameters() * 4 / 2
    for spec in (BLOCKING, OVERLAPPED):
        w = work(FB, spec, 2)
        a, b = seconds(w, duplex), seconds(w, shared)
        for key in ("compute_s", "intra_s", "fixed_s"):
            assert a[key] == b[key]
        # 768 + grad bytes both ways at once: 1000 B/s each way on a full-duplex link, 500 when shared
        both_ways = (768 + grad) * (1 / 500 - 1 / 1000)
        hidden = b["gradient_hidden_s"] - a["gradient_hidden_s"]
        assert b["inter_s"] - a["inter_s"] == pytest.approx(both_ways - hidden)
        assert b["total_s"] - a["total_s"] == pytest.approx(both_ways - hidden)
    with pytest.raises(command.PlanError, match="give --inter-rate"):
        command.check_both_rate(types.SimpleNamespace(inter_rate=None, inter_both_rate="1gbit"))
    with pytest.raises(command.PlanError, match="more than --inter-rate"):
        command.check_both_rate(types.SimpleNamespace(inter_rate="1gbit", inter_both_rate="2gbit"))
