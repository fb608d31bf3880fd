"""The bench harness: one MPI environment, one way to run a command or a training run, one results page.

Every script under bench/ imports it first (`import harness`: a script's own folder is on sys.path), and
the tests and the Makefile read the same environment, so there is one definition of it:

    python3 bench/harness.py env            # KEY=VALUE words (the Makefile exports them)
    python3 bench/harness.py env --shell    # `export KEY=VALUE` lines: eval "$(python3 bench/harness.py env --shell)"
    python3 bench/harness.py ranks-per-server

Standard library only: the Makefile runs it with the system python3 before the .venv exists.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
CLUSTER = os.path.join(BENCH, "cluster")

# How mpirun runs here, for tests and benchmarks alike: Open MPI refuses root without the first two; 4
# ranks on 2 cores need oversubscription and no binding; one torch/BLAS thread per rank (several ranks
# share the cores); output unbuffered so that a rank's last line survives a kill.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
}
# The emulated cluster shape of the MPI tests and the benchmarks: 4 ranks = 2 servers x 2 ranks.
RANKS_PER_SERVER = 2

# The one place that makes the repository (granndis_hpc, preprocess) and bench/cluster (emucluster,
# costmodel) importable from a checkout without `pip install -e .`; worker subprocesses that re-run a
# script get the same path from it.
for _path in (REPO, CLUSTER):
    if _path not in sys.path:
        sys.path.insert(1, _path)


def mpi_env(*, threads: bool = True, **extra) -> dict:
    """os.environ with MPI_ENV and `extra` on top.  threads=False leaves OMP_NUM_THREADS as it is (a
    script whose single-rank runs may use every core)."""
    env = dict(os.environ, **{k: v for k, v in MPI_ENV.items() if threads or k != "OMP_NUM_THREADS"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


ENV = mpi_env()


def run(cmd, log=None, *, env=None, cwd=REPO, timeout=None, capture=False, check=True):
    """Run `cmd` (echoed, and appended to `log`, the page's command list), in the repository with the MPI
    environment unless told otherwise; returns the CompletedProcess.  check=True raises on failure."""
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    if log is not None:
        log.append(" ".join(cmd))
    return subprocess.run(cmd, cwd=cwd, env=ENV if env is None else env, check=check, timeout=timeout,
                          capture_output=capture, text=True)


def build(args, out, preload_args, log, layers=None, vertices=None):
    """`preprocess build` of the synthetic graph for 2 servers x 2 GPUs with METIS (args: vertices, layers,
    and optionally generator)."""
    run(["mpirun", "-n", "2", sys.executable, "-m", "preprocess", "build", "--source", "synthetic",
         "--vertices", str(vertices or args.vertices), "--seed", "0", "--servers", "2", "--gpus-per-server", "2",
         "--layers", str(layers or args.layers), "--partitioner", "metis", "--out", out, "--overwrite",
         "--generator", getattr(args, "generator", "sbm"), *preload_args], log)


def read_run(run_dir):
    """(summary.json, the metrics.jsonl records) of a finished run directory."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return summary, records


def train(shards, mode, run_dir, extra, log, tree=None):
    """One `granndis_hpc.cli train` under `mpirun -n 4`, 2 ranks per server; returns read_run(run_dir).

    tree: another checkout (an older revision) to run instead of this one: its own code comes first on
    sys.path, and the run directory is made fresh (an old revision has no --overwrite-run)."""
    cmd = ["mpirun", "-n", "4", sys.executable, "-m", "granndis_hpc.cli", "train", "--shards", shards,
           "--ranks-per-server", str(RANKS_PER_SERVER), "--mode", mode, "--out", run_dir]
    if tree is None:
        run(cmd + ["--overwrite-run", "--quiet", *extra], log)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd += ["--quiet", *extra]
        log.append(f"(cd {tree} && {' '.join(map(str, cmd))})")
        # `python -m` puts the working directory first on sys.path: each tree runs its own code.
        run(cmd, None, cwd=tree, env=dict(ENV, PYTHONPATH=tree))
    return read_run(run_dir)


def write_page(path, lines, script, argv, log, data=None):
    """Write a results page: its lines, then the commands that reproduce it; print it too.  `data`, when
    given, goes beside it as JSON (same name, .json)."""
    lines = lines + ["## Commands", "", "```", f"python {script} {' '.join(argv or sys.argv[1:])}".rstrip(), *log,
                     "```", ""]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    if data is not None:
        with open(os.path.splitext(path)[0] + ".json", "w") as f:
            json.dump(data, f, indent=1)
    print("\n".join(lines))


def mib(n):
    return f"{n / 2**20:,.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    env = sub.add_parser("env", help="print the MPI environment")
    env.add_argument("--shell", action="store_true", help="as `export KEY=VALUE` lines")
    sub.add_parser("ranks-per-server", help="print the emulated servers' size of the tests and benchmarks")
    args = p.parse_args(argv)
    if args.what == "ranks-per-server":
        print(RANKS_PER_SERVER)
    elif args.shell:
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in MPI_ENV.items()))
    else:
        print(" ".join(f"{k}={v}" for k, v in MPI_ENV.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
