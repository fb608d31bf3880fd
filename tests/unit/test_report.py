"""granndis report: two synthetic runs written here -> PNGs, report.md, and a table checked value by value."""
import json
import os
import random
import subprocess
import sys

import pytest

from granndis_hpc.report import plots
from granndis_hpc.report.command import ReportError, main, render_report
from granndis_hpc.report.data import accuracy_over_time, load_run, loss_over_time
from granndis_hpc.report.plots import plot_learning_rate, run_style

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(root, name, mode, model="sage", layers=3, epochs=12, eval_every=4, servers=2, rps=2,
              sampling=0.0, seed=0, test_acc=0.8):
    """A run directory as granndis-train writes it, with random but self-consistent numbers."""
    rng = random.Random(seed)
    run = root / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"mode": mode, "model": model, "layers": layers,
                                                 "hidden": 64, "epochs": epochs, "out": str(run)}))
    phases = {"compute": rng.uniform(0.01, 0.05), "intra_comm": rng.uniform(0.001, 0.01),
              "inter_comm": rng.uniform(0.0, 0.08), "grad_sync": rng.uniform(0.001, 0.004), "sampling": sampling}
    byte_counts = {"intra_halo": rng.randrange(10**5, 10**7), "inter_halo": rng.randrange(0, 10**8),
                   "intra_grad": rng.randrange(10**3, 10**5), "inter_grad": rng.randrange(10**3, 10**5)}
    with open(run / "metrics.jsonl", "w") as f:
        for epoch in range(epochs):
            rec = {"epoch": epoch, "time_s": sum(phases.values()) * rng.uniform(1.0, 1.2), "loss": 2.0 / (1 + epoch),
                   "bytes": byte_counts, "peak_memory_bytes": 10**8,
                   **{k + "_s": v * rng.uniform(0.9, 1.1) for k, v in phases.items()}}
            if epoch % eval_every == eval_every - 1:
                rec.update(train_acc=rng.random(), val_acc=rng.random(), test_acc=rng.random())
            f.write(json.dumps(rec) + "\n")
    epoch_time = sum(phases.values()) * 1.1
    summary = {"mode": mode, "model": model, "layers": layers, "servers": servers, "ranks_per_server": rps,
               "epochs": epochs, "epoch_time_s": epoch_time, "seconds_per_epoch": phases,
               "bytes_per_epoch": byte_counts, "accuracy": {"train": 0.9, "val": 0.81, "test": test_acc},
               "peak_memory_bytes": 10**8, "total_time_s": epoch_time * epochs + 3.5}
    (run / "summary.json").write_text(json.dumps(summary))
    return run, summary


def table_rows(table):
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1]) <= {"|", "-"}
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def check_png(path):
    assert os.path.isfile(path)
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == PNG_SIGNATURE and os.path.getsize(path) > 1000, path


def test_two_runs_table_and_plots(tmp_path):
    fb, fb_sum = write_run(tmp_path, "fb-101", "fb", seed=1, test_acc=0.7934)
    flx, flx_sum = write_run(tmp_path, "flx-102", "flx", seed=2, test_acc=0.8011, sampling=0.004)
    out = tmp_path / "report"
    result = render_report([str(fb), str(flx)], str(out))

    assert [os.path.basename(p) for p in result["pngs"]] == ["time_breakdown.png", "accuracy.png",
                                                             "time_to_accuracy.png", "bytes.png"]
    for png in result["pngs"]:
        check_png(png)
        assert os.path.dirname(png) == str(out)

    rows = table_rows(result["table"])
    assert [r["Method"] for r in rows] == ["FB sage L=3", "FLX sage L=3"]
    for row, s in zip(rows, (fb_sum, flx_sum)):
        assert row["Servers x GPUs"] == "2x2" and row["Epochs"] == "12"
        assert float(row["Epoch time (s)"]) == pytest.approx(s["epoch_time_s"], abs=5e-5)
        comm = sum(s["seconds_per_epoch"][k] for k in ("intra_comm", "inter_comm", "grad_sync"))
        assert float(row["Comm (s/epoch)"]) == pytest.approx(comm, abs=5e-5)
        assert float(row["Total time (s)"]) == pytest.approx(s["total_time_s"], abs=5e-3)
        assert float(row["Test acc"]) == pytest.approx(s["accuracy"]["test"], abs=5e-5)
    assert rows[0]["Speedup vs FB"] == "1.00x"
    expected = fb_sum["epoch_time_s"] / flx_sum["epoch_time_s"]
    assert rows[1]["Speedup vs FB"] == f"{expected:.2f}x"

    md = (out / "report.md").read_text()
    assert result["markdown"] == str(out / "report.md")
    assert result["table"] in md and "![accuracy](accuracy.png)" in md and str(fb) in md


def test_speedup_na_without_matching_fb_and_duplicate_labels(tmp_path):
    a, _ = write_run(tmp_path, "flx-a", "flx", seed=3)
    b, _ = write_run(tmp_path, "flx-b", "flx", seed=4)
    fb_other, _ = write_run(tmp_path, "fb-gcn", "fb", model="gcn", seed=5)   # other model: not a baseline
    fb_shape, _ = write_run(tmp_path, "fb-4x4", "fb", servers=4, rps=4, seed=6)  # other cluster shape
    result = render_report([a, b, fb_other, fb_shape], tmp_path / "out")
    rows = table_rows(result["table"])
    assert [r["Method"] for r in rows] == ["FLX sage L=3 [flx-a]", "FLX sage L=3 [flx-b]", "FB gcn L=3",
                                           "FB sage L=3"]
    assert [r["Speedup vs FB"] for r in rows] == ["n/a", "n/a", "1.00x", "1.00x"]


def test_runs_without_accuracy_still_render(tmp_path):
    run, summary = write_run(tmp_path, "eas-1", "eas", eval_every=10**6, seed=7)
    summary["accuracy"] = {"train": None, "val": None, "test": None}
    (run / "summary.json").write_text(json.dumps(summary))
    result = render_report([run], tmp_path / "out")
    assert table_rows(result["table"])[0]["Test acc"] == "n/a"
    for png in result["pngs"]:
        check_png(png)


def test_main_prints_table_and_paths(tmp_path, capsys):
    fb, _ = write_run(tmp_path, "fb-1", "fb", seed=8)
    flx, _ = write_run(tmp_path, "flx-2", "flx", seed=9)
    assert main([str(fb), str(flx), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "| Method" in out and "FLX sage L=3" in out
    for name in ("time_breakdown.png", "accuracy.png", "time_to_accuracy.png", "bytes.png", "report.md"):
        assert str(tmp_path / "r" / name) in out
    # one run and no --out: the plots go into the run directory
    assert main([str(flx)]) == 0
    check_png(str(flx / "bytes.png"))


@pytest.mark.parametrize("breakage, message", [
    (lambda run: os.remove(run / "summary.json"), "no summary.json, and neither its shard set nor its records"),
    (lambda run: os.remove(run / "metrics.jsonl"), "metrics.jsonl not found"),
    (lambda run: os.remove(run / "config.json"), "config.json not found"),
    (lambda run: (run / "summary.json").write_text('{"mode": "fb", '), "summary.json is not readable JSON"),
    (lambda run: open(run / "metrics.jsonl", "a").write('{"epoch": 12, "time_s"'), "metrics.jsonl line 13"),
    (lambda run: (run / "metrics.jsonl").write_text(""), "no epoch records"),
    (lambda run: (run / "summary.json").write_text(json.dumps({**json.loads((run / "summary.json").read_text()),
                                                               "epoch_time_s": "fast"})),
     "'epoch_time_s' must be number"),
    (lambda run: (run / "summary.json").write_text(json.dumps({**json.loads((run / "summary.json").read_text()),
                                                               "mode": "flx"})),
     "different runs"),
])
def test_missing_or_corrupt_files_name_run_and_file(tmp_path, capsys, breakage, message):
    good, _ = write_run(tmp_path, "fb-ok", "fb", seed=10)
    bad, _ = write_run(tmp_path, "broken-run", "fb", seed=11)
    breakage(bad)
    with pytest.raises(ReportError) as err:
        render_report([good, bad], tmp_path / "out")
    assert str(bad) in str(err.value) and message in str(err.value), str(err.value)
    assert main([str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_an_unfinished_run_is_reported_from_its_epochs(tmp_path):
    """A run still running (or stopped) has no summary.json: its epochs so far are reported, marked."""
    fb, _ = write_run(tmp_path, "fb-1", "fb", seed=21)
    flx, _ = write_run(tmp_path, "flx-1", "flx", seed=22, epochs=12)
    os.remove(flx / "summary.json")
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"servers": 2, "gpus_per_server": 2}))
    config = json.loads((flx / "config.json").read_text())
    (flx / "config.json").write_text(json.dumps({**config, "shards": str(shards), "epochs": 40}))
    result = render_report([fb, flx], tmp_path / "out")
    rows = table_rows(result["table"])
    assert rows[1]["Epochs"] == "12 (unfinished)" and rows[1]["Servers x GPUs"] == "2x2"
    records = [json.loads(line) for line in (flx / "metrics.jsonl").read_text().splitlines()]
    times = sorted(r["time_s"] for r in records)
    assert float(rows[1]["Epoch time (s)"]) == pytest.approx(times[(len(times) - 1) // 2], abs=1e-4)
    last = [r for r in records if "test_acc" in r][-1]
    assert float(rows[1]["Test acc"]) == pytest.approx(last["test_acc"], abs=1e-4)
    assert "unfinished: 12 of 40 epochs" in (tmp_path / "out" / "report.md").read_text()
    for png in result["pngs"]:
        check_png(png)


def test_time_to_accuracy_counts_start_up(tmp_path):
    run, summary = write_run(tmp_path, "fb-1", "fb", seed=23)
    summary["startup_s"] = {"total": 30.0}
    (run / "summary.json").write_text(json.dumps(summary))
    loaded = load_run(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = accuracy_over_time(loaded)[0]
    evaluated = next(i for i, r in enumerate(records) if "val_acc" in r)
    assert first[0] == pytest.approx(30.0 + sum(r["time_s"] for r in records[:evaluated + 1]))
    assert loss_over_time(loaded)[0][0] == pytest.approx(30.0 + records[0]["time_s"])
    assert len(loss_over_time(loaded)) == len(records)


def test_a_constant_learning_rate_is_said_not_drawn(tmp_path, monkeypatch):
    runs = []
    for i in range(2):
        run, _ = write_run(tmp_path, f"fb-{i}", "fb", seed=30 + i)
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "lr": 0.01}) + "\n" for r in records))
        runs.append(load_run(run))
    check_png(plot_learning_rate(runs, str(tmp_path / "lr.png")))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    plot_learning_rate(runs, str(tmp_path / "again.png"))
    axes = figures[0].axes[0]
    assert [t.get_text() for t in axes.texts] == ["constant learning rate 0.01 in every run"] and not axes.lines


def test_coinciding_runs_get_distinct_styles():
    styles = {(run_style(i, 100)["linestyle"], run_style(i, 100)["marker"]) for i in range(4)}
    assert len(styles) == 4 and run_style(0, 100)["markevery"] == 100 // 12


def test_time_to_accuracy_sums_epoch_times(tmp_path):
    """Validation accuracy against the training time up to each evaluated epoch: the running sum of
    metrics.jsonl's time_s, recomputed here from the file; a run evaluated more often has more points."""
    fb, _ = write_run(tmp_path, "fb-t", "fb", seed=14, eval_every=4)
    flx, _ = write_run(tmp_path, "flx-t", "flx", seed=15, eval_every=3)
    for run, evaluated in ((fb, [3, 7, 11]), (flx, [2, 5, 8, 11])):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        want = [(sum(r["time_s"] for r in records[:e + 1]), records[e]["val_acc"]) for e in evaluated]
        got = accuracy_over_time(load_run(run))
        assert [pytest.approx(w) for w in want] == got
    result = render_report([fb, flx], tmp_path / "out")
    check_png(result["pngs"][2])
    assert "![time_to_accuracy](time_to_accuracy.png)" in (tmp_path / "out" / "report.md").read_text()


def test_best_validation_epoch_is_shown_beside_the_last(tmp_path):
    """summary.json's best_val (the recipe's selection) gets its own column; older summaries say n/a."""
    best, summary = write_run(tmp_path, "fb-best", "fb", seed=12, test_acc=0.8011)
    summary["best_val"] = {"epoch": 179, "train": 0.99, "val": 0.792, "test": 0.824}
    (best / "summary.json").write_text(json.dumps(summary))
    old, _ = write_run(tmp_path, "fb-old", "fb", seed=13)
    rows = table_rows(render_report([best, old], tmp_path / "out")["table"])
    assert rows[0]["Test acc"] == "0.8011" and rows[0]["Test acc at best val (epoch)"] == "0.8240 (179)"
    assert rows[1]["Test acc at best val (epoch)"] == "n/a"
    summary["best_val"] = {"epoch": "late", "val": 0.792, "test": 0.824}
    (best / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ReportError, match="'epoch' must be int"):
        render_report([best], tmp_path / "out2")


def test_epoch_over_overlap_limit_from_the_runs_link(tmp_path):
    """Measured epoch / the cost model's overlapped limit, per run, on the link of its link.json.
    Worked by hand (granndis_hpc/report/linkmodel.py) for 2 sage layers on the world view (layer 1 exchanges,
    forward and backward), 2 servers, an unshaped link of 1 MB/s (no rate cap) and no intra-server bytes:
    compute 0.4 s -> c = 0.1 s per layer and direction; the busiest server sends 410,000 B of which one
    leader's gradient share is 20,000 / 2 = 10,000 B (0.01 s, additive), so the halo is 0.4 s on the
    wire, 0.2 s per exchange; layer 1 sends half of layer 0's rows (s = 0.5) and half its edges come
    from halo rows (h = 0.5): window = c (1 - s) + c (1 - h) = 0.1 s, so 0.1 s of each exchange shows:
    limit = 0.4 + 2 x 0.1 + 0.01 = 0.61 s (the plan overlapped the world view)."""
    run, summary = write_run(tmp_path, "fb-1", "fb", layers=2, seed=11)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for rec in records:
            f.write(json.dumps({**rec, "inter_bytes_per_server": [410_000, 300_000],
                                "max_rank_bytes": {"intra_halo": 0, "intra_grad": 0}, "rows_per_layer": [
                                    {"rank": 0, "rows_computed": [1000, 1000], "rows_held": [1000, 1300],
                                     "send_rows": [0, 500], "halo_rows": [0, 300], "edges": [8000, 10_000],
                                     "halo_edges": [0, 5000], "group": ["world", "world"]}]}) + "\n")
    summary.update(epoch_time_s=1.22, seconds_per_epoch={**summary["seconds_per_epoch"], "compute": 0.4,
                                                         "sampling": 0.0},
                   bytes_per_epoch={**summary["bytes_per_epoch"], "inter_grad": 20_000, "intra_grad": 0},
                   plan={"overlap": True, "overlap_halos": ["world"]})
    (run / "summary.json").write_text(json.dumps(summary))
    other, _ = write_run(tmp_path, "flx-2", "flx", layers=2, seed=12)          # no link.json: n/a
    (run / "link.json").write_text(json.dumps({"label": "1MB", "rate_bps": None, "bw_Bps": 1e6, "intra_Bps": 1e9}))
    rows = table_rows(render_report([run, other], tmp_path / "out")["table"])
    assert rows[0]["Epoch / overlap limit"] == "2.00 (0.6100 s)"
    assert rows[1]["Epoch / overlap limit"] == "n/a"
    # A shaped link caps the ping-pong's bandwidth at the rate's TCP payload: 8 Mbit/s -> 1e6 x 1448/1514 B/s.
    (run / "link.json").write_text(json.dumps({"label": "8mbit", "rate_bps": 8e6, "bw_Bps": 5e6, "intra_Bps": 1e9}))
    bw = 1e6 * 1448 / 1514
    limit = 0.4 + 2 * (400_000 / bw / 2 - 0.1) + 10_000 / bw
    row = table_rows(render_report([run], tmp_path / "out2")["table"])[0]
    assert row["Epoch / overlap limit"] == f"{1.22 / limit:.2f} ({limit:.4f} s)"
    (run / "link.json").write_text(json.dumps({"label": "x", "rate_bps": None, "bw_Bps": -1, "intra_Bps": 1e9}))
    with pytest.raises(ReportError, match="link.json: 'bw_Bps' must be a positive number"):
        render_report([run], tmp_path / "out3")


def test_report_imports_no_torch(tmp_path):
    """`granndis report` runs where torch is not installed: the command, from the CLI's entry point to the
    plots, imports no torch (a fresh interpreter: this one has imported it already)."""
    fb, _ = write_run(tmp_path, "fb-101", "fb", seed=1)
    flx, _ = write_run(tmp_path, "flx-102", "flx", seed=2)
    out = tmp_path / "r"
    code = ("import sys; from granndis_hpc.cli import main; "
            f"rc = main(['report', {str(fb)!r}, {str(flx)!r}, '--out', {str(out)!r}]); "
            "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "no torch"
    check_png(out / "time_breakdown.png")
    assert (out / "report.md").is_file()
