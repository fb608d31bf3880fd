"""`granndis preprocess plan` (every option's estimate, the recommendation) and `build --hops auto` (the
largest k whose estimate fits --memory-per-gpu, or a refusal that says what to build instead)."""
import json

import pytest

from tests.unit.test_memory_model import recipe_model  # noqa: F401 (a fixture)

SYN = ["--source", "synthetic", "--vertices", "1500", "--avg-degree", "8", "--features", "12", "--classes", "4",
       "--seed", "1"]


def _plan(tmp_path, *extra):
    from granndis_hpc.preprocess.__main__ import main

    out = tmp_path / "plan.json"
    rc = main(["plan", *SYN, "--servers", "2", "--gpus-per-server", "2", "--layers", "3", "--partitioner", "metis",
               "--hidden", "16", "--json", str(out), "--cob-batches", "2,4", *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_plan_cli_prints_every_option_and_recommends(tmp_path, capsys):
    rc, res = _plan(tmp_path, "--memory-per-gpu", "1GiB")
    text = capsys.readouterr().out
    labels = [o["label"] for o in res["options"]]
    payloads = {f"{o} payload={p}" for o in ("fb", "flx k=1", "flx k=2") for p in ("partial", "smaller")}
    assert rc == 0 and set(labels) == {"fb", "flx k=1", "flx k=2", "flx k=3", "eas", "cob batches=2",
                                       "cob batches=4"} | payloads
    assert res["decision"]["choice"]["label"] == "flx k=3" and "recommendation: flx k=3" in text
    assert not list(tmp_path.glob("*.h5"))  # no shard written
    by = {o["label"]: o for o in res["options"]}
    # The trade: inter-server halo bytes fall as k grows, rows held grow past fb.
    assert by["fb"]["inter_server_bytes"]["halo"] >= by["flx k=2"]["inter_server_bytes"]["halo"] > 0
    assert by["flx k=3"]["inter_server_bytes"]["halo"] == 0
    assert by["flx k=3"]["rows_per_gpu"] > by["fb"]["rows_per_gpu"]
    # cob all-reduces the gradients once per co-batch.
    grad = by["flx k=3"]["inter_server_bytes"]["gradient"]
    assert by["cob batches=4"]["inter_server_bytes"]["gradient"] == 4 * grad == 2 * by["cob batches=2"][
        "inter_server_bytes"]["gradient"]
    # A budget between k=2's and k=3's estimate picks k=2 (the largest that fits).
    mid = (by["flx k=2"]["peak_bytes"] + by["flx k=3"]["peak_bytes"]) // 2
    assert by["flx k=2"]["peak_bytes"] < mid < by["flx k=3"]["peak_bytes"]
    rc, res = _plan(tmp_path, "--memory-per-gpu", str(mid))
    assert rc == 0 and res["decision"]["choice"]["label"] == "flx k=2"
    rc, res = _plan(tmp_path, "--memory-per-gpu", "1KiB")
    assert rc != 0 and res["decision"]["choice"] is None
    assert "nothing fits" in capsys.readouterr().err


def _build(tmp_path, *extra):
    from granndis_hpc.preprocess.__main__ import main

    out = tmp_path / "set"
    rc = main(["build", *SYN, "--servers", "2", "--gpus-per-server", "2", "--layers", "3", "--partitioner", "metis",
               "--hidden", "16", "--out", str(out), *extra])
    return rc, out


def test_build_hops_auto_picks_the_largest_k_that_fits(tmp_path, capsys):
    _, res = _plan(tmp_path, "--no-eas")
    by = {o["label"]: o["peak_bytes"] for o in res["options"]}
    budget = by["flx k=2"] + 1  # k = 2 fits, and k = 3 needs more
    assert by["flx k=3"] > budget
    rc, out = _build(tmp_path, "--hops", "auto", "--memory-per-gpu", str(budget))
    text = capsys.readouterr().out
    from granndis_hpc import shards
    manifest = shards.read_manifest(out)
    assert rc == 0 and manifest["preload"]["hops"] == 2
    assert "--hops auto: k = 2" in text
    # The manifest keeps the decision: budget, the estimate of k = 2 and the rejected k = 3.
    auto = manifest["hops_auto"]
    assert auto["budget_bytes"] == budget and auto["choice"]["peak_bytes"] == by["flx k=2"]
    assert [o["label"] for o in auto["rejected"]] == ["flx k=3"]
    from granndis_hpc.preprocess.__main__ import main
    assert main(["verify", str(out)]) == 0


@pytest.mark.parametrize("extra,message", [
    (("--hops", "auto"), "add --memory-per-gpu"),
    (("--hops", "4"), "--hops 4 > --layers 3"),
    (("--hops", "auto", "--memory-per-gpu", "1KiB"), "too small for any full preload"),
    (("--hops", "2", "--memory-per-gpu", "1GiB"), "add --hops auto"),
    (("--hops", "banana"), "number of hops or 'auto'"),
])
def test_build_hops_bad_input(tmp_path, capsys, extra, message):
    try:
        rc, out = _build(tmp_path, *extra)
    except SystemExit as exc:  # argparse rejects a malformed --hops
        rc, out = exc.code, tmp_path / "set"
    err = capsys.readouterr().err
    assert rc != 0 and message in err
    assert not (out / "manifest.json").exists()


def test_too_small_budget_names_what_to_build_instead(tmp_path, capsys):
    _, res = _plan(tmp_path)
    by = {o["label"]: o["peak_bytes"] for o in res["options"]}
    budget = min(by["flx k=1"], by["fb"]) - 1
    rc, _ = _build(tmp_path, "--hops", "auto", "--memory-per-gpu", str(budget))
    err = capsys.readouterr().err
    assert rc != 0 and "too small for any full preload" in err and "instead" in err


def test_build_hops_auto_with_a_one_byte_budget_says_what_is_needed(tmp_path, capsys):
    """`--hops auto --memory-per-gpu 1` says what is needed, not "the smallest estimate is 0 B"."""
    rc, _ = _build(tmp_path, "--hops", "auto", "--memory-per-gpu", "1")
    err = capsys.readouterr().err
    assert rc != 0 and "too small for any full preload" in err and " 0 B" not in err, err


def test_plan_cli_estimates_one_build_of_a_registered_model(recipe_model, tmp_path, capsys):
    """`plan --hops 3 --model recipe-meanmlp --model-option widen=2`: the 3-hop build's options (fb,
    flx k <= 3, cob), sized by the registered model's own estimate and option."""
    rc, res = _plan(tmp_path, "--hops", "3", "--no-eas", "--model", recipe_model.NAME, "--model-option", "widen=2",
                    "--memory-per-gpu", "1GiB")
    assert rc == 0 and "recommendation: flx k=3" in capsys.readouterr().out
    assert {(o["label"], o["source"]) for o in res["options"]} == {
        (label, "--hops 3") for label in ("fb", "flx k=1", "flx k=2", "flx k=3", "cob batches=2", "cob batches=4")}
    assert res["decision"]["choice"]["train_options"] == {"preloaded_layers": 3}
    _, narrow = _plan(tmp_path, "--hops", "3", "--no-eas", "--model", recipe_model.NAME, "--memory-per-gpu", "1GiB")
    peaks = {o["label"]: o["peak_bytes"] for o in narrow["options"]}
    assert all(o["peak_bytes"] > peaks[o["label"]] for o in res["options"])  # widen=2: wider hidden layers
    rc, _ = _plan(tmp_path, "--hops", "3", "--no-eas", "--model", recipe_model.NAME, "--model-option", "heads=2")
    assert rc != 0 and "the options widen (int, default 1)" in capsys.readouterr().err


def test_plan_with_link_rates_predicts_each_epoch_and_recommends_the_fastest(tmp_path, capsys):
    """--inter-rate / --intra-rate: every option priced (the compute rate measured here), the time rule's
    recommendation; a slow link between servers favours the deepest preload, which sends no halo rows."""
    rc, res = _plan(tmp_path, "--memory-per-gpu", "1GiB", "--inter-rate", "1mbit", "--intra-rate", "100gbit",
                    "--inter-both-rate", "0.5mbit", "--no-eas")
    text = capsys.readouterr().out
    assert rc == 0 and "epoch s" in text
    d = res["decision"]
    assert d["rule"] == "time" and d["rates"]["inter_Bps"] == 1e6 / 8 and d["rates"]["intra_Bps"] == 1e11 / 8
    assert d["rates"]["inter_both_Bps"] == 0.5e6 / 8
    totals = {o["label"]: o["predicted_s"]["total_s"] for o in res["options"]}
    assert d["choice"]["predicted_s"]["total_s"] == min(totals.values())
    assert d["choice"]["label"] in ("flx k=3", "cob batches=2", "cob batches=4")  # no halo over the slow link
    assert totals["fb"] > totals["flx k=3"]
    # the table --mode auto prints, with its terms; the calibration's fixed cost per step priced
    assert "predicted epoch by term" in text and "fixed" in text and "<- chosen" in text
    assert d["rates"]["compute_scale"] > 0 and d["rates"]["world_round_s"] == 0.0
    # fb's layers priced on its overlapped path, calibrated as auto calibrates them
    assert d["rates"]["overlap_scale"] >= d["rates"]["compute_scale"] and d["rates"]["overlap_step_s"] >= 0
    for o in res["options"]:
        p = o["predicted_s"]
        assert p["total_s"] == pytest.approx(p["compute_s"] + p["inter_s"] + p["intra_s"] + p["fixed_s"])
    rc, _ = _plan(tmp_path, "--inter-rate", "1mbit", "--inter-both-rate", "2mbit")  # refused before the work
    assert rc != 0 and "more than --inter-rate" in capsys.readouterr().err


def test_plan_prices_the_co_batch_set_up(tmp_path, capsys):
    """--inter-rate with cob in the plan: a co-batch's set-up is timed on each server's graph of the build
    (one server at a time, on this host) and charged per co-batch, as --mode auto charges it; given with
    --cobatch-setup, it is not timed; no cob option, nothing timed."""
    args = ("--hops", "3", "--no-eas", "--memory-per-gpu", "1GiB", "--inter-rate", "1gbit")
    rc, res = _plan(tmp_path, *args, "--cobatch-setup", "0.5,0")
    assert rc == 0 and res["decision"]["rates"]["cobatch_s"] == 0.5 and res["decision"]["rates"]["cobatch_row_s"] == 0
    step_s = res["decision"]["rates"]["step_s"]
    by = {o["label"]: o for o in res["options"]}
    for label, batches in (("cob batches=2", 2), ("cob batches=4", 4), ("flx k=3", 0)):
        o = by[label]
        assert o["predicted_s"]["fixed_s"] == pytest.approx(o["rounds"]["steps"] * step_s + 0.5 * batches), label
    assert "(--cobatch-setup)" in capsys.readouterr().out
    rc, res = _plan(tmp_path, *args)
    text = capsys.readouterr().out
    setup, rates = res["cobatch_setup"], res["decision"]["rates"]
    assert rc == 0 and "timed on this host, one server at a time, the slowest of 2 server graphs" in setup["method"]
    assert setup["method"] in text and setup["method"] in res["decision"]["reason"]
    assert (rates["cobatch_s"], rates["cobatch_row_s"]) == (setup["cobatch_s"], setup["cobatch_row_s"])
    assert setup["cobatch_s"] + setup["cobatch_row_s"] > 0
    cob = next(o for o in res["options"] if o["label"] == "cob batches=4")
    assert cob["predicted_s"]["fixed_s"] >= cob["rounds"]["steps"] * rates["step_s"] + 4 * setup["cobatch_s"]
    rc, res = _plan(tmp_path, "--hops", "2", "--no-eas", "--inter-rate", "1gbit")  # a 2-hop set serves no cob
    assert rc == 0 and res["cobatch_setup"] is None and "co-batch set-up" not in capsys.readouterr().out
    rc, _ = _plan(tmp_path, *args, "--cobatch-setup", "1")
    assert rc != 0 and "SECONDS,SECONDS_PER_ROW" in capsys.readouterr().err


@pytest.mark.parametrize("text,bytes_per_s", [("10gbit", 1.25e9), ("100Mbit", 12.5e6), ("1.5kbit", 187.5)])
def test_rates_are_bits_per_second(text, bytes_per_s):
    from granndis_hpc.units import parse_rate
    assert parse_rate(text) == bytes_per_s


@pytest.mark.parametrize("text", ["100MB", "1G", "fast", "0gbit"])
def test_unclear_rates_are_refused(text):
    from granndis_hpc.units import parse_rate
    with pytest.raises(ValueError, match="link rate|positive"):
        parse_rate(text)
