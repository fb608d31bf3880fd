"""`preprocess plan` (--no-eas, the default EAS set, --hops H) and `build --hops auto` on a sliced source
count their sets from the build ranks' slices (preprocess/plan/halo_counts.py); here, in one process, their
output must equal the whole-graph path's (sources.load_from_args, plan_sets.plan_options on the Graph)
line for line and field for field.  tests/mpi/test_hops_auto_sliced.py and test_plan_sliced.py check
P = 1, 2, 4 (and an independent count of the full preloads)."""
import json

from tests.unit.test_memory_model_cli import SYN

LAYOUT = ["--servers", "2", "--gpus-per-server", "2", "--layers", "3", "--partitioner", "metis", "--hidden", "16",
          "--seed", "1"]


def _whole(monkeypatch):
    """Make every command load the whole graph (the path before the sliced counts)."""
    from granndis_hpc.preprocess import sources

    monkeypatch.setattr(sources, "sliced_from_args", lambda args: None)


def _plan(tmp_path, name, *extra):
    from granndis_hpc.preprocess.__main__ import main

    out = tmp_path / f"{name}.json"
    rc = main(["plan", *SYN, *LAYOUT, "--no-eas", "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_plan_no_eas_from_slices_equals_whole_graph(tmp_path, capsys, monkeypatch):
    import granndis_hpc.preprocess.plan.sets as plan_sets

    called = []
    monkeypatch.setattr(plan_sets, "plan_options_sliced",
                        lambda *a, _f=plan_sets.plan_options_sliced: called.append(1) or _f(*a))
    rc, sliced = _plan(tmp_path, "sliced", "--memory-per-gpu", "1GiB", "--memory-per-rank", "1GiB")
    text_sliced = capsys.readouterr().out
    assert rc == 0 and called  # the sliced path ran
    with monkeypatch.context() as m:
        _whole(m)
        rc, whole = _plan(tmp_path, "whole", "--memory-per-gpu", "1GiB", "--memory-per-rank", "1GiB")
    assert rc == 0 and len(called) == 1
    assert sliced == whole  # options, decision, partition entry, build memory
    assert text_sliced == capsys.readouterr().out
    assert [o["label"] for o in sliced["options"]] == [
        "fb", "fb payload=partial", "fb payload=smaller", "flx k=1", "flx k=1 payload=partial",
        "flx k=1 payload=smaller", "flx k=2", "flx k=2 payload=partial", "flx k=2 payload=smaller", "flx k=3"]


def test_build_hops_auto_from_slices_equals_whole_graph(tmp_path, capsys, monkeypatch):
    from granndis_hpc import shards
    from granndis_hpc.preprocess.__main__ import main

    _, res = _plan(tmp_path, "plan")
    by = {o["label"]: o["peak_bytes"] for o in res["options"]}
    budget = str(by["flx k=1"] + 1)
    capsys.readouterr()
    common = ["build", *SYN, *LAYOUT, "--hops", "auto", "--memory-per-gpu", budget]
    assert main(common + ["--out", str(tmp_path / "sliced")]) == 0
    assert main(common + ["--out", str(tmp_path / "whole"), "--whole-graph"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "--hops auto:" in x]
    assert len(lines) == 2 and lines[0] == lines[1] and "k = 1" in lines[0]
    a, b = shards.read_manifest(tmp_path / "sliced"), shards.read_manifest(tmp_path / "whole")
    assert a["hops_auto"] == b["hops_auto"] and a["preload"]["hops"] == 1
    assert a["files"] == b["files"]  # the same shards


def _plan_both(tmp_path, capsys, monkeypatch, name, *extra):
    """(sliced JSON, whole-graph JSON, sliced text, whole text) of one plan command."""
    from granndis_hpc.preprocess.__main__ import main

    import granndis_hpc.preprocess.plan.sets as plan_sets

    called = []
    monkeypatch.setattr(plan_sets, "plan_options_sliced",
                        lambda *a, _f=plan_sets.plan_options_sliced: called.append(1) or _f(*a))
    out = {}
    for path in ("sliced", "whole"):
        with monkeypatch.context() as m:
            if path == "whole":
                _whole(m)
            js = tmp_path / f"{name}-{path}.json"
            rc = main(["plan", *SYN, *LAYOUT, "--json", str(js), *extra])
            out[path] = (rc, json.loads(js.read_text()), capsys.readouterr().out)
        assert len(called) == 1  # the sliced path ran once, the whole-graph path did not call it
    return out["sliced"], out["whole"]


def test_plan_eas_and_hops_from_slices_equal_whole_graph(tmp_path, capsys, monkeypatch):
    """The default set (full k = 0..L and EAS with co-batches) and --hops H (H < L: no co-batches on the
    full set; H = L: co-batches on both) counted from the slices: the same table, JSON and decision."""
    budget = ["--memory-per-gpu", "1GiB", "--memory-per-rank", "1GiB"]
    cases = {"default": [], "hops2": ["--hops", "2", "--cob-batches", "2,4,1000000"],
             "hops3": ["--hops", "3", "--eas-hops", "2", "--eas-fanout", "3"],
             "fanout": ["--cob-fanout", "4"]}  # a random sample: the writer's graph must be the file's
    for name, extra in cases.items():
        (rc_s, sliced, text_s), (rc_w, whole, text_w) = _plan_both(tmp_path, capsys, monkeypatch, name, *budget, *extra)
        assert rc_s == rc_w == 0, name
        assert sliced == whole, name
        assert text_s == text_w, name
        labels = {o["label"] for o in sliced["options"]}
        assert "eas" in labels and any(x.startswith("cob") for x in labels), (name, labels)
        assert set(sliced["build_memory"]) >= {"eas"}, name
