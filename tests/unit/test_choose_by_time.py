"""--auto-rule time: the option of the shortest predicted epoch among those that fit (memory_model/choice.py)."""
import numpy as np

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


def test_equal_predictions_go_by_graNNDis_order():
    d = mm.choose_by_time([_option("fb", rows=100, inter=0), _option("flx", k=1, rows=100, inter=0)], MIB,
                          _rates(1e9))
    assert d.choice.label == "flx k=1"


def test_decision_table_marks_the_choice():
    d = mm.choose_by_time(_options(), 4 * MIB, _rates(1e5)).to_dict()
    lines = mm.decision_table(d)
    assert lines[0].split()[:3] == ["option", "predicted", "s"]
    assert any(line.startswith("flx k=2") and line.endswith("<- chosen") for line in lines)
