"""The device check (bench/gpu_check.sh runs it): stages on one GPU under an overall deadline, each with its
own timeout, the report rewritten after every stage ($OUT/report.json and $OUT/report.md), so that a check
stopped early still says what passed, what failed and what was not reached.

Stages: env (interpreter, torch and its CUDA build, GPUs, NCCL, mpi4py, the C kernels, torch_geometric),
shards (the Cora sets the modes train on), unit-cuda (the unit tests of the GPU code), exact (CPU against
the device with dropout 0.5: logits and parameters), modes-1gpu and modes-shared (fb, flx, eas, cob, mb with
and without overlap on 1 rank, and on 2 ranks sharing the GPU), host-syncs (every case's count against its
rule), pyg-epoch (a 100k-vertex SAGE epoch beside PyG's SAGEConv), products-epoch (a products-size epoch,
when time remains).

--fake-device (or GPU_CHECK_FAKE=1): the CPU stands in for the GPU (the GPU code's host staging emulated,
gloo for NCCL), with smaller graphs, so the whole check runs on a machine without one.
Exit status: 0 every selected stage passed, 1 one failed or timed out, 2 none failed but some were not
reached.  Only the standard library here: it reports even where the interpreter it finds has no torch.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name, timeout (s), what it shows
STAGES = [
    ("env", 120, "python, torch and its CUDA build, the GPU, NCCL, mpi4py, the C kernels"),
    ("shards", 120, "the shard sets of the mode stages (Cora: 1x1 and 2x1, full and eas preload)"),
    ("unit-cuda", 180, "the unit tests of the GPU code (their CUDA cases run where CUDA is)"),
    ("exact", 90, "CPU against the device, dropout 0.5 (keyed masks): logits and parameters after 3 epochs"),
    ("modes-1gpu", 150, "fb, flx, eas, cob, mb (overlap on and off) on 1 rank against the CPU"),
    ("modes-shared", 180, "the same on 2 ranks sharing the GPU (2 servers, MPI between them)"),
    ("host-syncs", 10, "host synchronisations per steady step of every case, against its rule"),
    ("pyg-epoch", 150, "a SAGE epoch on a 100k-vertex graph beside PyG's SAGEConv on the same device"),
    ("products-epoch", 300, "a SAGE epoch on a products-size graph (2.45M vertices), when time remains"),
]
MODE_CASES = "fb,fb-noovl,flx,flx-noovl,eas,cob,cob-noovl,mb"
# GPU-code tests that do not name CUDA (staging and the loader stream, run with stand-in events)
GPU_LOGIC_TESTS = ("tests/unit/test_staging.py", "tests/unit/test_cobstream.py")
# "cuda" there is an option value or a module name, not GPU code
NOT_GPU_TESTS = re.compile(r"test_(slurm|options)")
MIN_STAGE_S = 15  # a stage that would get less is not started


# What an MPI process passes to its children: an mpirun given them exits 1 without a word (MCA settings stay).
_INHERITED_MPI = ("PMIX_", "ORTE_", "OMPI_APP_CTX_", "OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess",
                  "OMPI_MCA_pmix")


def launch_environment() -> dict:
    """os.environ without what an enclosing MPI job put there (_INHERITED_MPI)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_MPI)}


class Check:
    def __init__(self, args):
        self.args, self.fake = args, args.fake_device
        self.out = os.path.abspath(args.out)
        self.start = time.monotonic()
        self.selected = args.stages.split(",") if args.stages else [n for n, _, _ in STAGES]
        self.report = {"fake_device": self.fake, "deadline_s": args.deadline, "started": time.strftime("%F %T"),
                       "stages": [{"name": n, "what": w, "status": "not reached",
                                   "reason": "not started" if n in self.selected else "not selected"}
                                  for n, _, w in STAGES]}
        self.py = None
        self.facts = {}
        os.makedirs(self.out, exist_ok=True)
        self.write()

    # ---- the report ------------------------------------------------------------------------------
    def stage(self, name):
        return next(s for s in self.report["stages"] if s["name"] == name)

    def write(self):
        self.report["wall_s"] = round(time.monotonic() - self.start, 1)
        for name, text in (("report.json", json.dumps(self.report, indent=1)), ("report.md", markdown(self.report))):
            tmp = os.path.join(self.out, name + ".tmp")
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, os.path.join(self.out, name))

    def left(self):
        return self.args.deadline - (time.monotonic() - self.start)

    # ---- running a stage's commands --------------------------------------------------------------
    def run(self, cmd, log, timeout, env=None):
        """(exit status or "timed out", seconds): the command in its own process group, its output to log."""
        started = time.monotonic()
        with open(os.path.join(self.out, log), "a") as fh:
            fh.write("$ " + " ".join(map(str, cmd)) + "\n")
            fh.flush()
            proc = subprocess.Popen(list(map(str, cmd)), cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                    env=dict(launch_environment(), **(env or {})), start_new_session=True)
            try:
                rc = proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):  # mpirun and its ranks: the whole group
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        proc.wait(timeout=10)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                rc = "timed out"
        return rc, round(time.monotonic() - started, 1)

    def mpi_env(self):  # the emulated cluster's MPI environment, as the Makefile reads it
        words = subprocess.run([sys.executable, "-m", "emucluster.mpienv", "env"], cwd=REPO, capture_output=True,
                               text=True, check=True, timeout=60).stdout.split()
        env = dict(word.split("=", 1) for word in words)
        if not self.fake:
            env.pop("OMP_NUM_THREADS", None)  # the device's CPU threads are left to torch
        return env

    def execute(self, name, timeout, fn):
        entry = self.stage(name)
        if name not in self.selected:
            return
        budget = min(timeout, self.left() - 5)
        if budget < min(MIN_STAGE_S, timeout):
            entry.update(reason=f"deadline: {max(0, int(self.left()))} s left of {self.args.deadline} s")
            self.write()
            return
        blocked = self.blocked(name)
        if blocked:
            entry.update(reason=blocked)
            self.write()
            return
        entry.update(status="running", reason="", timeout_s=int(budget))
        self.write()
        started = time.monotonic()
        try:
            status, facts = fn(budget)
        except Exception as exc:  # noqa: BLE001 -- the stage fails with its reason; the others still run
            status, facts = "failed", {"reason": f"{type(exc).__name__}: {exc}"}
        if status == "timed out" and budget < timeout:  # the overall deadline stopped it, not its own timeout
            status, facts = "not reached", dict(facts, reason=f"deadline: stopped after {int(budget)} s")
        entry.update(status=status, wall_s=round(time.monotonic() - started, 1), **facts)
        if status == "passed":
            entry.pop("reason", None)
        self.write()

    def blocked(self, name):
        """Why a stage cannot start, from what the earlier ones found ("" when it can)."""
        if name == "env":
            return ""
        if self.py is None:
            return "not reached: no interpreter with torch, mpi4py and granndis_hpc (see the env stage)"
        if not self.fake and not self.facts.get("cuda_available"):
            return "not reached: torch sees no CUDA device (see the env stage)"
        if name in ("exact", "modes-1gpu", "modes-shared") and self.stage("shards")["status"] != "passed":
            return "not reached: the shard sets were not built (see the shards stage)"
        if name == "pyg-epoch" and not self.facts.get("torch_geometric"):
            return "not reached: torch_geometric missing"
        return ""


def markdown(report):
    lines = [f"# Device check{' (fake device: the CPU stands in for the GPU)' if report['fake_device'] else ''}",
             "", f"Started {report['started']}, {report['wall_s']} s of the {report['deadline_s']} s deadline.", "",
             "| stage | status | seconds | result |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['name']} | {s['status']} | {s.get('wall_s', '')} | {summary(s)} |")
    for s in report["stages"]:
        if s.get("cases"):
            lines += ["", f"## {s['name']}", "", "| case | ok | logits rel. err | syncs/step (rule) | epoch s | "
                      "peak reserved MiB |", "|---|---|---|---|---|---|"]
            for c in s["cases"]:
                err = c.get("logits_rel_err")
                lines.append(f"| {c['case']} | {c.get('ok')} | {'' if err is None else f'{err:.2e}'} | "
                             f"{c.get('syncs_per_step', '')} ({c.get('sync_rule', '')}) | "
                             f"{fmt_times(c.get('epoch_s'))} | {c.get('peak_reserved_mib') or ''} |"
                             if c["case"] != "startup" else
                             f"| startup | {c.get('ok')} | GPU set before MPI: {c.get('gpu_before_mpi')}, "
                             f"{', '.join(c.get('thread_level') or [])} | | | |")
    return "\n".join(lines) + "\n"


def fmt_times(ts):
    return "" if not ts else ", ".join(f"{t:.3f}" for t in ts)


def summary(s):
    keys = ("reason", "note", "interpreter", "venv", "python", "torch", "torch_cuda_build", "cuda_available", "gpus",
            "nccl", "mpi4py", "mpi_library", "mpirun", "c_kernels", "torch_geometric", "built", "counts", "transport",
            "cases_ok", "max_logits_rel_err", "params_rel_err", "syncs", "vertices", "edges", "granndis_median_s",
            "pyg_median_s", "granndis_over_pyg", "peak_reserved_mib", "missing")
    parts = [f"{k}: {s[k]}" for k in keys if s.get(k) not in (None, "", [])]
    return "; ".join(parts).replace("|", "/")[:900]


# ---- the stages ---------------------------------------------------------------------------------
def stage_env(check, budget):
    """The interpreter (PY, else the repository's .venv, else a fresh venv over the image's torch)."""
    facts, log = {}, "env.log"
    candidates = [os.environ["PY"]] if os.environ.get("PY") else [os.path.join(REPO, ".venv/bin/python")]
    py = next((p for p in candidates if os.path.exists(p) and probe(p, "granndis_hpc")), None)
    if py and not check.fake and not os.environ.get("PY") and not probe(py, "torch", cuda=True):
        facts["note"] = f"{py}: its torch sees no CUDA (a CPU wheel?); trying the image's torch"
        py = None
    if py is None and not check.fake:
        py, note = fresh_venv(check, budget, log)
        facts["venv"] = note
    if py is None:
        return "failed", dict(facts, reason="no interpreter: " + facts.get("venv", "PY or .venv has no granndis_hpc"))
    env_cmd = [py, "bench/gpu_check_env.py"] + ([] if check.fake else ["--need-cuda"])
    rc, _ = check.run(env_cmd, log, budget)
    found = last_json(os.path.join(check.out, log)) or {}
    facts["mpirun"] = shutil.which("mpirun") or "missing: the mode and epoch stages need it"
    facts.update(interpreter=py, **{k: found.get(k) for k in (
        "python", "torch", "torch_cuda_build", "cuda_available", "gpus", "nccl", "gloo", "mpi4py", "mpi_library",
        "c_kernels", "c_kernels_note", "torch_geometric", "nvidia_smi", "missing")})
    check.facts = found
    if found.get("torch") and found.get("mpi4py") and found.get("granndis_hpc"):
        check.py = py
    if rc != 0:
        why = "torch sees no CUDA device" if found.get("torch") and not found.get("cuda_available") else \
            f"missing: {', '.join(found.get('missing') or ['(see env.log)'])}"
        return ("timed out" if rc == "timed out" else "failed"), dict(facts, reason=why)
    return "passed", facts


def probe(py, module, cuda=False):
    code = f"import {module}" + ("; import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" if cuda else "")
    try:
        return subprocess.run([py, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fresh_venv(check, budget, log):
    """(interpreter or None, what was done): a venv over the image's Python with torch (--system-site-packages),
    the package installed into it without the network (a wheelhouse's wheels for what the image lacks)."""
    base = next((p for p in ("python3", "python") if probe(p, "torch")), None)
    if base is None:
        return None, ("the image's python3 has no torch: a CUDA torch wheel (about 2.5 GB) cannot be carried; "
                      "run the check where torch with CUDA is installed, or give PY=")
    venv = os.path.join(check.out, "venv")
    rc, _ = check.run([base, "-m", "venv", "--system-site-packages", venv], log, budget / 3)
    if rc != 0:
        return None, f"{base} -m venv --system-site-packages failed ({rc}; see env.log)"
    py = os.path.join(venv, "bin", "python")
    house = os.environ.get("GPU_CHECK_WHEELHOUSE", os.path.join(REPO, "wheelhouse"))
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation"]
    if os.path.isdir(house):
        rc, _ = check.run(pip + ["--find-links", house, "-e", ".[pyg]"], log, budget / 2)
    else:  # the image's packages or nothing: what is missing is reported by the env stage
        rc, _ = check.run(pip + ["--no-deps", "-e", "."], log, budget / 2)
    how = f"fresh venv {venv} over {base}'s torch" + (f", wheels from {house}" if os.path.isdir(house) else "")
    if rc == 0:
        return py, how
    # No build tools or setuptools: the package from the source tree (its C kernels then fall back to torch's
    # operators, which the env stage reports)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    return py, f"{how}: pip install failed ({rc}; see env.log), so the package runs from {REPO} (PYTHONPATH)"


def last_json(path):
    """The last line of a log that is a JSON object (the programs print their result so)."""
    found = None
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            if line.startswith("{"):
                try:
                    found = json.loads(line)
                except ValueError:
                    pass
    return found


SETS = {  # name: build options (Cora from tests/data, 3 layers)
    "cora-1x1": ["--servers", "1", "--gpus-per-server", "1", "--preload", "full"],
    "cora-1x1-eas": ["--servers", "1", "--gpus-per-server", "1", "--preload", "eas"],
    "cora-2x1": ["--servers", "2", "--gpus-per-server", "1", "--preload", "full"],
    "cora-2x1-eas": ["--servers", "2", "--gpus-per-server", "1", "--preload", "eas"],
}


def build(check, name, options, timeout, log="shards.log"):
    out = os.path.join(check.out, "shards", name)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return 0
    if "--partitioner" not in options:
        options = [*options, "--partitioner", "metis"]
    return check.run([check.py, "-m", "granndis_hpc.preprocess", "build", *options, "--layers", "3", "--seed", "0",
                      "--out", out, "--overwrite"], log, timeout)[0]


def stage_shards(check, budget):
    end, built = time.monotonic() + budget, []
    for name, options in SETS.items():
        rc = build(check, name, ["--source", "planetoid", "--name", "cora", "--root", "tests/data/planetoid",
                                 *options], end - time.monotonic())
        if rc != 0:
            return ("timed out" if rc == "timed out" else "failed"), {"reason": f"building {name}: {rc}",
                                                                      "built": built}
        built.append(name)
    return "passed", {"built": built}


def unit_files():
    files = set(GPU_LOGIC_TESTS)
    for name in sorted(os.listdir(os.path.join(REPO, "tests/unit"))):
        path = os.path.join("tests/unit", name)
        if name.endswith(".py") and not NOT_GPU_TESTS.search(name) and \
                "cuda" in open(os.path.join(REPO, path), errors="replace").read().lower():
            files.add(path)
    return sorted(files)


def stage_unit(check, budget):
    files = unit_files()
    rc, _ = check.run([check.py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files], "unit-cuda.log",
                      budget)
    text = open(os.path.join(check.out, "unit-cuda.log"), errors="replace").read()
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text[-3000:])}
    skips = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)))[:6]
    facts = {"files": files, "counts": counts, "skip_reasons": skips}
    if check.fake:
        facts["note"] = "fake device: the tests' CUDA cases skip; their CPU cases ran"
    if rc == "timed out":
        return "timed out", facts
    ok = rc == 0 and counts.get("passed", 0) > 0
    return ("passed" if ok else "failed"), dict(facts, **({} if ok else {"reason": f"pytest exit {rc}"}))


def device_args(check):
    return ["--device", "cpu", "--intra-transport", "gloo"] if check.fake else ["--device", "cuda"]


def mode_stage(check, budget, name, ranks, cases, extra=()):
    shape = "1x1" if ranks == 1 else "2x1"
    results = os.path.join(check.out, f"{name}.jsonl")
    open(results, "w").close()
    sets = os.path.join(check.out, "shards")
    cmd = ["mpirun", "-n", ranks, check.py, "bench/gpu_check.py", "--shards", f"{sets}/cora-{shape}",
           "--eas-shards", f"{sets}/cora-{shape}-eas", "--epochs", "3", "--cases", cases, "--out", results,
           *device_args(check), *extra]
    rc, _ = check.run(cmd, f"{name}.log", budget, env=check.mpi_env())
    got = [json.loads(line) for line in open(results) if line.strip()]
    wanted = ["startup"] + cases.split(",")
    missing = [c for c in wanted if c not in {g["case"] for g in got}]
    bad = [g["case"] for g in got if not g.get("ok")]
    errs = [g["logits_rel_err"] for g in got if g.get("logits_rel_err") is not None]
    facts = {"cases": got, "cases_ok": f"{len(got) - len(bad)} of {len(wanted)}",
             "max_logits_rel_err": max(errs) if errs else None,
             "params_rel_err": next((g["params_rel_err"] for g in got if "params_rel_err" in g), None),
             "transport": ("gloo standing in for NCCL; the GPU code's host staging on the CPU" if check.fake else
                           "NCCL inside each server") + (", MPI between the 2 servers" if ranks > 1 else "")}
    if rc == "timed out":
        return "timed out", dict(facts, reason=f"timed out; no result for {', '.join(missing) or '-'}")
    if missing or bad or rc != 0:
        return "failed", dict(facts, reason="; ".join(filter(None, [
            bad and f"failed: {', '.join(bad)}", missing and f"no result: {', '.join(missing)}",
            f"exit {rc}" if rc else ""])))
    return "passed", facts


def stage_syncs(check, budget):
    rows = []
    for name in ("exact", "modes-1gpu", "modes-shared"):
        for c in check.stage(name).get("cases") or []:
            if "syncs_per_step" in c:
                rows.append({"stage": name, "case": c["case"], "syncs_per_step": c["syncs_per_step"],
                             "rule": c["sync_rule"], "ok": c["sync_ok"], "calls": c.get("sync_calls")})
    if not rows:
        return "not reached", {"reason": "not reached: no mode stage gave a case"}
    bad = [f"{r['stage']}/{r['case']}: {r['syncs_per_step']} ({r['calls']})" for r in rows if not r["ok"]]
    facts = {"syncs": rows if bad else f"{len(rows)} cases by their rule, "
             f"at most {max(r['syncs_per_step'] for r in rows)} per step", "by_case": rows}
    return ("failed", dict(facts, reason="; ".join(bad))) if bad else ("passed", facts)


def epoch_stage(check, budget, name, vertices, pyg):
    end = time.monotonic() + budget
    set_name = f"syn{vertices}-1x1"
    options = ["--source", "synthetic", "--vertices", str(vertices), "--servers", "1", "--gpus-per-server", "1",
               "--preload", "full", "--partitioner", "random"]  # one server: nothing to partition
    rc = build(check, set_name, options, end - time.monotonic() - 20, log=f"{name}.log")
    if rc != 0:
        return ("timed out" if rc == "timed out" else "failed"), {"reason": f"building {set_name}: {rc}"}
    cmd = ["mpirun", "-n", "1", check.py, "bench/gpu_check_epoch.py", "--shards",
           os.path.join(check.out, "shards", set_name), "--device", "cpu" if check.fake else "cuda",
           "--epochs", "4" if pyg else "3", "--dropout", "0.5", *(["--pyg"] if pyg else [])]
    rc, _ = check.run(cmd, f"{name}.log", end - time.monotonic(), env=check.mpi_env())
    found = last_json(os.path.join(check.out, f"{name}.log")) or {}
    facts = {k: found.get(k) for k in ("vertices", "edges", "granndis_median_s", "pyg_median_s", "granndis_over_pyg",
                                       "peak_reserved_mib", "granndis_epoch_s", "pyg_epoch_s", "note")}
    if rc == "timed out":
        return "timed out", facts
    if found.get("pyg") == "missing":
        return "not reached", dict(facts, reason="not reached: torch_geometric missing")
    return ("passed", facts) if rc == 0 and found.get("ok") else ("failed", dict(facts, reason=f"exit {rc}"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fake-device", "--cpu-smoke", dest="fake_device", action="store_true",
                   default=os.environ.get("GPU_CHECK_FAKE") == "1",
                   help="the CPU stands in for the GPU (also GPU_CHECK_FAKE=1)")
    p.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_CHECK_DEADLINE_S", 480)),
                   help="seconds for the whole check (GPU_CHECK_DEADLINE_S; default 480)")
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out/gpu-check"))
    p.add_argument("--stages", default="", help="a comma-separated subset of: " + ",".join(n for n, _, _ in STAGES))
    p.add_argument("--cases", default=MODE_CASES, help="the mode stages' cases (bench/gpu_check.py's names)")
    p.add_argument("--pyg-vertices", type=int, default=None, help="default 100000 (fake device: 20000)")
    p.add_argument("--products-vertices", type=int, default=None, help="default 2449029 (fake device: 30000)")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.stages.split(","))) - {n for n, _, _ in STAGES}
    if unknown:
        p.error(f"unknown stage(s) {', '.join(sorted(unknown))}")
    pyg_n = args.pyg_vertices or (20_000 if args.fake_device else 100_000)
    products_n = args.products_vertices or (30_000 if args.fake_device else 2_449_029)
    check = Check(args)
    timeouts = {n: t for n, t, _ in STAGES}
    if args.fake_device:  # the 2-core stand-in: the smaller graphs need less
        timeouts.update({"products-epoch": 120})
    runs = {
        "env": lambda b: stage_env(check, b),
        "shards": lambda b: stage_shards(check, b),
        "unit-cuda": lambda b: stage_unit(check, b),
        "exact": lambda b: mode_stage(check, b, "exact", 1, "exact"),
        "modes-1gpu": lambda b: mode_stage(check, b, "modes-1gpu", 1, args.cases),
        "modes-shared": lambda b: mode_stage(check, b, "modes-shared", 2, args.cases, ["--share-gpus"]),
        "host-syncs": lambda b: stage_syncs(check, b),
        "pyg-epoch": lambda b: epoch_stage(check, b, "pyg-epoch", pyg_n, True),
        "products-epoch": lambda b: epoch_stage(check, b, "products-epoch", products_n, False),
    }
    for name, _, _ in STAGES:
        check.execute(name, timeouts[name], runs[name])
        s = check.stage(name)
        print(f"gpu_check: {name}: {s['status']}{' -- ' + s['reason'] if s.get('reason') else ''}"
              f"{' (%s s)' % s['wall_s'] if 'wall_s' in s else ''}", flush=True)
    statuses = [s["status"] for s in check.report["stages"] if s["name"] in check.selected]
    check.report["result"] = ("failed" if any(st in ("failed", "timed out") for st in statuses) else
                              "incomplete" if any(st != "passed" for st in statuses) else "passed")
    check.write()
    print(f"gpu_check: {check.report['result']} in {check.report['wall_s']} s; report: {check.out}/report.md")
    return {"passed": 0, "failed": 1}.get(check.report["result"], 2)


if __name__ == "__main__":
    sys.exit(main())
