"""The link-rate sweep (bench/bench_cluster.py) and its cost model (emucluster/costmodel.py), without
root: a run's summary, the leave-one-out prediction, the sweep's rounds and page, and `granndis report
--sweep` over the runs."""
import json
import os
import shutil

import pytest

import bench_cluster  # bench/ is on pytest's pythonpath (pyproject.toml)
from emucluster import cluster as emu, costmodel

# ---- cost model and sweep ----------------------------------------------------------------------

def record(epoch, time_s, compute, inter, intra=0.01, grad=0.01, inter_bytes=10**6, test_acc=None):
    r = {"epoch": epoch, "time_s": time_s, "compute_s": compute, "inter_comm_s": inter, "intra_comm_s": intra,
         "grad_sync_s": grad, "sampling_s": 0.0, "loss": 1.0,
         "bytes": {"intra_halo": 500, "inter_halo": inter_bytes, "intra_grad": 10, "inter_grad": 20},
         "max_rank_bytes": {"intra_halo": 300, "inter_halo": inter_bytes // 2 + 7, "intra_grad": 5, "inter_grad": 20},
         "inter_bytes_per_server": [inter_bytes // 2 - 7, inter_bytes // 2 + 27],
         "rows_per_layer": [{"rank": 0, "rows_computed": [30, 20, 10]}, {"rank": 1, "rows_computed": [40, 20, 5]}]}
    if test_acc is not None:
        r["test_acc"] = test_acc
    return r


def test_summarize_run_leaves_out_the_first_epoch():
    recs = [record(0, 9.0, 8.0, 1.0), record(1, 1.0, 0.5, 0.4), record(2, 2.0, 0.7, 1.2),
            record(3, 1.2, 0.6, 0.5, test_acc=0.42)]
    s = costmodel.summarize_run(recs)
    assert s["epoch_s"] == 1.2 and s["compute"] == 0.6 and s["inter_comm"] == 0.5 and s["epochs_used"] == 3
    assert s["test_acc"] == 0.42 and s["bytes"]["inter_halo"] == 10**6
    # the cost model's exact counts: rows over ranks and layers (x steps), the busiest server and rank
    assert s["rows"] == 125 and costmodel.summarize_run(recs, steps=2)["rows"] == 250
    assert s["inter_bytes_max_server"] == 10**6 // 2 + 27 and s["intra_bytes_max_rank"] == 305
    old = [{k: v for k, v in r.items() if k not in ("rows_per_layer", "max_rank_bytes", "inter_bytes_per_server")}
           for r in recs]
    assert costmodel.summarize_run(old)["rows"] is None
    with pytest.raises(ValueError):
        costmodel.summarize_run([])


def model_run(epoch, rows, inter_max, intra_max=0, inter_total=None):
    return {"epoch_s": epoch, "rows": rows, "inter_bytes_max_server": inter_max, "intra_bytes_max_rank": intra_max,
            "compute": 0.3, "sampling": 0.0, "intra_comm": 0.1, "grad_sync": 0.05, "inter_comm": 0.0,
            "bytes": {"intra_halo": 0, "inter_halo": inter_total or 2 * inter_max, "intra_grad": 0, "inter_grad": 0},
            "test_acc": 0.5}


K = {"fb": 2e-6, "flx": 1e-6, "eas": 1.5e-6}   # cost per row of each mode (s) at load factor 1
ROWS = {"fb": 1000, "flx": 3000, "eas": 2000}
BYTES = {"fb": (10**7, 10**6), "flx": (1000, 0), "eas": (1000, 0)}   # (busiest server inter, busiest rank intra)


def one_round(label, bw, load, off=None, bps=None):
    """fb, flx, eas whose epochs are exactly rows * k * load + wire time; `off` = (mode, factor on its epoch)."""
    runs = {}
    for m in K:
        inter, intra = BYTES[m]
        epoch = ROWS[m] * K[m] * load + inter / bw + intra / 1e9
        runs[m] = model_run(epoch * (off[1] if off and off[0] == m else 1.0), ROWS[m], inter, intra)
    return {"label": label, "rate_bps": bps, "bw_Bps": bw, "pingpong": {"intra_Bps": 1e9}, "runs": runs}


def test_cost_model_predicts_each_run_from_the_others():
    # the load drifts: the unshaped round computes 3x slower than the 100mbit one
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8),
              one_round("25mbit", 2.5e6, 2.0, bps=25 * 10**6)]
    fit = costmodel.model_sweep(rounds, servers=2)
    for rnd in rounds:
        for mode, run in rnd["runs"].items():
            assert run["model_error"] == pytest.approx(0.0, abs=1e-6), (rnd["label"], mode)
    assert fit["load_factor"] == pytest.approx([1.0, 1 / 3, 2 / 3])
    assert fit["cost_per_row_s"] == pytest.approx({m: 3 * k for m, k in K.items()})
    fb = rounds[1]["runs"]["fb"]
    assert fb["wire_s"] == pytest.approx(10**7 / 1e7 + 10**6 / 1e9)   # busiest server / inter + busiest rank / intra
    # a ping-pong above the shaped rate's TCP payload (a free tbf burst per message) is capped at it
    fast = dict(rounds[2], bw_Bps=3.2e6)
    assert costmodel.link_bandwidth(fast) == pytest.approx(25e6 / 8 * 1448 / 1514)
    assert costmodel.link_bandwidth(rounds[2]) == 2.5e6 and costmodel.link_bandwidth(rounds[0]) == 1e8
    # the previous model takes every round's local seconds from the unshaped run: off by more than 25 %
    assert rounds[1]["runs"]["flx"]["model_error_unshaped"] > 0.25


def test_cost_model_never_calibrates_a_run_on_itself():
    # fb at 100mbit took twice what the others predict: that run shows the error, the others stay exact-ish
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, off=("fb", 2.0), bps=10**8),
              one_round("25mbit", 2.5e6, 2.0, bps=25 * 10**6)]
    costmodel.model_sweep(rounds, servers=2)
    fb = rounds[1]["runs"]["fb"]
    assert fb["model_error"] == pytest.approx((fb["predicted_s"] - fb["epoch_s"]) / fb["epoch_s"])
    # fb's cost per row comes from its other rounds, the round's load from flx and eas: the true epoch
    assert fb["predicted_s"] == pytest.approx(fb["epoch_s"] / 2)
    assert rounds[0]["runs"]["flx"]["model_error"] != pytest.approx(0.0, abs=1e-3)  # its fit saw the bad run


def test_cost_model_refuses_what_it_cannot_compute():
    two = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8)]
    with pytest.raises(ValueError, match="include 'unshaped'"):
        costmodel.model_sweep([two[1], one_round("50mbit", 5e6, 1.0, bps=5 * 10**7)], servers=2)
    with pytest.raises(ValueError, match="at least 2 modes and 2 rounds"):
        costmodel.model_sweep(two[:1], servers=2)
    with pytest.raises(ValueError, match="inter-server bandwidth must be positive"):
        costmodel.model_sweep([dict(two[0], bw_Bps=0), two[1]], servers=2)
    two[0]["runs"]["flx"]["rows"] = None
    with pytest.raises(ValueError, match="no rows_per_layer"):
        costmodel.model_sweep(two, servers=2)


def test_speedups_and_the_paper_share():
    fb = dict(model_run(1.45, 1000, 10**7), inter_comm=1.0)
    rate = {"label": "100mbit", "runs": {"fb": fb, "flx": model_run(0.5, 3000, 1000)}}
    unshaped = {"label": "unshaped", "runs": {"fb": dict(fb, epoch_s=0.6, inter_comm=0.1), "flx": rate["runs"]["flx"]}}
    assert costmodel.speedups(rate)["flx"] == pytest.approx(1.45 / 0.5)
    assert costmodel.inter_share(fb) == pytest.approx(1.0 / 1.45)
    assert costmodel.paper_like_rates([unshaped, rate]) == ["100mbit"]  # 69 % is in 44-86 %; 17 % is not


def test_sweep_rounds_alternate_fast_and_slow_then_repeat_unshaped():
    rates = bench_cluster.parse_rates(bench_cluster.DEFAULT_RATES)
    assert [label for label, _, _ in bench_cluster.round_order(rates)] == [
        "unshaped", "25mbit", "1gbit", "50mbit", "250mbit", "100mbit", "unshaped-repeat"]
    assert bench_cluster.round_order(rates, repeat=False)[-1] == ("100mbit", 10**8, False)
    assert bench_cluster.round_order(rates[:1]) == [("unshaped", None, False), ("unshaped-repeat", None, True)]


def test_sweep_page_flags_a_model_error_over_25_percent():
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, off=("flx", 2.0), bps=10**8)]
    repeat = [one_round("unshaped-repeat", 1e8, 2.0)]
    for i, r in enumerate(rounds + repeat):
        r.update(round=i, loadavg_1min=3.0 + i)
    sweep = {"date": "2026-12-01", "modes": ["fb", "flx", "eas"], "rates": rounds, "repeat": repeat, "log": ["cmd one"],
             "graph": {"vertices": 20000, "layers": 3, "hidden": 64, "epochs": 5},
             "loadavg_start": [3.0, 2.5, 2.0], "loadavg_end": [5.0, 4.0, 3.0]}
    sweep["model_fit"] = costmodel.model_sweep(bench_cluster.all_rounds(sweep), servers=2)
    page = bench_cluster.render(sweep, ["--epochs", "5"])
    (off,) = [line for line in page.splitlines() if line.startswith("Largest error: ")]
    assert "flx at 100mbit" in off and "fb at" not in off   # a 2x slow flx run is flagged, fb is wire time
    assert "before the sweep: 3.0 / 2.5 / 2.0; after: 5.0 / 4.0 / 3.0" in page
    assert "| 2 | unshaped-repeat | 5.0 |" in page and "| flx | 3,000 |" in page
    assert "python bench/bench_cluster.py --epochs 5" in page and "cmd one" in page
    ok = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8)]
    costmodel.model_sweep(ok, servers=2)
    assert "Every prediction is within 25 %" in bench_cluster.render(dict(sweep, rates=ok, repeat=[]), [])


def test_sweep_modes_and_rates():
    assert bench_cluster.parse_modes("flx,fb,eas") == ["fb", "flx", "eas"]
    for bad, words in (("flx,eas", "must include fb"), ("fb,flx-k9", "unknown mode"), ("fb,fb", "twice")):
        with pytest.raises(ValueError, match=words):
            bench_cluster.parse_modes(bad)
    assert bench_cluster.parse_rates("25mbit,unshaped,1gbit") == [("unshaped", None), ("1gbit", 10**9),
                                                                   ("25mbit", 25_000_000)]
    with pytest.raises(ValueError, match="must include 'unshaped'"):
        bench_cluster.parse_rates("25mbit,1gbit")
    with pytest.raises(ValueError, match="twice"):
        bench_cluster.parse_rates("unshaped,1gbit,1000mbit")
    # every mode names a shard set that exists, and the k < L rows are there to switch on
    assert all(shards in bench_cluster.SHARD_SETS for shards, _, _ in bench_cluster.MODES.values())
    assert {"flx-k1", "flx-k2"} <= set(bench_cluster.MODES)


def test_sweep_refuses_without_root(monkeypatch, capsys):
    monkeypatch.setattr(emu.os, "geteuid", lambda: 1000)
    assert bench_cluster.main(["--rates", "unshaped,100mbit"]) == emu.EXIT_REFUSED
    assert "needs root" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cluster.main(["--rates", "100mbit"])               # usage error before privileges
    assert "must include 'unshaped'" in capsys.readouterr().err


def test_state_file_errors_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv(emu.ENV_STATE_DIR, str(tmp_path))
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(emu.EmuError, match="teardown"):
        emu.read_state()
    st = emu.layout(2, str(tmp_path))
    emu.write_state(st)
    assert json.loads((tmp_path / "state.json").read_text())["servers"] == 2


# ---- granndis report --sweep -------------------------------------------------------------------

LINKS = (("unshaped", None, 1.4e8, 0.6), ("25mbit", 25_000_000, 2.9e6, 4.0), ("100mbit", 10**8, 1.1e7, 1.5))


def write_sweep(root, modes=("fb", "flx", "eas")):
    """Run directories as bench_cluster.py leaves them: ROOT/LABEL/MODE, each with its link.json."""
    from tests.unit.test_report import write_run
    for label, bps, bw, fb_s in LINKS:
        (root / label).mkdir(parents=True)
        for m in modes:
            run, summary = write_run(root / label, m, m)
            (run / "summary.json").write_text(json.dumps({**summary, "epoch_time_s": fb_s if m == "fb" else 0.5}))
            (run / "link.json").write_text(json.dumps({"label": label, "rate_bps": bps, "bw_Bps": bw,
                                                       "intra_Bps": 1e9}))
    return root


def test_report_sweep_plots_speedup_against_rate(tmp_path, capsys):
    from granndis_hpc.report.command import main as report_main
    path = write_sweep(tmp_path / "runs")
    out = tmp_path / "rep"
    assert report_main(["--sweep", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "speedup_vs_rate.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = [ln for ln in printed.splitlines() if ln.startswith("| ")]
    # sorted by rate: 25 Mbit/s, 100 Mbit/s, then unshaped at its measured 1,120 Mbit/s
    assert lines[1].split("|")[1].strip() == "25mbit" and "8.00x" in lines[1]
    assert "100mbit" in lines[2] and "3.00x" in lines[2]
    assert "unshaped (measured)" in lines[3] and "1,120" in lines[3] and "1.20x" in lines[3]
    assert (out / "speedup_vs_rate.md").read_text().count("8.00x") == 2   # flx and eas


def test_report_sweep_errors(tmp_path, capsys):
    from granndis_hpc.report.command import main as report_main
    assert report_main(["--sweep", str(write_sweep(tmp_path / "a", modes=("flx", "eas")))]) == 2
    assert "no run named 'fb'" in capsys.readouterr().err
    assert report_main(["--sweep", str(tmp_path / "missing")]) == 2
    assert "no run directories" in capsys.readouterr().err
    bad = write_sweep(tmp_path / "b")
    shutil.rmtree(bad / "25mbit" / "eas")
    assert report_main(["--sweep", str(bad)]) == 2
    assert "link '25mbit': no run of 'eas'" in capsys.readouterr().err
    os.remove(bad / "100mbit" / "flx" / "link.json")
    assert report_main(["--sweep", str(bad)]) == 2
    assert "no link.json" in capsys.readouterr().err
    (bad / "100mbit" / "flx" / "link.json").write_text(json.dumps({"label": "100mbit", "bw_Bps": 0, "intra_Bps": 1}))
    assert report_main(["--sweep", str(bad)]) == 2
    assert "'bw_Bps' must be a positive number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([])                                          # neither runs nor --sweep
    with pytest.raises(SystemExit):
        report_main(["somerun", "--sweep", str(bad)])



def _counted(run):
    """3 sage layers on the world view (fb), 1000 rows each, 100 send rows, 1,000 of 10,000 edges from
    halo rows (the overlap limit's per-layer counts, granndis_hpc/report/linkmodel.py)."""
    run["layers"], run["model"], run["overlap"], run["overlap_halos"] = 3, "sage", True, ["world"]
    run["layer_counts"] = [{"group": "world", "rows_computed": 1000, "rows_held": 1200, "send_rows": 100,
                            "halo_rows": 200, "edges": 10_000, "halo_edges": 1_000}] * 3
    return run


def test_the_sweep_model_uses_the_product_overlap_limit():
    """costmodel.overlap_limit is linkmodel's (tests/unit/test_linkmodel.py works it by hand): compute
    0.6 s (0.1 s per layer and direction), 1 s of halo wire (0.25 s per exchange), windows 0.099 s and
    0.18 s, gradient wire additive."""
    run = _counted(model_run(2.0, 1000, inter_max=10**7 + 500, intra_max=0))
    run["bytes"]["inter_grad"] = 1000  # 500 per leader on 2 servers
    bw = (1e7, 1e9)
    grad_wire = 500 / 1e7
    assert costmodel.overlap_limit(run, 0.6, bw, servers=2) == pytest.approx(0.6 + 0.302 + 0.14 + grad_wire)
    run["overlap"] = False  # a --no-overlap run: the additive compute + wire
    assert costmodel.overlap_limit(run, 0.6, bw, servers=2) == pytest.approx(1.6 + grad_wire)


def test_one_rank_per_server_needs_no_intra_link():
    """2 servers x 1 rank (bench_cluster.py --ranks-per-server 1): no intra-server bytes, no intra
    bandwidth measured; the wire and the overlap limit are the inter-server terms alone."""
    from granndis_hpc.report.linkmodel import wire_s
    run = _counted(model_run(2.0, 1000, inter_max=10**7 + 500, intra_max=0))
    run["bytes"]["inter_grad"], run["bytes"]["intra_grad"] = 1000, 0
    assert wire_s(run, 1e7, None) == pytest.approx((10**7 + 500) / 1e7)
    assert costmodel.overlap_limit(run, 0.6, (1e7, None), servers=2) == pytest.approx(1.042 + 500 / 1e7)
    run["intra_bytes_max_rank"] = 10
    with pytest.raises(ValueError, match="intra-server"):
        wire_s(run, 1e7, None)
