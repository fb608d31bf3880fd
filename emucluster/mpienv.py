"""How mpirun runs on one machine, for the tests, the demo and the benchmarks alike; one definition,
which the Makefile exports for every target:

    python3 -m emucluster.mpienv env            # KEY=VALUE words (the Makefile exports them)
    python3 -m emucluster.mpienv env --shell    # `export KEY=VALUE` lines, for eval in a shell script
    python3 -m emucluster.mpienv ranks-per-server

Standard library only: the Makefile runs it with the system python3 before .venv exists."""
from __future__ import annotations

import argparse
import os
import shlex
import sys

# Open MPI refuses root without the first two; 4 ranks on 2 cores need oversubscription and no binding;
# one torch/BLAS thread per rank (several ranks share the cores); output unbuffered so that a rank's last
# line survives a kill.
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


def mpi_env(*, threads: bool = True, **extra) -> dict:
    """os.environ with MPI_ENV and `extra` on top.  threads=False leaves OMP_NUM_THREADS as it is (a
    script whose single-rank runs may use every core)."""
    env = dict(os.environ, **{k: v for k, v in MPI_ENV.items() if threads or k != "OMP_NUM_THREADS"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m emucluster.mpienv", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
