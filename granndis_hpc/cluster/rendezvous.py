"""Where the ranks meet to set up torch.distributed (gloo/NCCL inside servers): the address of rank 0's
host that every rank connects its TCPStore client to.  A pure function of what the environment and MPI
say, unit-tested; cluster/topology.py applies it."""
from __future__ import annotations

import socket
from typing import Callable, Tuple


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
    return default_route(), f"the default route's interface on {host} (its name did not resolve to a non-loopback address)"
