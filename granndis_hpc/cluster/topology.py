"""Servers, ranks and process groups of one job.

A *server* is a set of ranks with fast links between them (one machine with NVLink).  By default
servers are the shared-memory nodes MPI sees (`Split_type(COMM_TYPE_SHARED)`).  On one machine,
`ranks_per_server=N` (or env GRANNDIS_RANKS_PER_SERVER=N) emulates servers of N consecutive ranks.
Every server must have the same number of ranks.

`init_topology` is collective over MPI.COMM_WORLD.  It also initialises `torch.distributed` (when the
intra-server transport is gloo or NCCL and servers have several ranks): rank 0 opens a TCPStore on a free
port and broadcasts its address and port over MPI (rendezvous.py: a wrong address fails in seconds), the
default group carries nothing (NCCL on GPUs, gloo on CPU), and one subgroup per server is created on
every rank in server order (torch requires every rank to take part in every `new_group`).
`Topology.close()` destroys the process group, so several topologies can be built one after the
other in one process (the MPI tests build 2x2, 1x4 and 4x1 in one `mpirun -n 4`).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .devices import device_kind as device_kinds, gpu_positions, scheduler_gpus, select_gpu
from .errors import ClusterError, agree
from .rendezvous import connect_seconds, open_store, rendezvous_address
from granndis_hpc.mpistart import thread_level_problem
from granndis_hpc.options.startup import master_addr as startup_master_addr

ENV_RANKS_PER_SERVER = "GRANNDIS_RANKS_PER_SERVER"
ENV_INTRA_TRANSPORT = "GRANNDIS_INTRA_TRANSPORT"
DEFAULT_DIST_TIMEOUT_S = 600.0
DEVICES = ("auto", "cpu", "cuda")
TRANSPORTS = ("auto", "gloo", "nccl", "mpi")

# Default intra-server transport on CPU, chosen by measurement (bench/bench_comm.py -> docs/performance/comm.md;
# 4 ranks as 2 servers x 2 on this shared 2-core machine, 2026-11-29): MPI (Open MPI shared memory) was
# 2.5-3x faster than gloo (loopback TCP) for 4 MiB blocks in the intra exchange, the world exchange and
# the all-reduce, and 1.5x for a 256 KiB all-reduce; gloo was faster by 1-7 ms for 4-256 KiB exchange
# blocks.  Summed over the measured set MPI took 110 ms against gloo's 214 ms, and an epoch's
# communication time is dominated by its large messages, so MPI is the default.  Override with
# init_topology(intra_transport=...) or GRANNDIS_INTRA_TRANSPORT=gloo.
CPU_DEFAULT_INTRA_TRANSPORT = "mpi"


@dataclass
class Topology:
    world: MPI.Comm                      # a duplicate of MPI.COMM_WORLD owned by this topology
    server_comm: MPI.Comm                # the ranks of this rank's server, ordered by local rank
    leader_comm: MPI.Comm | None         # local rank 0 of every server, rank = server index; None elsewhere
    rank: int
    world_size: int
    server: int
    local_rank: int
    servers: int
    ranks_per_server: int
    device: torch.device
    intra_group: "dist.ProcessGroup | None"  # this rank's server subgroup (None with the MPI transport)
    intra_transport: str = "mpi"         # resolved: gloo | nccl | mpi
    rank_table: np.ndarray = field(default=None, repr=False)  # [servers, ranks_per_server] -> global rank
    hosts: tuple = ()                    # host name(s) of each server's ranks, by server
    emulated: bool = False               # servers from ranks_per_server rather than shared-memory nodes
    ranks_on_node: int = 1               # ranks sharing this rank's machine (its cores), emulated servers included
    _server_of: np.ndarray = field(default=None, repr=False)
    _local_of: np.ndarray = field(default=None, repr=False)
    _owns_dist: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def mpi_comm(self) -> MPI.Comm:
        """The world communicator: what `agree` / `collective_errors` use when given a Topology."""
        return self.world

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    def global_rank(self, server, local_rank):
        """Global rank of (server, local_rank); accepts ints or integer arrays."""
        out = self.rank_table[server, local_rank]
        return int(out) if np.ndim(out) == 0 else out

    def server_of(self, rank):
        out = self._server_of[rank]
        return int(out) if np.ndim(out) == 0 else out

    def local_rank_of(self, rank):
        out = self._local_of[rank]
        return int(out) if np.ndim(out) == 0 else out

    def server_ranks(self, server: int | None = None) -> np.ndarray:
        """Global ranks of a server (default: this rank's), ordered by local rank."""
        return self.rank_table[self.server if server is None else server]

    # ---- object collectives: the engine and preprocess go through these, never through mpi4py ----
    def group(self, name: str = "world"):
        """The communicator of a named group: "world" or "server" (this rank's server)."""
        if name == "world":
            return self.world
        if name == "server":
            return self.server_comm
        raise ValueError(f"unknown group {name!r}; expected 'world' or 'server'")

    def allgather_object(self, obj, group: str = "world") -> list:
        return self.group(group).allgather(obj)

    def gather_object(self, obj, root: int = 0, group: str = "world"):
        """Objects of every rank of the group, on `root` (a list there, None elsewhere)."""
        return self.group(group).gather(obj, root=root)

    def bcast_object(self, obj, root: int = 0, group: str = "world"):
        return self.group(group).bcast(obj, root=root)

    def exchange_counts(self, counts, group: str = "world") -> list:
        """All-to-all of one integer per peer of the group: counts[p] goes to peer p."""
        return [int(c) for c in self.group(group).alltoall([int(c) for c in counts])]

    def barrier(self, group: str = "world") -> None:
        self.group(group).Barrier()

    def describe(self) -> str:
        """One line per server: index, host(s), global ranks, leader, device kind, transport."""
        lines = [f"{self.servers} server(s) x {self.ranks_per_server} rank(s)"
                 f"{' (emulated)' if self.emulated else ''}, device {self.device.type}, "
                 f"intra-server transport {self.intra_transport}, inter-server MPI"]
        for s in range(self.servers):
            ranks = ",".join(map(str, self.rank_table[s]))
            lines.append(f"  server {s:3d}  host {self.hosts[s]:<20s} ranks {ranks:<16s} "
                         f"leader {self.rank_table[s, 0]}")
        return "\n".join(lines)

    def close(self) -> None:
        """Destroy the torch process group created by init_topology and free the communicators.

        Collective (every rank must call it).  Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._owns_dist and dist.is_initialized():
            dist.destroy_process_group()
        for comm in (self.leader_comm, self.server_comm, self.world):
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()


def init_topology(ranks_per_server: int | None = None, device: str = "auto", intra_transport: str = "auto", *,
                  share_gpus: bool = False, dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S,
                  master_addr: Optional[str] = None) -> Topology:
    """Build the topology of this job.  Collective over MPI.COMM_WORLD.

    ranks_per_server: None = one server per shared-memory node (or env GRANNDIS_RANKS_PER_SERVER);
        N = emulate servers of N consecutive ranks.
    device: "auto" (CUDA when every rank has it, else CPU), "cpu" or "cuda".
    intra_transport: "auto" (env GRANNDIS_INTRA_TRANSPORT, else NCCL on CUDA and the measured CPU
        default), "gloo", "nccl" or "mpi".
    share_gpus: several ranks may use one GPU (--share-gpus); otherwise more ranks than GPUs is an error.
    dist_timeout_s: how long a rank waits for torch.distributed's store and collectives (--dist-timeout).
    master_addr: the store's address (--master-addr); None: MASTER_ADDR, else rank 0's host (rendezvous.py).
    Any configuration problem raises the same ClusterError on every rank.
    """
    world = MPI.COMM_WORLD.Dup()
    try:
        return _build(world, ranks_per_server, device, intra_transport,
                      dict(share_gpus=share_gpus, dist_timeout_s=dist_timeout_s, master_addr=master_addr))
    except BaseException:
        if world != MPI.COMM_NULL:  # not yet freed by Topology.close()
            world.Free()
        raise


def _build(world: MPI.Comm, ranks_per_server, device: str, intra_transport: str, start: dict) -> Topology:
    rank, size = world.Get_rank(), world.Get_size()
    host = MPI.Get_processor_name()
    hosts_of_rank = world.allgather(host)

    rps, problem = _resolve_ranks_per_server(ranks_per_server, size)
    agree(world, problem is None, problem or "")
    all_rps = world.allgather(rps)
    if len(set(all_rps)) != 1:
        raise ClusterError(f"ranks disagree on ranks_per_server ({all_rps} by rank); set "
                           f"{ENV_RANKS_PER_SERVER} identically for every rank", collective=True)

    node_comm = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        ranks_on_node = node_comm.Get_size()
        if rps is None:
            server, server_comm = _servers_from_nodes(world, node_comm, hosts_of_rank)
            node_comm = None  # now owned as server_comm
        else:
            server = rank // rps
            server_comm = world.Split(color=server, key=rank)
    finally:
        if node_comm is not None:
            node_comm.Free()

    local_rank = server_comm.Get_rank()
    table = np.array(world.allgather((server, local_rank)), dtype=np.int64)  # [P, 2] by global rank
    server_of, local_of = table[:, 0].copy(), table[:, 1].copy()
    servers, group_size = int(server_of.max()) + 1, server_comm.Get_size()
    rank_table = np.empty((servers, group_size), dtype=np.int64)
    rank_table[server_of, local_of] = np.arange(size)
    hosts = tuple("+".join(sorted({hosts_of_rank[r] for r in rank_table[s]})) for s in range(servers))
    if rps is not None:
        spanning = [f"server {s} on {hosts[s]}" for s in range(servers) if "+" in hosts[s]]
        agree(world, not spanning, f"emulated servers span several hosts ({'; '.join(spanning)}): "
              f"ranks_per_server={rps} must divide the number of ranks per host")

    leader_comm = world.Split(color=0 if local_rank == 0 else MPI.UNDEFINED, key=server)
    if leader_comm == MPI.COMM_NULL:
        leader_comm = None

    topo = Topology(world=world, server_comm=server_comm, leader_comm=leader_comm, rank=rank,
                    world_size=size, server=server, local_rank=local_rank, servers=servers,
                    ranks_per_server=group_size, device=torch.device("cpu"), intra_group=None,
                    rank_table=rank_table, hosts=hosts, emulated=rps is not None, ranks_on_node=ranks_on_node,
                    _server_of=server_of, _local_of=local_of)
    try:
        topo.device = _resolve_device(world, device, start["share_gpus"])
        topo.intra_transport = _resolve_transport(world, intra_transport, topo.device)
        if topo.intra_transport == "nccl":
            _check_one_gpu_per_rank(topo)
        # torch.distributed only for servers of several ranks: a server of one rank (one GPU per node)
        # exchanges and reduces nothing inside itself (cluster/comm.py), so no store, no group, no rendezvous.
        if topo.intra_transport in ("gloo", "nccl") and topo.ranks_per_server > 1:
            topo.intra_group = _init_torch_distributed(topo, len(set(hosts_of_rank)) == 1, start["dist_timeout_s"],
                                                       start["master_addr"])
            topo._owns_dist = True
    except BaseException:
        topo.close()
        raise
    return topo


def _resolve_ranks_per_server(ranks_per_server, world_size: int):
    """(value or None, problem message or None) -- local, checked collectively by the caller."""
    source = "ranks_per_server"
    if ranks_per_server is None:
        env = os.environ.get(ENV_RANKS_PER_SERVER, "").strip()
        if not env:
            return None, None
        source = f"{ENV_RANKS_PER_SERVER}={env!r}"
        try:
            ranks_per_server = int(env)
        except ValueError:
            return None, f"{source} is not an integer; set it to the number of ranks per server"
    if isinstance(ranks_per_server, bool) or not isinstance(ranks_per_server, (int, np.integer)):
        return None, f"{source} must be an integer, got {ranks_per_server!r}"
    rps = int(ranks_per_server)
    if rps < 1:
        return None, (f"{source} gives {rps} ranks per server; a server needs at least 1 rank (set it to "
                      f"the number of GPUs per server, a divisor of the {world_size} ranks of this job)")
    if world_size % rps != 0:
        rounded_up = -(-world_size // rps) * rps
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        return None, (f"{source} gives {rps} ranks per server, which does not divide the {world_size} "
                      f"ranks of this job; every server needs the same number of ranks: start "
                      f"{rounded_up} ranks ({rounded_up // rps} servers of {rps}), or use one of "
                      f"{', '.join(map(str, divisors))} ranks per server")
    return rps, None


def _servers_from_nodes(world: MPI.Comm, node_comm: MPI.Comm, hosts_of_rank):
    """Servers = shared-memory nodes, numbered by their lowest global rank; all must be the same size."""
    rank = world.Get_rank()
    first_rank = node_comm.allreduce(rank, op=MPI.MIN)
    firsts = np.array(world.allgather(first_rank))
    keys, server_of, sizes = np.unique(firsts, return_inverse=True, return_counts=True)
    if len(set(sizes.tolist())) != 1:
        listing = ", ".join(f"{hosts_of_rank[k]}: {n}" for k, n in zip(keys, sizes))
        raise ClusterError(f"servers have different numbers of ranks ({listing}); start the same number "
                           f"of ranks on every node (e.g. mpirun --map-by ppr:G:node or srun "
                           f"--ntasks-per-node=G)", collective=True)
    return int(server_of[rank]), node_comm


def _visible_set() -> tuple:
    """What identifies the GPUs this rank sees: their UUIDs where torch exposes them, else
    CUDA_VISIBLE_DEVICES (ranks with the same set share it out in rank order)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    uuids = [getattr(torch.cuda.get_device_properties(i), "uuid", None) for i in range(n)]
    if n and all(u is not None for u in uuids):
        return tuple(str(u) for u in uuids)
    return (os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"), n)


def _resolve_device(world: MPI.Comm, device: str, share_gpus: bool = False) -> torch.device:
    agree(world, device in DEVICES, f"device must be one of {DEVICES}, got {device!r}")
    has_cuda = torch.cuda.is_available()
    hosts = world.allgather(MPI.Get_processor_name())
    allocated = world.allgather(scheduler_gpus(os.environ) if device == "auto" and not has_cuda else "")
    kind, problem = device_kinds(device, world.allgather(has_cuda), hosts, allocated, _torch_build())
    agree(world, not problem, problem)
    if kind == "cpu":
        return torch.device("cpu")
    # GPU training calls MPI from autograd's device thread (the exchange's backward, gradient hooks).
    thread_problem = thread_level_problem(MPI.Query_thread(), MPI.THREAD_SERIALIZED, MPI.Get_library_version())
    agree(world, not thread_problem, thread_problem)
    rank = world.Get_rank()
    position, count = gpu_positions(hosts, world.allgather(_visible_set()))[rank]
    index, problem = select_gpu(position, count, torch.cuda.device_count(), share_gpus, hosts[rank])
    agree(world, not problem, problem)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _torch_build() -> str:
    """torch's version and its CUDA build, for the refusal of a CPU wheel on a GPU node."""
    cuda = torch.version.cuda
    return (f"torch {torch.__version__} "
            f"({f'built for CUDA {cuda}, no usable GPU found' if cuda else 'a CPU-only build'})")


def _resolve_transport(world: MPI.Comm, requested: str, device: torch.device) -> str:
    source = "intra_transport"
    if requested == "auto" and os.environ.get(ENV_INTRA_TRANSPORT, "").strip():
        requested = os.environ[ENV_INTRA_TRANSPORT].strip()
        source = ENV_INTRA_TRANSPORT
    problem = ""
    if requested not in TRANSPORTS:
        problem = f"{source} must be one of {TRANSPORTS}, got {requested!r}"
    elif requested == "auto":
        requested = "nccl" if device.type == "cuda" else CPU_DEFAULT_INTRA_TRANSPORT
    elif requested == "nccl" and device.type != "cuda":
        problem = f"{source}=nccl needs CUDA tensors but the device is {device}; use gloo or mpi on CPU"
    elif requested == "gloo" and device.type == "cuda":
        problem = f"{source}=gloo is for CPU tensors; with CUDA use nccl (or mpi, staged through host memory)"
    if requested == "nccl" and not problem and not dist.is_nccl_available():
        problem = "intra_transport=nccl but this torch build has no NCCL; use mpi"
    if requested == "gloo" and not problem and not dist.is_gloo_available():
        problem = "intra_transport=gloo but this torch build has no gloo; use mpi"
    agree(world, not problem, problem)
    return requested


def _gpu_identity(device: torch.device) -> str:
    """Physical identity of a GPU: its UUID where torch exposes it, else host + visible set + index."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        return str(uuid)
    return f"{MPI.Get_processor_name()}:{os.environ.get('CUDA_VISIBLE_DEVICES', '')}:{device.index}"


def device_memory(topo, mem_get_info=None, identity=None) -> Optional[tuple]:
    """Collective: (free, total) bytes of the GPU with the least free memory per rank, as the devices
    report them now (torch.cuda.mem_get_info: what the CUDA context, NCCL's buffers, the allocator and
    other processes hold is already gone from free); ranks sharing one GPU (--share-gpus) split its
    free memory.  None on the CPU.  mem_get_info and identity (device -> GPU identity) stand in for
    torch.cuda's in tests."""
    if topo.device.type != "cuda":
        return None
    free, total = (mem_get_info or torch.cuda.mem_get_info)(topo.device)
    reports = topo.world.allgather(((identity or _gpu_identity)(topo.device), int(free), int(total)))
    sharing: Dict[object, int] = {}
    for gpu, _, _ in reports:
        sharing[gpu] = sharing.get(gpu, 0) + 1
    return min((f // sharing[gpu], t) for gpu, f, t in reports)


def _check_one_gpu_per_rank(topo: Topology) -> None:
    """NCCL refuses two ranks of one communicator on one GPU, but only at the first collective and
    with a cryptic message; say it up front."""
    ids = topo.server_comm.allgather(_gpu_identity(topo.device))
    mine = [r for r, gpu in zip(topo.server_ranks().tolist(), ids) if gpu == ids[topo.local_rank]]
    agree(topo.world, len(mine) == 1,
          f"ranks {','.join(map(str, mine))} of server {topo.server} share GPU {topo.device} and NCCL needs one "
          f"GPU per rank of a server: start one rank per GPU, or use intra_transport=mpi (staged through host)")


def _init_torch_distributed(topo: Topology, single_host: bool, seconds: float, master_addr: Optional[str]):
    world = topo.world
    if dist.is_initialized():
        raise ClusterError("torch.distributed is already initialised in this process; close the previous "
                           "Topology (topo.close()) before building a new one", collective=True)
    timeout = datetime.timedelta(seconds=seconds)
    connect_s = connect_seconds(seconds)  # the store is listening before anyone connects: a failure is an address
    store = None
    endpoint: Optional[Tuple[str, int, Optional[str], str]] = None  # (address, port, how, error) on rank 0
    if topo.rank == 0:
        address, how = "", "not chosen"
        try:
            override, source = startup_master_addr(master_addr)
            address, how = rendezvous_address(override, single_host, MPI.Get_processor_name(), source=source)
            # Port 0: the OS picks a free port and the store reports it, so no probe-then-bind race.
            port = int(os.environ.get("MASTER_PORT", "0"))
            store = open_store(address, port, topo.world_size, True, connect_s, seconds)
            endpoint = (address, int(store.port), how, "")
        except Exception as exc:  # noqa: BLE001 -- reported to every rank below
            # An address that is not rank 0's host's fails here at once (open_store), where torch's own
            # client would have retried it for the whole --dist-timeout.
            endpoint = ("", 0, None, f"host {MPI.Get_processor_name()} (rank 0) could not open the torch.distributed "
                                     f"store at {address or '?'} ({how}): {exc}; give --master-addr with an address "
                                     f"of {topo.hosts[0]} every node reaches (e.g. its InfiniBand interface's), or "
                                     f"MASTER_PORT for a fixed port")
    address, port, how, problem = world.bcast(endpoint, root=0)
    if problem:
        raise ClusterError(problem, collective=True)
    problem = ""
    if store is None:
        try:
            store = open_store(address, port, topo.world_size, False, connect_s, seconds)
        except Exception as exc:  # noqa: BLE001 -- agreed below, so no rank waits for the others
            problem = (f"host {MPI.Get_processor_name()} (rank {topo.rank}) could not reach the torch.distributed "
                       f"store of rank 0 on {topo.hosts[0]} ({how}) within {connect_s:g} s: {exc}; give "
                       f"--master-addr with an address of {topo.hosts[0]} every node reaches (e.g. its InfiniBand "
                       f"interface's)")
    problems = [p for p in world.allgather(problem) if p]
    if problems:
        raise ClusterError(problems[0] + (f" (and {len(problems) - 1} more host(s))" if len(problems) > 1 else ""),
                           collective=True)
    # The default group carries nothing (every collective names a server subgroup).  On GPUs it is
    # NCCL, which connects lazily, at a first collective that never comes; gloo (CPU) connects every pair
    # of ranks when made, which the MPI transport (the CPU default) does not need.
    default = "nccl" if topo.device.type == "cuda" else "gloo"
    dist.init_process_group(default, store=store, rank=topo.rank, world_size=topo.world_size, timeout=timeout)
    backend = topo.intra_transport
    mine = None
    for s in range(topo.servers):  # every rank creates every subgroup, in the same order
        group = dist.new_group(ranks=topo.rank_table[s].tolist(), backend=backend, timeout=timeout)
        if s == topo.server:
            mine = group
    return mine
