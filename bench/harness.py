"""The bench harness: one way to run a command or a training run, one results page.

Every script under bench/ imports it (`import harness`: a script's own folder is on sys.path); the MPI
environment is emucluster.mpienv's, the one the tests and the Makefile use.  The package must be
installed (`make setup`, or `pip install -e .`).

    python3 bench/harness.py env [--shell]      # the same as python3 -m emucluster.mpienv env [--shell]
"""
from __future__ import annotations

import json
import shutil
import os
import subprocess
import tempfile
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":  # the environment's command line, run by the system python3 before .venv exists
    os.execvpe(sys.executable, [sys.executable, "-m", "emucluster.mpienv", *sys.argv[1:]],
               dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))

from emucluster.mpienv import MPI_ENV, RANKS_PER_SERVER, mpi_env  # noqa: E402,F401

ENV = mpi_env()


def own_instance(name: str, subnet: str) -> None:
    """Give this benchmark its own emulated cluster (emucluster/config.py instance_names), unless the
    environment names one: set in main(), not at import, so that importing a benchmark's helpers (the
    tests do) leaves the process's environment alone."""
    os.environ.setdefault("GRANNDIS_EMU_INSTANCE", name)
    os.environ.setdefault("GRANNDIS_EMU_SUBNET", subnet)


def run(cmd, log=None, *, env=None, cwd=REPO, timeout=None, capture=False, check=True):
    """Run `cmd` (echoed, and appended to `log`, the page's command list), in the repository with the MPI
    environment unless told otherwise; returns the CompletedProcess.  check=True raises on failure."""
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    if log is not None:
        log.append(" ".join(cmd))
    return subprocess.run(cmd, cwd=cwd, env=ENV if env is None else env, check=check, timeout=timeout,
                          capture_output=capture, text=True)


def run_workers(script, worker_args, ranks=4):
    """Run `script --worker RESULTS worker_args...` under `mpirun -n ranks` and return the JSON its rank 0
    wrote to RESULTS (a temporary file, removed afterwards): the benchmarks whose measured part runs in
    one MPI job while their driver only formats the results."""
    fd, results_file = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        run(["mpirun", "-n", str(ranks), sys.executable, os.path.abspath(script), "--worker", results_file,
             *worker_args])
        with open(results_file) as f:
            return json.load(f)
    finally:
        os.unlink(results_file)


def measure_on_built_sets(script, build_sets, worker_args_of):
    """Build shard sets in a temporary folder (`build_sets(base, log)` -> their paths), run `script`'s
    worker on them (`worker_args_of(paths)`, run_workers) and remove the folder: (the workers' results, the
    commands that reproduce them, with the folder written SETS and paths relative to the repository)."""
    log = []
    base = tempfile.mkdtemp(prefix=f"granndis-{os.path.splitext(os.path.basename(script))[0]}-")
    try:
        worker_args = worker_args_of(build_sets(base, log))
        results = run_workers(script, worker_args)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the shard sets this run built
    log.append(" ".join(["mpirun", "-n", "4", "python", os.path.relpath(script, REPO), "--worker", "RESULTS.json",
                         *worker_args]))
    return results, [line.replace(base, "SETS").replace(REPO + os.sep, "") for line in log]


def build(args, out, preload_args, log, layers=None, vertices=None):
    """`preprocess build` of the synthetic graph for 2 servers x 2 GPUs with METIS (args: vertices, layers,
    and optionally generator)."""
    run(["mpirun", "-n", "2", sys.executable, "-m", "granndis_hpc.preprocess", "build", "--source", "synthetic",
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


def train(shards, mode, run_dir, extra, log):
    """One `granndis_hpc.cli train` under `mpirun -n 4`, 2 ranks per server; returns read_run(run_dir)."""
    cmd = ["mpirun", "-n", "4", sys.executable, "-m", "granndis_hpc.cli", "train", "--shards", shards,
           "--ranks-per-server", str(RANKS_PER_SERVER), "--mode", mode, "--out", run_dir]
    run(cmd + ["--overwrite-run", "--quiet", *extra], log)
    return read_run(run_dir)


def write_page(path, lines, script, argv, log, data=None):
    """Write a results page: its lines, then the commands that reproduce it; print it too.  `data`, when
    given, goes beside it as JSON (same name, .json)."""
    # Paths inside the checkout are written relative to it: the page is read on other machines.
    log = [line.replace(REPO + os.sep, "") for line in log]
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


class Watcher:
    """A daemon thread that calls `poll()` every `interval` seconds while its `with` block runs (a
    memory guard, a peak-RSS poll, a link re-shaper); `poll` returns True to stop watching."""

    interval = 1.0

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        while not self._stop.wait(self.interval):
            if self.poll():
                return

    def poll(self) -> bool:
        raise NotImplementedError
