"""The additive epoch-time model of an option (memory_model/epoch_time.py), checked by hand."""
from dataclasses import replace

import pytest

import granndis_hpc.memory_model as mm
from granndis_hpc.memory_model.epoch_time import Rates, predict, seconds, work

# widths (8, 16), (16, 4); blocking (--no-overlap): the gradient's bytes charged whole (test_gradient_overlap.py
# prices a run that overlaps them with the backward)
SPEC = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=2, overlap=())
RATES = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5)


def _rank(rank, inter1, k=0):
    l0 = mm.LayerRows(n_own_in=10, n_halo=5, n_dst=10, nnz=30, inter_halo=2)
    l1 = mm.LayerRows(n_own_in=10, n_halo=6, n_dst=10, nnz=40, inter_halo=inter1)
    world = mm.ViewRows("world", 10, 6, 6, (l0, l1), inter_halo=inter1)
    server = mm.ViewRows("server", 10, 6, 6, (l0, l1)) if k else None
    return mm.RankRows(rank=rank, features=8, num_classes=4, n_inner=10, n_train=5, layers=2, k=k,
                       world=world, server=server)


def test_fb_by_hand():
    rows = [_rank(0, 3), _rank(1, 3), _rank(2, 3), _rank(3, 4)]  # 2 servers x 2 GPUs
    grad = 2 * 1 * SPEC.parameters() * 4 / 2  # each server's share of the ring all-reduce
    p = predict(rows, SPEC, servers=2, batches=1, rates=RATES)
    # projected rows (SAGE: lin_self's n_dst, lin_neigh's n_dst aggregates, or where it narrows (16 -> 4) its
    # 10 + 6 source rows): 20 x 8 x 16 + 26 x 16 x 4 = 4224 units; edges: 30 x 8 + 40 x 16 = 880 units
    assert p["compute_s"] == pytest.approx(4224e-6 + 880e-5)
    # sage's layer 0 reads the static halo; layer 1 sends 16 floats a row, forward and backward
    assert p["inter_bytes_max_server"] == 2 * 3 * 64 + 2 * 4 * 64 + grad  # server 1 (ranks 2, 3)
    assert p["inter_s"] == pytest.approx((896 + grad) / 1000)
    assert p["intra_bytes_max_rank"] == 2 * 3 * 64  # ranks 0-2: 6 halo rows, 3 of them inter-server
    assert p["intra_s"] == pytest.approx(384 / 1e4)
    assert p["total_s"] == pytest.approx(p["compute_s"] + p["inter_s"] + p["intra_s"])
    assert p["rows_computed"] == 4 * 20
    # the inter-server bytes summed over servers are the ledger's (estimate.inter_server_bytes)
    assert work(rows, SPEC, 2).inter_bytes.sum() == mm.inter_server_bytes(rows, SPEC, 2)["total"]


def test_batches_scale_everything():
    rows = [_rank(0, 3), _rank(1, 3)]
    one, three = (predict(rows, SPEC, servers=2, batches=b, rates=RATES) for b in (1, 3))
    for key in ("compute_s", "inter_s", "intra_s", "total_s"):
        assert three[key] == pytest.approx(3 * one[key])


def test_preloaded_layers_stay_inside_the_server():
    rows = [_rank(0, 3, k=2), _rank(1, 3, k=2)]  # every layer on the server view: no inter-server halo
    p = predict(rows, SPEC, servers=2, batches=1, rates=RATES)
    assert p["inter_bytes_max_server"] == 2 * SPEC.parameters() * 4 / 2
    assert p["intra_bytes_max_rank"] == 2 * 6 * 64  # all 6 halo rows of layer 1 from the server's GPUs


def test_one_server_needs_no_inter_rate():
    p = predict([_rank(0, 0), _rank(1, 0)], SPEC, servers=1, batches=1,
                rates=Rates(inter_Bps=None, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5))
    assert p["inter_s"] == 0.0
    with pytest.raises(ValueError, match="not measured"):
        predict([_rank(0, 3), _rank(1, 3)], SPEC, servers=2, batches=1,
                rates=Rates(inter_Bps=None, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5))


def test_rounds_and_steps_by_hand():
    # 2 layers: layer 0 reads the static halo, layer 1 exchanges forward and backward
    fb = work([_rank(r, 3) for r in range(4)], SPEC, servers=2)
    assert (fb.world_rounds, fb.server_rounds, fb.steps) == (2, 0, 1)
    flx = work([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=2)  # layer 1 on the server view
    assert (flx.world_rounds, flx.server_rounds, flx.steps) == (0, 2, 1)
    cob = work([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=2, batches=3)
    assert (cob.world_rounds, cob.server_rounds, cob.steps) == (0, 6, 3)
    alone = work([_rank(r, 3, k=2) for r in range(2)], SPEC, servers=2)  # one GPU per server: no server round
    assert alone.server_rounds == 0
    rates = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, step_s=0.5, world_round_s=0.03,
                  server_round_s=0.01)
    p = predict([_rank(r, 3) for r in range(4)], SPEC, servers=2, batches=1, rates=rates)
    base = predict([_rank(r, 3) for r in range(4)], SPEC, servers=2, batches=1, rates=RATES)
    # + fb's 2 relay rounds of the per-server route (test_the_per_server_route_adds_a_relay_round)
    assert p["fixed_s"] == pytest.approx(0.5 + 2 * 0.03 + 2 * 0.01) and base["fixed_s"] == 0.0
    assert p["total_s"] == pytest.approx(base["total_s"] + 0.58)
    c = predict([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=2, batches=3, rates=rates)
    assert c["fixed_s"] == pytest.approx(3 * 0.5 + 6 * 0.01) and (c["steps"], c["server_rounds"]) == (3, 6)


def _uneven(rank, heavy_layer, k=0):
    """A rank that computes 100 rows at `heavy_layer` and 10 at the other, from 10 own source rows: SAGE
    projects 2 x 100 or 2 x 10 rows at layer 0 (8 -> 16) and 100 + 10 or 10 + 10 at layer 1 (16 -> 4, the
    source rows projected first)."""
    n = [100 if l == heavy_layer else 10 for l in range(2)]
    layers = tuple(mm.LayerRows(n_own_in=10, n_halo=0, n_dst=n[l], nnz=0, inter_halo=0) for l in range(2))
    world = mm.ViewRows("world", 10, 0, 0, layers)
    server = mm.ViewRows("server", 10, 0, 0, layers) if k else None
    return mm.RankRows(rank=rank, features=8, num_classes=4, n_inner=10, n_train=5, layers=2, k=k,
                       world=world, server=server)


def test_the_slowest_rank_sets_each_segment():
    # layer 0: 8 x 16 = 128 units a projected row, layer 1: 16 x 4 = 64; rank 0 heavy at layer 0, rank 1 at
    # layer 1
    unit = 1e-6
    fb = predict([_uneven(0, 0), _uneven(1, 1)], SPEC, servers=2, batches=1, rates=RATES)
    # fb's world exchange at layer 1 makes two segments: max(200, 20) x 128 + max(20, 110) x 64
    assert fb["compute_s"] == pytest.approx((200 * 128 + 110 * 64) * unit)
    # all layers inside the server: one segment, the slowest rank's whole step
    flx = predict([_uneven(0, 0, k=2), _uneven(1, 1, k=2)], SPEC, servers=2, batches=1, rates=RATES)
    assert flx["compute_s"] == pytest.approx(max(200 * 128 + 20 * 64, 20 * 128 + 110 * 64) * unit)


def test_compute_scale_multiplies_the_compute():
    rows = [_rank(0, 3), _rank(1, 3)]
    scaled = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, compute_scale=1.7)
    one, more = (predict(rows, SPEC, servers=2, batches=1, rates=r) for r in (RATES, scaled))
    assert more["compute_s"] == pytest.approx(1.7 * one["compute_s"])
    assert more["inter_s"] == one["inter_s"] and more["intra_s"] == one["intra_s"]


def test_both_ways_at_once_by_hand():
    # server 0 (ranks 0, 1): 2 x 3 rows x 16 floats x 4 bytes each, 768 bytes; server 1 (ranks 2, 3): 896
    rows = [_rank(0, 3), _rank(1, 3), _rank(2, 3), _rank(3, 4)]
    grad = 2 * 1 * SPEC.parameters() * 4 / 2
    w = work(rows, SPEC, 2)
    # two servers: what one sends the other receives, at the same time, and the all-reduce both ways
    assert list(w.inter_back_bytes) == [896 + grad, 768 + grad]
    # a shared budget (both ways at 400 B/s each, one way 1000): 768 + grad both ways at once, 128 one way
    shared = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, inter_both_Bps=400.0)
    p = predict(rows, SPEC, servers=2, batches=1, rates=shared)
    assert p["inter_s"] == pytest.approx((768 + grad) / 400 + 128 / 1000)
    # full duplex (measured equal to the one-way rate, or not measured): the busier direction at one way
    for rate in (1000.0, None):
        duplex = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, inter_both_Bps=rate)
        assert predict(rows, SPEC, servers=2, batches=1, rates=duplex)["inter_s"] == pytest.approx((896 + grad) / 1000)


def test_both_ways_with_more_servers():
    # 4 servers of one GPU: halo bytes 384, 384, 384, 512; the rows each server sends are the others'
    # halo bytes over 3; a preload (no halo) moves only its gradient share, the same both ways
    rows = [_rank(0, 3), _rank(1, 3), _rank(2, 3), _rank(3, 4)]
    grad = 2 * 3 * SPEC.parameters() * 4 / 4
    w = work(rows, SPEC, 4)
    assert w.inter_back_bytes == pytest.approx([(384 + 384 + 512) / 3 + grad] * 3 + [384 + grad])
    rates = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, inter_both_Bps=500.0)
    assert predict(rows, SPEC, servers=4, batches=1, rates=rates)["inter_s"] == pytest.approx(
        (384 + grad) / 500 + 128 / 1000)  # server 3: 384 + grad both ways, 128 more in
    flx = predict([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=4, batches=2, rates=rates)
    assert flx["inter_s"] == pytest.approx(2 * grad / 500)


def test_cobatch_set_up_by_hand():
    rows = [_rank(r, 3, k=2) for r in range(4)]  # every rank computes 10 + 10 rows a co-batch
    assert work(rows, SPEC, 2, batches=3).cobatch_rows == 0.0  # none set up: nothing charged
    w = work(rows, SPEC, 2, batches=3, cobatches=3)
    assert (w.cobatches, w.cobatch_rows) == (3, 3 * 20)
    timed = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, cobatch_s=0.01, cobatch_row_s=2e-3)
    with_setup = predict(rows, SPEC, servers=2, batches=3, rates=timed)
    assert with_setup["fixed_s"] == 0.0  # predict() prices what work() counts: no co-batch set up
    p, base = seconds(w, timed), seconds(w, RATES)
    assert p["fixed_s"] == pytest.approx(3 * 0.01 + 60 * 2e-3) and base["fixed_s"] == 0.0
    assert p["total_s"] == pytest.approx(base["total_s"] + 0.15)


def test_uneven_ranks_charge_the_busiest_co_batch():
    rows = [_uneven(0, 0, k=2), _uneven(1, 1, k=2)]  # 110 rows each
    assert work(rows, SPEC, 2, batches=2, cobatches=2).cobatch_rows == 2 * 110
    rows = [_uneven(0, 0, k=2), _rank(1, 3, k=2)]  # 110 and 20 rows
    assert work(rows, SPEC, 2, batches=2, cobatches=2).cobatch_rows == 2 * 110


def test_the_set_up_line_through_two_builds():
    from granndis_hpc.engine.cobsetup import fit

    # 0.03 s for 100 rows, 0.09 s for 400: 0.2 ms a row and 0.01 s fixed
    assert fit((0.03, 100), (0.09, 400)) == pytest.approx((0.01, 2e-4))
    assert fit((0.05, 100), (0.04, 400)) == (0.05, 0.0)  # the larger build timed faster: all fixed
    assert fit((0.001, 100), (0.09, 400)) == pytest.approx((0.0, 0.089 / 300))  # never a negative fixed part
    assert fit((0.02, 100), (0.04, 100)) == (0.0, 0.04 / 100)  # one size only: all per row


def test_the_per_server_route_adds_a_relay_round():
    # the world layer (layer 1) on the per-server route: its rows cross to one reader per server, which
    # forwards them to the server's other readers (and returns their gradients) over a server-group round
    rates = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, step_s=0.5, world_round_s=0.03,
                  server_round_s=0.01)
    fb = [_rank(r, 3) for r in range(4)]  # 2 servers x 2 GPUs
    routed = predict(fb, SPEC, servers=2, batches=1, rates=rates)
    assert (routed["world_rounds"], routed["relay_rounds"], routed["server_rounds"]) == (2, 2, 0)
    assert routed["fixed_s"] == pytest.approx(0.5 + 2 * 0.03 + 2 * 0.01)
    direct = predict(fb, replace(SPEC, halo_route="direct"), servers=2, batches=1, rates=rates)
    assert direct["relay_rounds"] == 0 and direct["fixed_s"] == pytest.approx(0.5 + 2 * 0.03)
    assert routed["total_s"] - direct["total_s"] == pytest.approx(0.02)
    # a relay round per world round: 3 steps relay 3 times as often
    assert work(fb, SPEC, servers=2, batches=3).relay_rounds == 6
    # flx k=1: layer 0 on the server view (not exchanged: the static halo), layer 1 on the world view, relayed
    flx1 = work([_rank(r, 3, k=1) for r in range(4)], SPEC, servers=2)
    assert (flx1.world_rounds, flx1.server_rounds, flx1.relay_rounds) == (2, 0, 2)
    # nothing to relay: every layer inside the server (flx k=2), one server, or one GPU per server
    assert work([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=2).relay_rounds == 0
    assert work([_rank(r, 0) for r in range(4)], SPEC, servers=1).relay_rounds == 0
    alone = work([_rank(r, 3) for r in range(2)], SPEC, servers=2)
    assert (alone.world_rounds, alone.relay_rounds) == (2, 0)


def test_partial_aggregates_add_a_world_round_where_it_blocks():
    # blocking, a layer that sends partials exchanges its rows part (relayed), then its partials: two world rounds
    fb = [_rank(r, 3) for r in range(4)]
    w = work(fb, SPEC, servers=2, partial_layers=(False, True))
    assert (w.world_rounds, w.relay_rounds, w.server_rounds) == (4, 2, 0)
    rates = Rates(inter_Bps=1000.0, intra_Bps=1e4, row_s=1e-6, edge_s=1e-5, step_s=0.5, world_round_s=0.03,
                  server_round_s=0.01)
    assert seconds(w, rates)["fixed_s"] == pytest.approx(0.5 + 4 * 0.03 + 2 * 0.01)
    # every layer inside the server (flx k=2): no world layer, no partials
    assert work([_rank(r, 3, k=2) for r in range(4)], SPEC, servers=2, partial_layers=(False, True)).world_rounds == 0
    # overlapped world exchanges (the default): the partials travel beside the rows' round
    overlapped = work(fb, replace(SPEC, overlap=("world",)), servers=2, partial_layers=(False, True))
    assert (overlapped.world_rounds, overlapped.relay_rounds) == (2, 2)


def _three_layers(rank, k):
    """A rank of a 3-layer SAGE (widths (8, 16), (16, 16), (16, 4)): layer l computes 10 (l + 1) rows
    over 5 (l + 1) edges, its first k layers on the server view."""
    layers = tuple(mm.LayerRows(n_own_in=10, n_halo=4, n_dst=10 * (l + 1), nnz=5 * (l + 1), inter_halo=2)
                   for l in range(3))
    world = mm.ViewRows("world", 10, 4, 4, layers, inter_halo=2)
    server = mm.ViewRows("server", 10, 4, 4, layers) if k else None
    return mm.RankRows(rank=rank, features=8, num_classes=4, n_inner=10, n_train=5, layers=3, k=k,
                       world=world, server=server)


def test_overlap_scale_prices_the_layers_on_the_overlapped_path():
    spec = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=3)  # overlapped: the world group
    rates = replace(RATES, compute_scale=1.5, overlap_scale=2.0, overlap_step_s=0.25)
    # per layer: projected rows x w_in x w_out x row_s + edges x w_in x edge_s; SAGE projects 2 n_dst rows,
    # or n_dst + n_src (10 own + 4 halo) where lin_neigh projects the sources first: layer 2 narrows, and
    # layer 1 (16 -> 16) does so with its halo in flight (fb's world layers)
    layer = [20 * 128e-6 + 5 * 8e-5, 40 * 256e-6 + 10 * 16e-5, 44 * 64e-6 + 15 * 16e-5]
    fb_layer = [layer[0], 34 * 256e-6 + 10 * 16e-5, layer[2]]

    def compute(rows, m, r=rates):
        p = predict(rows, m, servers=2, batches=1, rates=r)
        return p["compute_s"], p["fixed_s"]
    # fb: every layer's halo in flight (layers 1, 2) or its rows split for the next one's (layers 0, 1)
    assert compute([_three_layers(r, 0) for r in range(4)], spec) == pytest.approx(
        (2.0 * sum(fb_layer), 0.25 + 4 * rates.world_round_s))
    # flx k=2: layer 0 and its server-view exchange are plain; layer 1 splits its rows for layer 2's world
    # exchange, which is in flight at layer 2
    flx = compute([_three_layers(r, 2) for r in range(4)], spec)
    assert flx == pytest.approx((1.5 * layer[0] + 2.0 * (layer[1] + layer[2]), 0.25))
    # every layer inside the server (k = L), or --no-overlap: the plain path, no overlapped step's cost
    assert compute([_three_layers(r, 3) for r in range(4)], spec) == pytest.approx((1.5 * sum(layer), 0.0))
    assert compute([_three_layers(r, 0) for r in range(4)], replace(spec, overlap=())) == pytest.approx(
        (1.5 * sum(layer), 0.0))
    # one rank has no peer: nothing to overlap
    assert compute([_three_layers(0, 0)], spec)[0] == pytest.approx(1.5 * sum(layer))
    # no overlapped calibration (overlap_scale None): the plain scale throughout
    assert compute([_three_layers(r, 0) for r in range(4)], spec, replace(rates, overlap_scale=None))[0] == \
        pytest.approx(1.5 * sum(fb_layer))


def test_the_overlapped_path_s_shape_by_hand():
    """Work.overlap_shape: (halo rows per computed row at the layers whose halo is in flight, rows the next
    layer sends per computed row at the layers split boundary-first), over every rank; where compute_rate
    calibrates that path (choice.training_shape)."""
    spec = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=3)  # overlapped: the world group

    def rank(r, k, sends=lambda l: 2 * (l + 1) + 1):  # layer l sends 2 (l + 1) + 1 of its input rows
        base = _three_layers(r, k)
        layers = tuple(replace(lr, n_send=sends(l)) for l, lr in enumerate(base.world.layers))
        return replace(base, world=replace(base.world, layers=layers),
                       server=None if base.server is None else replace(base.server, layers=layers))

    def shape(k, ranks=4, m=spec):
        return work([rank(r, k) for r in range(ranks)], m, servers=2 if ranks > 1 else 1).overlap_shape
    # fb: layers 1 and 2 in flight (4 halo rows over 20 and 30 computed), layers 0 and 1 split for the sends of
    # layers 1 and 2 (5 and 7 rows over 10 and 20 computed)
    assert shape(0) == pytest.approx((8 / 50, 12 / 30))
    # flx k=2: layer 2 in flight, layer 1 split for it
    assert shape(2) == pytest.approx((4 / 30, 7 / 20))
    # a send list counts a row once per peer: the rows computed first are at most those computed (20 of layer 1)
    many = work([rank(r, 2, sends=lambda l: 50) for r in range(4)], spec, servers=2).overlap_shape
    assert many == pytest.approx((4 / 30, 20 / 20))
    # nothing on the overlapped path: every layer inside the server, --no-overlap, one rank
    assert shape(3) is None and shape(0, m=replace(spec, overlap=())) is None and shape(0, ranks=1) is None
