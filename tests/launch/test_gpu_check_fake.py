"""The device check on a fake device (the CPU stands in for the GPU): a reduced run's report has every
stage, each passed one shows what it ran, the others say why not; a deadline that leaves no time marks
every stage not reached instead of passing or failing it."""
import json
import subprocess
import sys

from tests.conftest import REPO

DRIVER = [sys.executable, "bench/gpu_check_driver.py", "--fake-device"]
STATUSES = {"passed", "failed", "timed out", "not reached"}


def _run(tmp_path, *args, timeout=300):
    res = subprocess.run([*DRIVER, "--out", str(tmp_path), *args], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    report = json.loads((tmp_path / "report.json").read_text())
    return res, report, {s["name"]: s for s in report["stages"]}


def test_a_reduced_fake_check_reports_every_stage_and_what_each_ran(tmp_path):
    stages = "env,shards,exact,modes-1gpu,host-syncs,pyg-epoch"
    res, report, by_name = _run(tmp_path, "--stages", stages, "--cases", "fb,fb-noovl,cob", "--pyg-vertices", "3000")
    assert res.returncode == 0, res.stdout + res.stderr  # the selected stages passed
    assert report["fake_device"] and report["result"] == "passed"
    assert [s["name"] for s in report["stages"]] == ["env", "shards", "unit-cuda", "exact", "modes-1gpu",
                                                     "modes-shared", "host-syncs", "pyg-epoch", "products-epoch"]
    for s in report["stages"]:
        assert s["status"] in STATUSES, s
        if s["name"] not in stages.split(","):
            assert s["status"] == "not reached" and s["reason"] == "not selected", s
            continue
        assert s["status"] == "passed", (s, (tmp_path / f"{s['name']}.log").read_text()
                                         if (tmp_path / f"{s['name']}.log").exists() else "")
        assert s["wall_s"] >= 0 and "reason" not in s
    # each passed stage holds what it measured: nothing passes without running
    assert by_name["env"]["torch"] and by_name["env"]["c_kernels"] is not None
    assert len(by_name["shards"]["built"]) == 4
    exact = {c["case"]: c for c in by_name["exact"]["cases"]}
    assert exact["exact"]["ok"] and exact["exact"]["params"] > 0 and exact["exact"]["params_rel_err"] == 0.0
    cases = {c["case"]: c for c in by_name["modes-1gpu"]["cases"]}
    assert set(cases) == {"startup", "fb", "fb-noovl", "cob"} and all(c["ok"] for c in cases.values())
    assert cases["fb-noovl"]["sync_rule"].startswith("loss + staging waits")
    assert cases["fb"]["syncs_per_step"] == 1 and cases["cob"]["loader_stream"]
    assert len(by_name["host-syncs"]["by_case"]) == 4  # exact + the 3 mode cases
    pyg = by_name["pyg-epoch"]
    assert pyg["vertices"] == 3000 and pyg["granndis_median_s"] > 0 and pyg["pyg_median_s"] > 0
    page = (tmp_path / "report.md").read_text()
    assert "| modes-1gpu | passed |" in page and "| unit-cuda | not reached |" in page and "fb-noovl" in page


def test_a_deadline_with_no_time_left_reaches_no_stage(tmp_path):
    res, report, _ = _run(tmp_path, "--deadline", "5", timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert report["result"] == "incomplete"
    for s in report["stages"]:
        assert s["status"] == "not reached" and s["reason"].startswith("deadline: "), s
