"""The additive epoch-time model of an option (memory_model/epoch_time.py), checked by hand."""
import pytest

import granndis_hpc.memory_model as mm
from granndis_hpc.memory_model.epoch_time import Rates, predict, work

SPEC = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=2)  # widths (8, 16), (16, 4)
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
    # rows: 10 x 8 x 16 + 10 x 16 x 4 = 1920 units; edges: 30 x 8 + 40 x 16 = 880 units
    assert p["compute_s"] == pytest.approx(1920e-6 + 880e-5)
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
