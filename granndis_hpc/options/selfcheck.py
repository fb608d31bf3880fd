"""The options of the cluster layer's self-check (``python -m granndis_hpc.cluster.selfcheck``): four of
the cluster options every command shares (startup.py), a failure to inject and a seed.  Standard library
and the options framework only, like startup.py: the cluster package reads it (docs/design.md §3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .declare import Options, option, reuse
from .startup import ClusterOptions

SELFCHECK_PROG = "python -m granndis_hpc.cluster.selfcheck"


@dataclass
class SelfcheckOptions(Options):
    ranks_per_server: Optional[int] = reuse(ClusterOptions, "ranks_per_server")
    device: str = reuse(ClusterOptions, "device")
    intra_transport: str = reuse(ClusterOptions, "intra_transport")
    master_addr: Optional[str] = reuse(ClusterOptions, "master_addr")
    dist_timeout: float = reuse(ClusterOptions, "dist_timeout")
    fail_rank: Optional[int] = option(None, ge=0, metavar="R",
                                      help="rank that raises before the first collective (to show that the job "
                                           "then fails on every rank instead of hanging)")
    seed: int = option(0, ge=0, help="seed of the random blocks exchanged and reduced")
