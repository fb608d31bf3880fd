"""Communication in flight: a posted exchange (PendingExchange), the completion of MPI requests with an
optional progress thread (MPIProgress), the ledger timer that synchronises CUDA (TimedSync), and
the byte views exchanges move rows as.
Used by cluster/comm.py and cluster/allreduce.py."""
from __future__ import annotations

import os
import threading

import numpy as np
import torch
from mpi4py import MPI

from . import trace
from .errors import collective_errors
from .hostsync import host_numpy
from .ledger import Ledger
from .staging import wait_event


class PendingExchange:
    """An exchange in flight.  wait() completes it (once) and returns the received rows; every rank that
    posted must wait, in the order it posted (collectives of one group complete in order)."""

    __slots__ = ("_finish", "_rows")

    def __init__(self, finish):
        self._finish, self._rows = finish, None

    @classmethod
    def done(cls, rows: torch.Tensor) -> "PendingExchange":
        pending = cls(None)
        pending._rows = rows
        return pending

    def wait(self) -> torch.Tensor:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            self._rows = finish()
        return self._rows


# Seconds before the progress thread's second MPI_Testall: short against a message's transfer time
# (0.1 s for 1 MB at 100 Mbit/s), so the protocol's first rounds (rendezvous) are answered at once.
PROGRESS_POLL_S = 0.001
# Back-off: each later sleep is PROGRESS_BACKOFF times the last, up to PROGRESS_POLL_MAX_S (1.0: a fixed
# interval).  A fixed 1 ms poller cost 5 % of the compute beside it and 12 % CPU on 4 ranks over 2 cores
# (measured beside a fixed compute loop), and fb's overlapped epochs on 2 x 2 took 0.90x (100 Mbit/s) and 1.13x
# (unshaped)
# of --no-overlap against 0.70x and 0.80x with a back-off to 16 ms (docs/performance/overlap.md).  Capped
# at 4 ms: at 100 Mbit/s a peer's progress thread asleep for up to 16 ms stalled the transfer
# (fb's overlapped epoch on the 200k graph 1.38-1.41 s with the 4 ms cap against 1.54-1.64 s with 16 ms
# in alternating passes, the 20k graph 1.62 against 1.81 s), and the 4 ms cap's polling costs the
# compute nothing measurable (0.801 s against 0.794 s without a thread).
PROGRESS_BACKOFF = 2.0
PROGRESS_POLL_MAX_S = 0.004


def _poll_from_env(text: str):
    """GRANNDIS_PROGRESS_POLL="FIRST_S[,FACTOR,MAX_S]" (a benchmark knob: emucluster/ runs forward
    GRANNDIS_* to every rank)."""
    try:
        parts = [float(v) for v in text.split(",")]
        if len(parts) == 1:
            parts += [1.0, parts[0]]
        first, factor, longest = parts
        if not (0 < first <= longest and factor >= 1.0):
            raise ValueError
    except ValueError:
        raise ValueError(f"GRANNDIS_PROGRESS_POLL={text!r}: give FIRST_S or FIRST_S,FACTOR,MAX_S with "
                         "0 < FIRST_S <= MAX_S and FACTOR >= 1") from None
    return first, factor, longest


# Read at import; a bad value is kept and raised by check_poll_setting(), which every rank's Communicator
# calls together: raised here it would be an import error, a traceback on every rank and an abort.
_POLL_ERROR = ""
if os.environ.get("GRANNDIS_PROGRESS_POLL"):
    try:
        PROGRESS_POLL_S, PROGRESS_BACKOFF, PROGRESS_POLL_MAX_S = _poll_from_env(os.environ["GRANNDIS_PROGRESS_POLL"])
    except ValueError as exc:
        _POLL_ERROR = str(exc)


def check_poll_setting(comm) -> None:
    """Collective over `comm`: the same one-line error on every rank when GRANNDIS_PROGRESS_POLL, read at
    import, holds a bad value (the defaults are used meanwhile)."""
    with collective_errors(comm, "", catch=(ValueError,)):
        if _POLL_ERROR:
            raise ValueError(_POLL_ERROR)


class MPIProgress:
    """Completion of MPI requests, optionally driven by a helper thread while the caller computes
    (MPI_Testall after sleeps of PROGRESS_POLL_S, growing by PROGRESS_BACKOFF up to PROGRESS_POLL_MAX_S).

    Open MPI progresses non-blocking point-to-point and collectives only inside MPI calls (no
    asynchronous progress on TCP), so without the thread the messages would wait for wait().  The
    thread polls (MPI_Testall, then a short sleep) only until the caller needs the result: wait() stops
    it and completes the requests with MPI_Waitall on the calling thread, which reacts to every message
    at once -- a sleeping poller would add a wake-up per protocol round (measured on the oversubscribed
    2-core machine: the gradient all-reduce's rounds took 0.5 s longer when a poller completed them).
    The thread needs MPI_THREAD_MULTIPLE (mpi4py's default); with a lower thread level it is not started
    and the requests complete in wait() as before.  Only one thread touches the requests at a time."""

    def __init__(self, requests, progress: bool, deferred=None):
        self._requests = list(requests)
        # deferred: (event, post) -- sends of rows still being staged to the host (cluster/staging.py):
        # post() -> requests runs once the copy's event has completed, in the thread when there is one
        # (the caller computes on), else now.
        self._deferred = deferred
        # polls: MPI_Testall calls that found work left.  _stop is an Event, not a flag: the poller sleeps
        # on it, so wait() wakes it at once instead of joining after the rest of its sleep (up to
        # PROGRESS_POLL_MAX_S on the caller's critical path, twice per world exchange: its inter and
        # intra pollers are joined one after the other).
        self._thread, self._stop, self.polls = None, threading.Event(), 0
        if progress and (self._requests or deferred) and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self._thread = threading.Thread(target=self._poll, name="granndis-mpi-progress", daemon=True)
            self._thread.start()
        else:
            self._post_deferred(block=False)

    def _post_deferred(self, block: bool = True) -> bool:
        """Post the deferred sends (block=False: only if their copy has completed); True once posted."""
        if self._deferred is None:
            return True
        event, post = self._deferred
        if not block and event is not None and not event.query():
            return False
        self._deferred = None
        wait_event(event)
        self._requests += post()
        return True

    def _poll(self) -> None:
        self._post_deferred()
        interval = PROGRESS_POLL_S
        while not self._stop.is_set() and not MPI.Request.Testall(self._requests):
            self.polls += 1
            if self._stop.wait(interval):
                return
            interval = min(interval * PROGRESS_BACKOFF, PROGRESS_POLL_MAX_S)
        if not self._stop.is_set():
            trace.mark("polled_done")  # the thread saw every request complete (GRANNDIS_EXCHANGE_TRACE)

    def test(self) -> bool:
        """True when every request has completed (MPI_Testall; only while no thread polls them)."""
        if self._thread is not None:
            if self._thread.is_alive():
                return False
            self._thread.join()
            self._thread = None
        if not self._post_deferred(block=False):  # (done by the thread when there was one)
            return False
        return bool(MPI.Request.Testall(self._requests))

    def wait(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._post_deferred()
        MPI.Request.Waitall(self._requests)  # completed requests are MPI_REQUEST_NULL: returns at once


class TimedSync:
    """ledger.timed on the CPU; on a GPU the ledger's CUDA event spans (ledger.timed_events), which never
    synchronise the device: a call's seconds are the current stream's time across it, read at the
    epoch's end (cluster/hostsync.py)."""

    def __init__(self, ledger: Ledger, link: str, phase: str, cuda: bool):
        self._inner = ledger.timed_events(link, phase) if cuda else ledger.timed(link, phase)

    def __enter__(self):
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


def byte_rows(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """A [rows, row_bytes] uint8 view of a tensor's rows (contiguous copy if needed)."""
    rows = t.shape[0]
    if rows == 0:  # empty tensors may carry zero strides that dtype views reject
        return torch.empty((0, row_bytes), dtype=torch.uint8, device=t.device)
    flat = t.contiguous().view(rows, row_bytes // t.element_size())
    return flat if t.dtype == torch.uint8 else flat.view(torch.uint8)


def typed_rows(byte_rows: torch.Tensor, dtype: torch.dtype, rest: tuple) -> torch.Tensor:
    """Inverse of byte_rows: [rows, row_bytes] uint8 -> [rows, *rest] of dtype (a view)."""
    typed = byte_rows if dtype == torch.uint8 else byte_rows.view(dtype)
    return typed.reshape(byte_rows.shape[0], *rest)


def np_view(t: torch.Tensor) -> np.ndarray:
    """NumPy view of a CPU tensor's memory (uint8 or a reducible dtype); on a GPU only ever given host
    staging buffers, so it is no host synchronisation (hostsync.SyncCounter does not count it)."""
    return host_numpy(t)
