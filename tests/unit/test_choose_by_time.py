"""--auto-rule time: the option of the shortest predicted epoch among those that fit (memory_model/choice.py)."""
import dataclasses

import numpy as np
import pytest

import granndis_hpc.engine.modes  # noqa: F401  (registers the modes)
import granndis_hpc.memory_model as mm
from granndis_hpc.memory_model.epoch_time import Work

MIB = 1 << 20


def _option(mode, k=0, batches=1, rows=100.0, inter=1e6, intra=0.0, peak=MIB):
    w = Work(row_units=np.array([rows]), edge_units=np.array([0.0]), intra_bytes=np.array([intra]),
             inter_bytes=np.array([inter]), rows_computed=int(rows))
    return mm.Option(mode=mode, k=k, batches=batches, peak=peak, work=w, source="set")


def _options():
    # fb: fewest rows, every layer's halo over the servers' link; flx k=2: 3x the rows, the gradient only
    return [_option("fb", rows=100, inter=1e6), _option("flx", k=2, rows=300, inter=1e3, peak=2 * MIB),
            _option("cob", k=2, batches=4, rows=400, inter=4e3)]


def _rates(inter):
    return mm.Rates(inter_Bps=inter, intra_Bps=1e9, row_s=1e-3, edge_s=0.0)


def test_slow_link_between_servers_picks_the_preload():
    d = mm.choose_by_time(_options(), 4 * MIB, _rates(1e5))  # fb 0.1 + 10 s, flx 0.3 + 0.01 s
    assert d.choice.label == "flx k=2" and d.rule == "time"
    assert "runner-up cob batches=4" in d.reason and "0.31 s" in d.reason


def test_equal_links_pick_the_fewest_rows():
    d = mm.choose_by_time(_options(), 4 * MIB, _rates(1e9))
    assert d.choice.label == "fb"
    table = d.to_dict()["options"]
    assert [o["label"] for o in table] == ["fb", "flx k=2", "cob batches=4"]  # fastest first
    assert table[0]["predicted_s"]["total_s"] == 0.1 + 1e-3
    assert [o["exact"] for o in table] == [True, True, False]


def test_exact_only_never_picks_a_sampled_mode():
    fast_cob = _options()[:2] + [_option("cob", k=2, batches=2, rows=10, inter=0)]
    assert mm.choose_by_time(fast_cob, 4 * MIB, _rates(1e5)).choice.mode == "cob"
    d = mm.choose_by_time(fast_cob, 4 * MIB, _rates(1e5), exact_only=True)
    assert d.choice.label == "flx k=2" and "exact options only" in d.reason
    assert all(o["exact"] for o in d.to_dict()["options"])


def test_over_budget_is_passed_over_and_nothing_fitting_refuses():
    d = mm.choose_by_time(_options(), MIB, _rates(1e5))  # flx needs 2 MiB
    assert d.choice.label == "cob batches=4" and [o.label for o in d.rejected] == ["flx k=2"]
    none = mm.choose_by_time(_options(), MIB // 2, _rates(1e5))
    assert none.choice is None and "nothing fits" in none.reason and "--memory-per-gpu 1MiB" in none.reason


def test_equal_predictions_keep_fb():
    d = mm.choose_by_time([_option("fb", rows=100, inter=0), _option("flx", k=1, rows=100, inter=0)], MIB,
                          _rates(1e9))
    assert d.choice.label == "fb"
    assert "fb is kept, the simplest exact plan" in d.reason and "within the 10% margin" in d.reason


def test_fb_is_kept_unless_another_is_faster_by_more_than_the_margin():
    # fb 0.1 s + 1 ms wire; flx computes 92 rows (0.092 s): 9 % faster, within 10 %
    near = [_option("fb", rows=100, inter=1e6), _option("flx", k=2, rows=92, inter=0)]
    d = mm.choose_by_time(near, MIB, _rates(1e9))
    assert d.choice.label == "fb" and "flx k=2 is predicted 9% faster than fb (0.092 s against 0.101 s)" in d.reason
    assert d.to_dict()["rates"]["baseline_margin"] == 0.10
    # 80 rows: 21 % faster, past the margin; a margin of 25 % keeps fb again
    far = [_option("fb", rows=100, inter=1e6), _option("flx", k=2, rows=80, inter=0)]
    d = mm.choose_by_time(far, MIB, _rates(1e9))
    assert d.choice.label == "flx k=2" and "21% faster than fb" in d.reason and "more than the 10% margin" in d.reason
    assert mm.choose_by_time(far, MIB, _rates(1e9), margin=0.25).choice.label == "fb"
    # without a margin the fastest wins outright; fb over the budget is no baseline
    assert mm.choose_by_time(near, MIB, _rates(1e9), margin=0.0).choice.label == "flx k=2"
    over = [_option("fb", rows=100, inter=1e6, peak=4 * MIB), _option("flx", k=2, rows=99, inter=0)]
    assert mm.choose_by_time(over, MIB, _rates(1e9)).choice.label == "flx k=2"


def test_the_margin_must_be_a_share():
    with pytest.raises(ValueError, match="margin"):
        mm.choose_by_time(_options(), MIB, _rates(1e9), margin=1.5)


def test_fixed_costs_count_per_round_and_step():
    # flx: fewer rows and bytes but 8 co-batch-like steps of world rounds; fb: 1 step, 2 rounds
    w_fb = Work(row_units=np.array([100.0]), edge_units=np.array([0.0]), intra_bytes=np.array([0.0]),
                inter_bytes=np.array([0.0]), rows_computed=100, world_rounds=2, steps=1)
    w_cob = Work(row_units=np.array([60.0]), edge_units=np.array([0.0]), intra_bytes=np.array([0.0]),
                 inter_bytes=np.array([0.0]), rows_computed=60, server_rounds=16, steps=8)
    opts = [mm.Option(mode="fb", peak=MIB, work=w_fb, source="set"),
            mm.Option(mode="cob", k=2, batches=8, peak=MIB, work=w_cob, source="set")]
    rates = mm.Rates(inter_Bps=1e9, intra_Bps=1e9, row_s=1e-3, edge_s=0.0)
    assert mm.choose_by_time(opts, MIB, rates).choice.mode == "cob"  # 0.06 s against 0.1 s without fixed costs
    fixed = mm.Rates(inter_Bps=1e9, intra_Bps=1e9, row_s=1e-3, edge_s=0.0, step_s=0.01, world_round_s=0.002,
                     server_round_s=0.001)
    d = mm.choose_by_time(opts, MIB, fixed)  # fb 0.1 + 0.01 + 0.004; cob 0.06 + 0.08 + 0.016
    assert d.choice.mode == "fb"
    p = {o["label"]: o["predicted_s"] for o in d.to_dict()["options"]}
    assert p["fb"]["fixed_s"] == pytest.approx(0.014) and p["cob batches=8"]["fixed_s"] == pytest.approx(0.096)
    assert d.to_dict()["choice"]["rounds"] == {"world": 2, "server": 0, "relay": 0, "steps": 1, "overlapped_steps": 0,
                                             "targets": 0}


def test_decision_table_marks_the_choice():
    d = mm.choose_by_time(_options(), 4 * MIB, _rates(1e5)).to_dict()
    lines = mm.decision_table(d)
    assert lines[0].split() == ["option", "predicted", "s", "compute", "inter", "intra", "fixed", "peak/GPU",
                                "exact"]
    assert any(line.startswith("flx k=2") and line.endswith("<- chosen") for line in lines)


def _server_rows():
    """Four ranks (2 servers x 2) whose every layer is on the server view: 10 + 5 rows a co-batch."""
    l0 = mm.LayerRows(n_own_in=20, n_halo=0, n_dst=10, nnz=30, inter_halo=0)
    l1 = mm.LayerRows(n_own_in=10, n_halo=0, n_dst=5, nnz=10, inter_halo=0)

    def rank(r):
        v = mm.ViewRows("server", 20, 0, 0, (l0, l1))
        return mm.RankRows(rank=r, features=8, num_classes=4, n_inner=5, n_train=5, layers=2, k=2,
                           world=mm.ViewRows("world", 20, 0, 0, (l0, l1)), server=v)
    return [rank(r) for r in range(4)]


SPEC = mm.ModelSpec("sage", features=8, hidden=16, num_classes=4, layers=2)


def test_cob_options_set_up_each_co_batch():
    rows = _server_rows()
    cob = mm.make_option("cob", rows, SPEC, servers=2, batches=4)
    flx = mm.make_option("flx", rows, SPEC, servers=2)
    assert cob.work.cobatch_rows == 4 * 15 and flx.work.cobatch_rows == 0  # rows 10 + 5 per co-batch
    rates = mm.Rates(inter_Bps=1e9, intra_Bps=1e9, row_s=0.0, edge_s=0.0, cobatch_s=0.02, cobatch_row_s=1e-3)
    mm.choice.price([cob, flx], rates)
    assert cob.predicted["fixed_s"] == pytest.approx(4 * 0.02 + 60e-3) and flx.predicted["fixed_s"] == 0.0


@pytest.mark.parametrize("batches", [1, 2, 5])
def test_cob_options_all_reduce_each_co_batch_s_targets(batches):
    """Every co-batch step sums its target count over the world (engine/cobatch.py): one small all-reduce
    round per co-batch, priced at targets_round_s; a full-graph option has its count at set-up."""
    rows, round_s = _server_rows(), 0.0037
    base = mm.Rates(inter_Bps=1e9, intra_Bps=1e9, row_s=1e-6, edge_s=1e-7, step_s=0.01, server_round_s=0.002,
                    cobatch_s=0.02, cobatch_row_s=1e-4)
    priced = dataclasses.replace(base, targets_round_s=round_s)
    for mode, rounds in (("cob", batches), ("flx", 0), ("fb", 0)):
        option = mm.make_option(mode, rows, SPEC, servers=2, batches=batches if mode == "cob" else 1)
        assert option.to_dict()["rounds"]["targets"] == rounds
        without, with_rounds = (dict(mm.epoch_time.seconds(option.work, r)) for r in (base, priced))
        assert with_rounds["total_s"] - without["total_s"] == pytest.approx(rounds * round_s, rel=1e-12, abs=1e-15)
        assert with_rounds["fixed_s"] - without["fixed_s"] == pytest.approx(rounds * round_s, rel=1e-12, abs=1e-15)
        for part in ("compute_s", "inter_s", "intra_s"):
            assert with_rounds[part] == without[part]


def test_the_training_degree_is_the_baseline_s_edges_per_row():
    """The compute rate is calibrated at the in-edges per row of the graph the baseline (fb) trains on,
    as the kernels count them: edges x w_in over computed rows x w_in, over the layers."""
    m = mm.ModelSpec("sage", 100, 64, 47, 3)
    win = np.array([i for i, _ in m.widths()], dtype=np.float64)

    def option(mode, rows, degree, payload="rows"):
        rows = np.array(rows, dtype=np.float64)
        w = Work(row_units=rows, edge_units=rows * degree * win.sum(), intra_bytes=np.zeros(len(rows)),
                 inter_bytes=np.zeros(1), rows_computed=int(rows.sum()), dst_units=rows * win.sum())
        return mm.Option(mode=mode, payload=payload, work=w)

    eas = option("eas", [500, 700], 2.0)  # sampled: 2 in-edges a row
    fb = option("fb", [400, 600], 3.0)  # every in-edge of the train-induced graph: 3 a row
    partial = option("fb", [400, 600], 10.0, payload="partial")
    assert mm.training_degree([eas, partial, fb], m, fallback=26.0) == pytest.approx(3.0)
    assert mm.training_degree([eas, partial], m, fallback=26.0) == pytest.approx(2.0)  # no baseline: the first
    assert mm.training_degree([mm.Option(mode="fb")], m, fallback=26.0) == 26.0  # no work: the dataset's
    assert mm.training_degree([], m, fallback=26.0) == 26.0


def test_the_training_shape_is_the_baseline_s_overlapped_path():
    """The overlapped path is calibrated at the baseline's (fb's) halo and boundary rows per row, else the first
    option's that computes on that path; None where none does."""
    def option(mode, shape, payload="rows"):
        w = Work(row_units=np.ones(2), edge_units=np.ones(2), intra_bytes=np.zeros(2), inter_bytes=np.zeros(1),
                 rows_computed=2, overlap_shape=shape)
        return mm.Option(mode=mode, payload=payload, work=w)

    eas, flx = option("eas", None), option("flx", (0.1, 0.3))
    fb, partial = option("fb", (2.0, 0.95)), option("fb", (1.0, 0.5), payload="partial")
    assert mm.training_shape([eas, flx, partial, fb]) == (2.0, 0.95)
    assert mm.training_shape([eas, partial, flx]) == (1.0, 0.5)  # no baseline: the first on the path
    assert mm.training_shape([eas]) is None and mm.training_shape([]) is None
