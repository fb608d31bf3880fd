"""The running job as the API sees it: MPI started (one process without mpirun is a world of one rank),
and the shape the topology finds for it -- servers x ranks per server, the shape a shard set is built for.

MPI is started here, before anything imports mpi4py's MPI module, by mpistart.init_mpi: it sets this
rank's GPU first (a CUDA-aware MPI makes its context on the current device), as the command-line entry
points do.  Under mpirun/srun the launcher's variables give each rank its place; started by hand, MPI
runs as a singleton.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class World:
    """This process's place in the job and the job's shape."""
    rank: int
    size: int
    servers: int
    ranks_per_server: int

    @property
    def shape(self) -> str:
        return f"{self.servers}x{self.ranks_per_server}"


def start(device: str = "auto") -> None:
    """Start MPI for `device` ("auto", "cpu" or "cuda") unless it runs already (then nothing changes)."""
    from granndis_hpc.mpistart import init_mpi

    init_mpi(device)


def world(ranks_per_server: Optional[int] = None, device: str = "auto") -> World:
    """Collective: this job's shape, as training finds it (cluster/topology.py: `ranks_per_server`, else
    GRANNDIS_RANKS_PER_SERVER, else one server per shared-memory node).  A shape the ranks cannot form
    raises the same GranndisError on every rank."""
    from granndis_hpc.api.errors import passed_on

    start(device)
    from granndis_hpc.cluster.topology import init_topology

    try:
        # Only the shape is read: no GPU is chosen and no torch.distributed group is made.
        topo = init_topology(ranks_per_server, device="cpu", intra_transport="mpi")
    except Exception as exc:  # noqa: BLE001 -- a ClusterError every rank raised (agree)
        raise passed_on(exc, "the job's shape") from exc
    try:
        return World(rank=topo.rank, size=topo.world_size, servers=topo.servers,
                     ranks_per_server=topo.ranks_per_server)
    finally:
        topo.close()
