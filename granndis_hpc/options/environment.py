"""The environment variables the product reads, declared once (docs/configuration.md renders them).

A setting is a command-line option (declared with `option()` in the commands' options classes) unless it
must reach code that no option reaches: every rank of an MPI job started by a launcher or a test harness
that passes the environment through (mpirun -x, srun, emucluster/ forwards GRANNDIS_* to its ranks), a
module-level default read at import, or the site's installation of a library.  Those are declared here,
with the module that reads them; tests/unit/test_environment.py fails on a GRANNDIS_ name read in
granndis_hpc/ or preprocess/ that is not declared, and on a declared one that nothing reads.
Standard library only, like the rest of this package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple


@dataclass(frozen=True)
class EnvVar:
    name: str
    values: str   # what it takes, e.g. "0 | 1", "PATH"
    default: str  # what holds when it is unset
    read_by: str  # the module that reads it
    help: str


ENVIRONMENT: Tuple[EnvVar, ...] = (
    # The cluster layer, read on every rank.
    EnvVar("GRANNDIS_RANKS_PER_SERVER", "N (>= 1)", "one server per shared-memory node",
           "granndis_hpc/cluster/topology.py",
           "emulate servers of N consecutive ranks where --ranks-per-server is not given.  The emulation hook "
           "of the tests, the emulated cluster (emucluster/) and the Slurm scripts: an environment variable "
           "because every rank and every command that builds the topology (the self-check, the MPI tests, "
           "predict) must see the same value without each passing an option (docs/emulated-cluster.md)"),
    EnvVar("GRANNDIS_INTRA_TRANSPORT", "gloo | nccl | mpi", "NCCL on GPU, the measured default on CPU",
           "granndis_hpc/cluster/topology.py",
           "the intra-server transport where --intra-transport is auto (docs/performance/comm.md)"),
    EnvVar("GRANNDIS_CHECK_COMM", "0 | 1", "0", "granndis_hpc/cluster/comm.py",
           "1: every exchange also sends its counts to its peers and fails on a mismatch (a debugging check: "
           "one more message per exchange)"),
    EnvVar("GRANNDIS_MESSAGE_PIECE_BYTES", "BYTES", "32768", "granndis_hpc/cluster/comm.py",
           "the largest message between servers: a halo block or a 2-server gradient bucket travels in pieces "
           "of at most this many bytes, under Open MPI's TCP eager limit, so both directions move at once; "
           "0: one message a block (for RDMA fabrics, where a rendezvous does not wait behind data)"),
    EnvVar("GRANNDIS_PROGRESS_POLL", "FIRST_S[,FACTOR,MAX_S]", "0.001,2,0.004", "granndis_hpc/cluster/pending.py",
           "how often the progress thread polls the pending exchanges: the first interval, the back-off factor "
           "and the longest interval, in seconds (read at import on every rank; bench/bench_cluster.py "
           "records it)"),
    EnvVar("GRANNDIS_EXCHANGE_TRACE", "0 | 1", "0", "granndis_hpc/cluster/trace.py",
           "1: every rank records its halo exchanges' events (posted, waited, completed) and, with --out, "
           "writes them to RUN_DIR/exchange-trace-rank<R>.json when the run ends (read at import on every "
           "rank)"),
    # Training.
    EnvVar("GRANNDIS_STOP_FILE", "PATH", "none", "granndis_hpc/engine/signals.py",
           "a file whose existence asks the run to stop with a checkpoint, as SIGUSR1 does: slurm/lib.sh sets "
           "it and creates the file on the time-limit warning, which srun drops before the tasks start"),
    EnvVar("GRANNDIS_CPU_KERNELS", "auto | native | torch", "auto", "granndis_hpc/nn/cpu_kernels.py",
           "the CPU path's sparse product and keyed dropout: native, the C kernels of nn/cpu_kernels.c "
           "(built with the package, the extension granndis_hpc.nn._cpu_kernels; faster: "
           "docs/performance/single-rank.md; the same dropout masks as torch's ops, bit for bit, and each product "
           "row summed in its entries' order without fused multiply-adds, which torch's CPU kernel matches bit for "
           "bit on some CPUs and in all but the last bits on others, MKL's AVX-512 path); torch, torch's ops; "
           "auto, the C "
           "kernels where the package was installed with them, else torch's ops with one warning.  A run's "
           "summary.json names what it used (compute)"),
    # Preprocessing.
    EnvVar("GRANNDIS_BUILD_PROFILE", "PATH", "none", "preprocess/__main__.py",
           "write every rank's wall and CPU seconds and peak RSS per build phase as JSON to PATH "
           "(bench/bench_build_scaling.py reads it)"),
    EnvVar("GRANNDIS_PARMETIS_LIB", "PATH", "libparmetis.so on the library path",
           "preprocess/partition/parmetis.py", "the ParMETIS shared library (--partitioner parmetis; "
                                               "docs/preparing-data.md)"),
    EnvVar("GRANNDIS_SCOTCH_BAND_WIDTH", "N (>= 1)", "1", "preprocess/partition/parmetis.py",
           "the width of PT-Scotch's refinement band (3 with GRANNDIS_SCOTCH_BAND_GATHER=always: the ParMETIS "
           "compatibility layer's partition exactly)"),
    EnvVar("GRANNDIS_SCOTCH_BAND_GATHER", "F (> 0) | always", "2", "preprocess/partition/parmetis.py",
           "a band is gathered onto every process only while it holds fewer than F slices' worth of arcs "
           "(always: every band, PT-Scotch's own strategy)"),
    EnvVar("GRANNDIS_SCOTCH_MMAP_MIB", "MiB (>= 0)", "1", "preprocess/partition/parmetis.py",
           "during a ParMETIS call, malloc maps allocations of at least this size, so freed ones return to "
           "the system (0: malloc as it is)"),
)


def declared_names() -> List[str]:
    return [v.name for v in ENVIRONMENT]


def render() -> List[str]:
    """The reference section of docs/configuration.md."""
    lines = ["## Environment variables", "",
             "Read where no command-line option reaches: on every rank of a launched job, at import, or for the",
             "site's libraries. Give them identically to every rank (`mpirun -x NAME`, exported before `srun`).", "",
             "| Variable | Values | Unset | Read by | Meaning |", "|---|---|---|---|---|"]
    for v in ENVIRONMENT:
        cells = (f"`{v.name}`", v.values, v.default, f"`{v.read_by}`", v.help)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines + [""]
