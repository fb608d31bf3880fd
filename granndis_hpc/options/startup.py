"""The cluster and start-up options that `granndis-train`, `granndis predict` and the cluster self-check
share (:class:`ClusterOptions`): the emulated server size, the device and intra-server transport, where
the ranks meet, how long they wait for each other, whether ranks may share a GPU, deterministic kernels
and the host staging of the GPU path emulated on the CPU.  The topology (cluster/topology.py) and the
Communicator (cluster/comm.py) take them as arguments.

Standard library and the options framework only: cluster/topology.py and cluster/selfcheck.py read this
module (docs/design.md §3), and a command's --help must load neither torch nor MPI."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .declare import Options, option

# cluster/topology.py checks the same lists (DEVICES, TRANSPORTS; tests/unit/test_config.py keeps them
# equal): it is not imported here because it imports mpi4py, which initialises MPI.
DEVICE_NAMES = ("auto", "cpu", "cuda")
TRANSPORT_NAMES = ("auto", "gloo", "nccl", "mpi")
DEFAULT_DIST_TIMEOUT_S = 600.0
# torch.distributed's convention for the store's address; --master-addr, when given, wins over it.
ENV_MASTER_ADDR = "MASTER_ADDR"


def _address_problem(value: Optional[str]) -> Optional[str]:
    if value is None or (value.strip() and not any(c.isspace() for c in value)):
        return None
    return f"must be a host name or IP address of rank 0's node, got {value!r}"


@dataclass
class ClusterOptions(Options):
    """Where and how the ranks run.  In granndis-train only --device is kept on --resume (the cluster or
    its network may differ; none of the others changes a number a run computes)."""
    OPTIONS_GROUP = "cluster"
    ranks_per_server: Optional[int] = option(None, ge=1, on_resume="may_change", resume_shape=True,
                                             help="emulate servers of N ranks (default: env "
                                                  "GRANNDIS_RANKS_PER_SERVER, else one server per shared-memory "
                                                  "node)")
    device: str = option("auto", choices=DEVICE_NAMES, help="auto = cuda:local_rank when CUDA is available")
    intra_transport: str = option("auto", choices=TRANSPORT_NAMES, on_resume="may_change",
                                  help="intra-server transport (auto: NCCL on GPU, measured default on CPU)")
    master_addr: Optional[str] = option(
        None, metavar="ADDR", check=_address_problem, on_resume="may_change",
        help="the address of rank 0's node where the ranks meet to set up torch.distributed (gloo/NCCL inside "
             "servers), e.g. its InfiniBand interface's; wins over the MASTER_ADDR environment variable (torch's "
             "convention, also honoured); default: rank 0's host name as MPI reports it, resolved by the "
             "cluster's name service (loopback on one host)")
    dist_timeout: float = option(
        DEFAULT_DIST_TIMEOUT_S, gt=0.0, metavar="SECONDS", on_resume="may_change",
        help="how long torch.distributed's rendezvous and collectives wait before every rank stops with an error "
             "naming the host that did not answer (connecting to rank 0's store takes at most 10 s, or this if "
             "shorter: a wrong address is said at once)")
    deterministic: bool = option(
        False, on_resume="may_change",
        help="deterministic kernels (torch.use_deterministic_algorithms): on a GPU the additions that use atomics "
             "(GAT, the index_add aggregation, scatter_add) take their deterministic form, so two runs give the "
             "same bits; an operation without one stops the run with torch's error. Slower on a GPU; the CPU's "
             "kernels are deterministic already")
    share_gpus: bool = option(
        False, on_resume="may_change",
        help="let several ranks use one GPU when a host has more ranks than GPUs (e.g. emulated servers on one "
             "GPU, with --intra-transport mpi); without it that is an error on every rank")
    host_staging: bool = option(
        False, on_resume="may_change",
        help="on the CPU, run the GPU path's host-side logic with plain copies: the staging of MPI messages "
             "(pooled buffers, copies out before the sends and back after the receives) and cob/mb's loader "
             "stream (co-batch tensors put by the loader, waited for by the step); the same results, for "
             "checking that logic without a GPU (on a GPU both are always on)")


def topology_args(opts: ClusterOptions) -> Dict:
    """The keyword arguments of cluster.topology.init_topology from a command's options."""
    return {"share_gpus": bool(opts.share_gpus), "dist_timeout_s": float(opts.dist_timeout),
            "master_addr": opts.master_addr}


def master_addr(option_value: Optional[str], environ=os.environ) -> Tuple[str, str]:
    """The rendezvous override and where it came from: --master-addr, else MASTER_ADDR, else ("", "")."""
    if option_value:
        return option_value.strip(), "--master-addr"
    env = environ.get(ENV_MASTER_ADDR, "").strip()
    return (env, ENV_MASTER_ADDR) if env else ("", "")
