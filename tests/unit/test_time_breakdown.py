"""The epoch-time breakdown adds up: `make demo` printed "Epoch time (s) 1.3205 |
Comm (s/epoch) 1.4863" because per-part maxima (over ranks) and per-part medians (over epochs) were
added.  summary.json's seconds_per_epoch are now the parts of the median epoch (the slowest rank's own,
trainer._epoch_record; tests/mpi/test_epoch_bytes.py checks a real epoch record)."""
import pytest

from granndis_hpc.metrics import summarize

PARTS = ("compute", "intra_comm", "inter_comm", "grad_sync", "sampling")


def test_summary_parts_add_up_to_the_epoch_time():
    # Epochs whose slow part alternates: part-wise medians would sum to 1.5 s against 1.0 s epochs.
    recs = []
    for e, (comm, compute) in enumerate([(0.9, 0.1), (0.1, 0.9), (0.9, 0.1), (0.1, 0.9), (0.5, 0.5)]):
        recs.append({"epoch": e, "time_s": 1.0 + 0.01 * e, "intra_comm_s": 0.0, "inter_comm_s": comm,
                     "grad_sync_s": 0.0, "compute_s": compute + 0.01 * e, "sampling_s": 0.0, "bytes": {k: 0 for k in
                     ("intra_halo", "inter_halo", "intra_grad", "inter_grad")}})
    s = summarize(recs, {"mode": "fb", "model": "sage", "layers": 2}, None, 0, {"servers": 2, "ranks_per_server": 2},
                  5.0)
    total = sum(s["seconds_per_epoch"][k] for k in PARTS)
    assert total == pytest.approx(s["epoch_time_s"]) == pytest.approx(1.02)
    assert s["seconds_per_epoch"]["inter_comm"] == pytest.approx(0.9)  # epoch 2, the median one
    # An even count (`make demo` trains 10 epochs): the lower median epoch, not the mean of the middle two.
    s = summarize(recs[:4], {"mode": "fb", "model": "sage", "layers": 2}, None, 0, {"servers": 2,
                                                                                    "ranks_per_server": 2},
                  5.0)
    assert sum(s["seconds_per_epoch"][k] for k in PARTS) == pytest.approx(s["epoch_time_s"]) == pytest.approx(1.01)


def test_report_flags_a_speedup_against_unlike_settings(tmp_path):
    """An eas run with dropout 0.5 compared with an fb run with dropout 0 is flagged."""
    import json

    from granndis_hpc.report.command import render_report
    from tests.unit.test_report import table_rows, write_run

    fb, _ = write_run(tmp_path, "fb", "fb", seed=1)
    eas, _ = write_run(tmp_path, "eas", "eas", seed=2)
    for run, dropout in ((fb, 0.0), (eas, 0.5)):
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "dropout": dropout}))
    result = render_report([str(fb), str(eas)], str(tmp_path / "report"))
    rows = table_rows(result["table"])
    assert rows[0]["Speedup vs FB"] == "1.00x" and rows[1]["Speedup vs FB"].endswith("x*")
    assert result["notes"] == [f"* {rows[1]['Method']}: its speedup compares against {rows[0]['Method']}, whose "
                               f"settings differ (dropout 0.5 vs 0.0): not like with like; give an fb run with the "
                               f"same settings"]
    assert result["notes"][0] in (tmp_path / "report" / "report.md").read_text()
    fb2, _ = write_run(tmp_path, "fb2", "fb", seed=3)  # an fb run alike: preferred, no mark
    config = json.loads((fb2 / "config.json").read_text())
    (fb2 / "config.json").write_text(json.dumps({**config, "dropout": 0.5}))
    result = render_report([str(fb), str(fb2), str(eas)], str(tmp_path / "report2"))
    assert not table_rows(result["table"])[2]["Speedup vs FB"].endswith("*") and result["notes"] == []


def test_the_run_keeps_only_what_the_summary_reads():
    """Rank 0 keeps no whole epoch record in memory (with cob's per-rank rows accounting, ~6.6 KB per epoch:
    372 -> 391 MB over 3000 epochs); the summary reads only these fields."""
    from granndis_hpc.metrics import summary_fields

    rec = {"epoch": 3, "time_s": 1.0, "compute_s": 0.5, "intra_comm_s": 0.2, "inter_comm_s": 0.1, "grad_sync_s": 0.1,
           "sampling_s": 0.1, "bytes": {k: 1 for k in ("intra_halo", "inter_halo", "intra_grad", "inter_grad")},
           "activation_memory_bytes": 7, "rows_per_layer": [{"rank": r, "rows_held": [1] * 3} for r in range(64)],
           "redundancy": 1.5, "loss": 0.3, "max_rank_bytes": {}, "inter_bytes_per_server": [1, 2]}
    slim = summary_fields(rec)
    assert "rows_per_layer" not in slim and "redundancy" not in slim
    config = {"mode": "cob", "model": "sage", "layers": 2}
    shape = {"servers": 2, "ranks_per_server": 2}
    assert summarize([slim] * 3, config, None, 0, shape, 1.0) == summarize([rec] * 3, config, None, 0, shape, 1.0)
