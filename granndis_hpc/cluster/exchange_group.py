"""An exchange group: the peers a view's rows move between, as one object.

A view (engine/views.py) needs four things of the ranks it exchanges with, and they must agree with
each other: the row exchange (blocking, and its overlapped `_start` form), the all-to-all of one
integer per peer that sizes it (the count exchange), the ledger link classes its bytes are charged
to, and the dtype training halo rows travel in on the wire (--halo-dtype).  `Communicator.group(name)`
builds the group of a name; every view (world, server, co-batch) takes one, so a new transport, a new
group or a new wire format changes this object and nothing that plans or runs a view.

Groups:
    "world"   every rank of the job (Communicator.world_exchange): links intra and inter
    "server"  the ranks of this rank's server (Communicator.intra_exchange): link intra
    "none"    this rank alone (`mb`: each GPU builds its whole dependency graph, nothing moves)

`wire_dtype` is a property of the group: the dtype rows of the training forward's halo (and their
gradients) are cast to before they are sent and widened from on arrival (engine/exchange.py).  None:
rows travel as they are, exactly.  Static rows exchanged once (features, degrees, ids) and evaluation
never use it, so evaluation stays exact whatever the wire.

`route` (--halo-route, world group only): "direct" sends each row once per (sending rank, receiving
rank); "per-server" once per receiving server, shared there over `relay` (the server group) by the
ranks that read it (engine/halo_route.py).  `peer_server` / `peer_local` / `me` locate every peer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

GROUP_NAMES = ("server", "world", "none")


@dataclass(frozen=True)
class ExchangeGroup:
    name: str  # "server", "world" or "none" (what a plan records as its layers' group)
    size: int  # number of peers (this rank included): the length of every count vector
    exchange: Callable  # exchange(send, send_counts, recv_counts, phase="halo") -> received rows
    start: Callable  # the same posted without waiting: -> object whose wait() returns the rows
    counts: Callable[[List[int]], List[int]]  # all-to-all of one integer per peer
    links: Tuple[str, ...]  # ledger link classes its bytes are charged to
    wire_dtype: Optional[torch.dtype] = None  # dtype of the training halo on the wire (None: exact)
    route: str = "direct"  # "direct" or "per-server" (world group across servers)
    relay: Optional["ExchangeGroup"] = None  # the server group a per-server route shares rows over
    peer_server: Tuple[int, ...] = ()  # server of each peer (per-server route)
    peer_local: Tuple[int, ...] = ()  # local rank of each peer on its server (per-server route)
    me: int = 0  # this rank's peer number

    @property
    def per_server(self) -> bool:
        """Whether halo rows between servers travel once per receiving server (and there is more than
        one server and a server of more than one rank, where it differs from the direct route)."""
        return (self.route == "per-server" and self.relay is not None and self.relay.size > 1
                and len(set(self.peer_server)) > 1)

    def __post_init__(self):
        if self.name not in GROUP_NAMES:
            raise ValueError(f"exchange group must be one of {GROUP_NAMES}, got {self.name!r}")

    def with_route(self, route: str, relay: "ExchangeGroup", peer_server, peer_local, me: int) -> "ExchangeGroup":
        """The same peers with halo rows between servers on `route` ("direct" or "per-server")."""
        if route not in ("direct", "per-server"):
            raise ValueError(f"halo route must be direct or per-server, got {route!r}")
        return dataclasses.replace(self, route=route, relay=relay, peer_server=tuple(int(s) for s in peer_server),
                                   peer_local=tuple(int(r) for r in peer_local), me=int(me))

    def with_wire(self, wire_dtype: Optional[torch.dtype]) -> "ExchangeGroup":
        """The same peers with halo rows travelling in `wire_dtype` (float32 and None: exact)."""
        return dataclasses.replace(self, wire_dtype=None if wire_dtype in (None, torch.float32) else wire_dtype)

    @property
    def exact(self) -> bool:
        """Whether halo rows arrive bit for bit (no narrowing wire dtype)."""
        return self.wire_dtype is None

    def halo_wire(self, phase: str) -> Optional[torch.dtype]:
        """The wire dtype of an exchange of `phase`: the group's for the training halo, exact otherwise."""
        return self.wire_dtype if phase == "halo" else None


def _nothing(send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], phase: str = "halo"):
    """The "none" group's exchange: no peer, so nothing is received."""
    return send.new_empty((0,) + tuple(send.shape[1:]))


class _Done:
    __slots__ = ("rows",)

    def __init__(self, rows):
        self.rows = rows

    def wait(self):
        return self.rows


def local_group() -> ExchangeGroup:
    """The "none" group of a rank that exchanges with nobody (per-GPU mini-batches)."""
    return ExchangeGroup(name="none", size=1, exchange=_nothing,
                         start=lambda send, sc, rc, phase="halo": _Done(_nothing(send, sc, rc, phase)),
                         counts=lambda counts: [int(c) for c in counts], links=())


def immediate_start(exchange: Callable) -> Callable:
    """A `start` for a blocking exchange function (a test's fake transport): exchanges at once and hands
    back the finished rows, so overlapped code runs unchanged over it."""
    def start(send, send_counts, recv_counts, phase="halo"):
        return _Done(exchange(send, send_counts, recv_counts, phase=phase))
    return start
