"""bench/overlap_pairs.py: the overlap / no-overlap pair figures, against the model worked by hand."""
import pytest

from overlap_pairs import pair_rows


def _run(epoch, compute, inter_wait, overlap):
    # fb's 3 sage layers on the world view: 1000 rows, 100 send rows, 1,000 of 10,000 edges from halo rows
    counts = [{"group": "world", "rows_computed": 1000, "rows_held": 1200, "send_rows": 100, "halo_rows": 200,
               "edges": 10_000, "halo_edges": 1_000}] * 3
    return {"epoch_s": epoch, "compute": compute, "sampling": 0.0, "inter_comm": inter_wait, "layers": 3,
            "model": "sage", "overlap": overlap, "overlap_halos": ["world"] if overlap else [],
            "inter_bytes_max_server": 8_100_000, "intra_bytes_max_rank": 0, "layer_counts": counts,
            "bytes": {"intra_halo": 0, "inter_halo": 16_000_000, "intra_grad": 0, "inter_grad": 200_000}}


def test_pairs_give_ratio_own_limit_and_best_ratio():
    sweep = {"date": "d", "rates": [{"label": "unshaped", "rate_bps": None, "bw_Bps": 1e7, "loadavg_1min": 1.0,
                                     "pingpong": {"intra_Bps": 1e9},
                                     "runs": {"fb": _run(1.2, 0.5, 0.3, True), "fb-noovl": _run(1.5, 0.6, 0.8, False),
                                              "flx": _run(1.0, 0.9, 0.0, True)}}]}
    (row,) = pair_rows(sweep)  # flx has no -noovl twin: no row
    assert row["mode"] == "fb" and row["ratio"] == pytest.approx(1.2 / 1.5) and row["bytes_equal"]
    # By hand (granndis_hpc/linkmodel.py): halo wire 8e6 B / 1e7 B/s = 0.8 s, 0.2 s per exchange (layers
    # 1 and 2, forward and backward); gradient wire 1e5 B per leader / 1e7 = 0.01 s.  Own compute 0.5 s:
    # c = 0.5 / 6 per layer and direction; windows (s = 0.1, h = 0.1) layer 1: c (0.9 + 0.09), layer 2:
    # c (0.9 + 0.9); limit = 0.5 + 2 (0.2 - 0.99 c) + 2 (0.2 - 1.8 c) + 0.01.
    c = 0.5 / 6
    assert row["limit_own_s"] == pytest.approx(0.5 + 2 * (0.2 - 0.99 * c) + 2 * (0.2 - 1.8 * c) + 0.01)
    # Best ratio: the no-overlap run's compute 0.6 s (c = 0.1) under the overlapped run's order, over its
    # additive epoch 0.6 + 0.81.
    assert row["best_ratio"] == pytest.approx((0.6 + 2 * (0.2 - 0.099) + 2 * (0.2 - 0.18) + 0.01) / 1.41)
    assert row["wire_s"] == pytest.approx(0.81)


def test_summary_gives_the_geometric_mean_and_spread_per_link_and_shape():
    from overlap_pairs import summary
    rows = [{"label": "100mbit", "mode": "fb", "shape": "2 x 2", "ratio": r} for r in (0.5, 2.0, 1.0)]
    rows.append({"label": "100mbit", "mode": "fb", "shape": "2 x 1", "ratio": 0.7})
    a, b = summary(rows)
    assert (a["shape"], a["pairs"], a["min"], a["max"]) == ("2 x 2", 3, 0.5, 2.0)
    assert a["geomean"] == pytest.approx(1.0)
    assert (b["pairs"], b["geomean"]) == (1, pytest.approx(0.7))


def test_summary_counts_the_repeated_unshaped_round_with_its_rate():
    from overlap_pairs import summary
    rows = [{"label": "unshaped", "mode": "eas", "ratio": 0.8}, {"label": "unshaped-repeat", "mode": "eas", "ratio": 1.25}]
    (g,) = summary(rows)
    assert (g["label"], g["pairs"], g["min"], g["max"]) == ("unshaped", 2, 0.8, 1.25)
    assert g["geomean"] == pytest.approx(1.0)
