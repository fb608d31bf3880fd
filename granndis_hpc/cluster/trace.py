"""An optional event trace of the halo exchanges (to see where an overlapped epoch's time goes), off by default.

GRANNDIS_EXCHANGE_TRACE=1 in every rank's environment (emucluster/ forwards GRANNDIS_* to the ranks):
each rank records, per exchange and direction, when it was posted, when the caller started waiting and
when the wait returned, when the progress thread saw its MPI requests complete, and the blocking
exchanges' start and end; the trainer marks each step's start, backward and end; on 2 servers each leader
marks every gradient bucket's pairwise exchange (grad_leaders_post, _wait_start, _wait_end; the id is the
bucket's element count: cluster/allreduce.py).  With --out, each rank
writes its events to RUN_DIR/exchange-trace-rank<R>.json when the run ends (engine/trainer.py).  Times
are time.perf_counter() seconds of the rank's own clock (ranks of one machine share it).  Off, every hook
is one check of a module global (`EVENTS is None`).
"""
from __future__ import annotations

import json
import os
import time
from typing import List, Optional, Tuple

ENV = "GRANNDIS_EXCHANGE_TRACE"
# [(event, seconds, exchange id)] while tracing, else None.
EVENTS: Optional[List[Tuple[str, float, int]]] = [] if os.environ.get(ENV, "") not in ("", "0") else None
_next_id = [0]


def new_id() -> int:
    """A number for one exchange (its forward and backward events share it); -1 when not tracing."""
    if EVENTS is None:
        return -1
    _next_id[0] += 1
    return _next_id[0]


def mark(event: str, ident: int = -1) -> None:
    if EVENTS is not None:
        EVENTS.append((event, time.perf_counter(), ident))


def dump(path: str) -> None:
    """Write the events as JSON ({"events": [[event, seconds, id], ...]}) and start a new trace."""
    if EVENTS is None:
        return
    with open(path, "w") as f:
        json.dump({"events": EVENTS}, f)
    del EVENTS[:]
