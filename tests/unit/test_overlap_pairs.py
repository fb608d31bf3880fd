"""bench/overlap_pairs.py: the overlap / no-overlap pair figures, against the model worked by hand."""
import pytest

from overlap_pairs import pair_rows


def _run(epoch, compute, inter_wait, overlap):
    return {"epoch_s": epoch, "compute": compute, "sampling": 0.0, "inter_comm": inter_wait, "layers": 3,
            "overlap": overlap, "inter_bytes_max_server": 8_100_000, "intra_bytes_max_rank": 0,
            "bytes": {"intra_halo": 0, "inter_halo": 16_000_000, "intra_grad": 0, "inter_grad": 200_000}}


def test_pairs_give_ratio_own_limit_and_best_ratio():
    sweep = {"date": "d", "rates": [{"label": "unshaped", "rate_bps": None, "bw_Bps": 1e7, "loadavg_1min": 1.0,
                                     "pingpong": {"intra_Bps": 1e9},
                                     "runs": {"fb": _run(1.2, 0.5, 0.3, True), "fb-noovl": _run(1.5, 0.6, 0.8, False),
                                              "flx": _run(1.0, 0.9, 0.0, True)}}]}
    (row,) = pair_rows(sweep)  # flx has no -noovl twin: no row
    assert row["mode"] == "fb" and row["ratio"] == pytest.approx(1.2 / 1.5) and row["bytes_equal"]
    # By hand: halo wire 8e6 B / 1e7 B/s = 0.8 s over 4 exchanging passes (0.2 each), gradient wire
    # 1e5 B per leader / 1e7 = 0.01 s.  Own compute 0.5 s over 6 passes (0.0833 < 0.2):
    # limit = 4 * 0.2 + 2 * 0.5 / 6 + 0.01.
    assert row["limit_own_s"] == pytest.approx(0.8 + 1 / 6 + 0.01)
    # Best ratio, from the no-overlap run's compute 0.6 s (0.1 per pass): (0.8 + 0.2 + 0.01) / (0.6 + 0.81).
    assert row["best_ratio"] == pytest.approx(1.01 / 1.41)
    assert row["wire_s"] == pytest.approx(0.81)


def test_summary_gives_the_geometric_mean_and_spread_per_link_and_shape():
    from overlap_pairs import summary
    rows = [{"label": "100mbit", "mode": "fb", "shape": "2 x 2", "ratio": r} for r in (0.5, 2.0, 1.0)]
    rows.append({"label": "100mbit", "mode": "fb", "shape": "2 x 1", "ratio": 0.7})
    a, b = summary(rows)
    assert (a["shape"], a["pairs"], a["min"], a["max"]) == ("2 x 2", 3, 0.5, 2.0)
    assert a["geomean"] == pytest.approx(1.0)
    assert (b["pairs"], b["geomean"]) == (1, pytest.approx(0.7))
