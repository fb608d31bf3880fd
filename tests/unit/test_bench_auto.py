"""bench/bench_auto.py's repeated runs on hand-made numbers: an option's epoch is the median of its runs',
the verdict judges the medians, the page gives each option's range and whether the chosen and the fastest
option's ranges overlap; rounds recorded with one value per option still render."""
import os

import pytest

import auto_page  # noqa: E402  (bench/ is on pytest's pythonpath: pyproject.toml)


def _round(runs, choice, repeats=3):
    g = {"loadavg_start": 1.0, "loadavg_end": 1.0, "link": {"inter_Bps": 1e8}, "repeats": repeats,
         "rates": {"inter_Bps": 1e8, "intra_Bps": 1e9}, "predicted": {}}
    for name, epochs in runs.items():
        for e in epochs:
            auto_page.record_run(g, name, e, [9.0, e, e])
    g["choice"] = choice
    g["verdict"] = auto_page.verdict(g["measured"], choice)
    return g


def test_record_run_keeps_every_run_beside_their_median():
    g = {}
    for e in (0.30, 0.10, 0.20):
        auto_page.record_run(g, "fb", e, [1.0, e])
    assert g["measured_runs"]["fb"] == [0.30, 0.10, 0.20]
    assert g["measured"]["fb"] == pytest.approx(0.20)
    assert g["run_epochs"]["fb"] == [[1.0, 0.30], [1.0, 0.10], [1.0, 0.20]]
    auto_page.record_run(g, "fb", 0.40, [1.0, 0.40])  # an even count: the mean of the middle two
    assert g["measured"]["fb"] == pytest.approx(0.25)
    auto_page.record_run(g, "x", 2.0, [], key="other")
    assert g["other"] == {"x": 2.0} and g["other_runs"] == {"x": [2.0]} and "x" not in g["measured"]


def test_verdict_judges_medians_and_overlap_is_reported_beside_it():
    # fb: runs 1.0, 1.2, 5.0 (median 1.2); eas: 0.5, 1.25, 1.3 (median 1.25): eas's best run is the fastest
    # of all, but by the medians fb is fastest and eas 1.25 / 1.2 = 1.042x of it
    g = _round({"fb": [1.0, 5.0, 1.2], "eas": [1.3, 0.5, 1.25]}, "eas")
    v = g["verdict"]
    assert v["fastest"] == "fb" and v["ratio"] == pytest.approx(1.25 / 1.2)
    assert v["within_10pct"] and not v["not_slower_than_fb"]
    assert auto_page.ranges_overlap(g, v) == "yes"
    # apart: the 10 % verdict stays as the medians give it, and the page says the ranges do not overlap
    g = _round({"fb": [1.0, 1.05, 1.1], "eas": [1.2, 1.3, 1.25]}, "eas")
    assert not g["verdict"]["within_10pct"] and g["verdict"]["ratio"] == pytest.approx(1.25 / 1.05)
    assert auto_page.ranges_overlap(g, g["verdict"]) == "no"
    assert auto_page.ranges_overlap(_round({"fb": [1.0, 2.0], "eas": [3.0, 4.0]}, "fb"), None) == "-"
    assert auto_page.ranges_overlap(_round({"fb": [1.0, 2.0], "eas": [3.0, 4.0]}, "fb"),
                                    {"fastest": "fb"}) == "same option"
    one = _round({"fb": [1.0], "eas": [1.05]}, "eas", repeats=1)  # one run each: no spread to compare
    assert auto_page.ranges_overlap(one, one["verdict"]) == "-"


def test_overlap_of_ranges():
    assert auto_page.overlap([1.0, 1.1], [1.1, 1.3])  # touching ends
    assert auto_page.overlap([1.0, 2.0], [1.4, 1.5])  # one inside the other
    assert not auto_page.overlap([1.0, 1.1], [1.2, 1.3])
    assert not auto_page.overlap([1.2, 1.3], [1.0, 1.1])


def test_auto_decision_takes_the_choice_most_runs_made():
    runs = [{"choice": "eas", "epoch_s": 0.9, "predicted": {"eas": 1}},
            {"choice": "fb", "epoch_s": 0.5, "predicted": {"fb": 2}},
            {"choice": "fb", "epoch_s": 0.7, "predicted": {"fb": 3}}]
    choice, first, epoch = auto_page.auto_decision(runs)
    assert choice == "fb" and first is runs[1] and epoch == pytest.approx(0.7)
    choice, first, epoch = auto_page.auto_decision(runs[:2])  # a tie: the choice made first
    assert choice == "eas" and first is runs[0] and epoch == pytest.approx(0.7)


def _data(rounds):
    return {"date": "2000-01-01", "argv": [], "log": [], "loadavg_start": [1.0], "loadavg_end": [1.0],
            "config": {"graphs": ["cora"], "vertices": 0, "hidden": 64, "epochs": 3, "memory_per_gpu": "16GiB",
                       "cores": 2, "mem_gib": 24.0, "python": "3"},
            "rates": [{"rate": rate, "inter_Bps": 1e8, "graphs": {"cora": g}} for rate, g in rounds]}


def test_page_gives_medians_ranges_and_overlap_and_renders_old_rounds():
    new = _round({"fb": [1.0, 5.0, 1.2], "eas": [1.3, 0.5, 1.25]}, "eas")
    new["auto_runs"] = [{"choice": "eas", "epoch_s": e} for e in (1.4, 1.1, 1.2)]
    new["auto_epoch_s"] = 1.2
    old = {"loadavg_start": 1.0, "link": {"inter_Bps": 1e8}, "measured": {"fb": 1.0, "eas": 2.0},
           "choice": "fb", "auto_epoch_s": 1.5, "rates": {}, "predicted": {}}
    page = "\n".join(auto_page.render(_data([("unshaped", new), ("10mbit", old)])))
    assert "ran 3 times per (graph, rate)" in page
    assert "| cora | unshaped (stopped: 2 of 8 options run) | eas | fb | 1.04 | yes | no | 1 | 0.5-1.3; 1-5 | yes |" \
        in page
    # an old round: one value per option, no runs to range
    assert "| cora | 10mbit (stopped: 2 of 8 options run) | fb | fb | 1.00 | yes | yes | 1.5 | -; - | same option |" \
        in page
    assert "| fb | 1.2 | - | - | - / - / - / - | 3, 1-5 |" in page
    assert "| eas **(auto)** | 1.25 | - | - | - / - / - / - | 3, 0.5-1.3 |" in page
    assert "| fb **(auto)** | 1 | - | - | - / - / - / - | - |" in page
    assert "its own 3 runs' epoch: median 1.2 s, 1.1-1.4 s." in page
    assert "Their runs' ranges overlap: the difference is within this machine's spread." in page
    new["auto_runs"][1]["choice"] = "fb"  # auto's runs differ: the page says how many made the choice judged
    page = "\n".join(auto_page.render(_data([("unshaped", new)])))
    assert "| cora | unshaped (stopped: 2 of 8 options run) | eas (2 of 3 runs) | fb | 1.04 |" in page
    assert "They chose eas in 2, fb in 1; the verdict judges the choice most of them made" in page
    # a page of old rounds alone says nothing of repeats
    old_page = "\n".join(auto_page.render(_data([("10mbit", old)])))
    assert "per (graph, rate)" not in old_page and "Ranges overlap:" not in old_page


def test_products_runs_each_option_repeats_times_in_turn(monkeypatch, tmp_path):
    """auto_reshaped.sweep: every option --repeats runs over every rate, in turn; the byte runs once."""
    import argparse

    import auto_reshaped
    rates = ["unshaped", "10mbit"]
    # each run's epoch at each rate, by its run directory
    epochs = {"fb-run1": [0.5, 2.0], "eas-run1": [0.7, 2.4], "fb-run2": [0.3, 1.0], "eas-run2": [0.4, 1.1]}
    order = []

    def fake_run(run, cmd, run_dir, args, log):
        name = os.path.basename(run_dir)
        order.append(name)
        return {r: {"epoch_s": epochs.get(name, [9.0, 9.0])[k], "epochs": [1.0], "bytes": {"inter_halo": 1},
                    "peak_rss": [len(order), 0, 0, 0], "run_wall_s": 1.0} for k, r in enumerate(rates)}

    monkeypatch.setattr(auto_reshaped, "run_reshaped", fake_run)
    data = {"rates": [{"rate": r, "graphs": {"products": {"measured": {}, "predicted": {"fb": {}, "eas": {}}}}}
                      for r in rates]}
    args = argparse.Namespace(rates=rates, repeats=2, memory_budget=1e9, over_estimate=False, work=str(tmp_path),
                              epochs=3)
    auto_reshaped.sweep(data, "products", [("fb", "full", []), ("eas", "eas", []), ("flx k=3", "full", [])],
                        {("products", "full"): "F", ("products", "eas"): "E"}, lambda s, e, d, n: [],
                        None, args, [], lambda: None)
    # flx k=3 is not among auto's options (its table): not run; the byte runs once, in the first turn
    assert order == ["fb-run1", "eas-run1", "fbroutedirect-run1", "fbpayloadpartial-inputdropout0-run1",
                     "fbpayloadsmaller-inputdropout0-run1", "fb-run2", "eas-run2"]
    g0, g1 = (r["graphs"]["products"] for r in data["rates"])
    assert g0["measured_runs"] == {"fb": [0.5, 0.3], "eas": [0.7, 0.4]}
    assert g0["measured"] == {"fb": pytest.approx(0.4), "eas": pytest.approx(0.55)}
    assert g1["measured_runs"] == {"fb": [2.0, 1.0], "eas": [2.4, 1.1]}
    assert g1["measured"] == {"fb": pytest.approx(1.5), "eas": pytest.approx(1.75)}
    assert g0["other_runs"]["fb route=direct"] == [9.0] and g0["options"] == ["fb", "eas"]
    assert g0["runs"]["fb"]["peak_rss"] == [6, 0, 0, 0] and g0["runs"]["fb"]["run_wall_s"] == [1.0, 1.0]
