"""Where the ranks meet to set up torch.distributed (gloo/NCCL inside servers of several ranks): the
address of rank 0's host that every rank connects its TCPStore client to (a pure function of what the
environment and MPI say), and opening the store there within seconds.  Unit-tested; cluster/topology.py
applies both."""
from __future__ import annotations

import datetime
import socket
from typing import Callable, Tuple

# How long a rank tries to connect to rank 0's store (one attempt).  Rank 0 opens the store (listening on
# every interface) before it tells the others where it is, so a right address connects at once; what
# does not connect within this is a wrong address (refused, or nobody answering), said now rather than
# after --dist-timeout (600 s by default), which still bounds every later wait.
CONNECT_S = 10.0


def default_route_address() -> str:
    """The address of the interface of the default route (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]


def rendezvous_address(override: str, single_host: bool, host: str,
                       resolve: Callable[[str], str] = socket.gethostbyname,
                       default_route: Callable[[], str] = default_route_address,
                       source: str = "MASTER_ADDR") -> Tuple[str, str]:
    """(address, how it was chosen) of rank 0's host.

    override: --master-addr or MASTER_ADDR (`source`: which; an address every node reaches, e.g. the
    InfiniBand interface's), used as is.
    Otherwise one host: loopback.  Several: rank 0's host name as MPI reports it (MPI_Get_processor_name),
    resolved by the cluster's name service -- the name the other nodes know the host by, where the
    default route (often a management Ethernet on a multi-homed node) may not be reachable from them;
    a name that resolves to loopback (Debian's 127.0.1.1 entry) or not at all falls back to the default
    route's address."""
    if override:
        return override, source
    if single_host:
        return "127.0.0.1", "one host: loopback"
    try:
        address = resolve(host)
        if not address.startswith("127."):
            return address, f"rank 0's host name {host} (MPI_Get_processor_name), resolved"
    except OSError:
        pass
    return default_route(), (f"the default route's interface on {host} (its name did not resolve to a non-loopback "
                             "address)")


def connect_seconds(dist_timeout_s: float) -> float:
    """The connect deadline: CONNECT_S, or --dist-timeout where that is shorter."""
    return min(CONNECT_S, float(dist_timeout_s))


def open_store(address: str, port: int, world_size: int, is_master: bool, connect_s: float, timeout_s: float):
    """torch.distributed's TCPStore at address:port with timeout_s for its waits.  Rank 0 (is_master,
    port 0 = a free one) first checks that `address` is one of its host's (binding to it: instant,
    where torch's own client would retry for timeout_s); the other ranks first connect once to
    address:port within connect_s (torch's client would retry a refused or unanswered connection for
    timeout_s).  OSError names the address and what failed."""
    import torch.distributed as dist

    if is_master:
        try:
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
        except OSError as exc:
            raise OSError(f"{address} is not an address of this host ({exc.strerror})") from None
    else:
        try:
            socket.create_connection((address, port), timeout=connect_s).close()
        except OSError as exc:
            why = "no answer" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
            raise OSError(f"connecting to {address}:{port}: {why}") from None
    return dist.TCPStore(address, port, world_size, is_master, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)
