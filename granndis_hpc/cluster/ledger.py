"""Byte and time ledger per link class and phase.

Conventions (the numbers are meant to be exact and machine-independent):

* **Bytes** are the payload bytes this rank SENT over a link class: rows it ships to another rank
  (element bytes only, no headers, no counts, no padding), each byte counted once, by its sender.
  Rows a rank "sends" to itself are not counted (they never leave the process).  Summing a byte
  counter over all ranks therefore gives the traffic on that link class.
  "intra" = between ranks of the same server, "inter" = between ranks of different servers.
  Collectives are counted with an algorithmic model documented where they are issued
  (`comm.allreduce_bytes_model`): what a bandwidth-optimal algorithm must send, not what a
  particular MPI happens to do for a particular message size.
* **Seconds** are the wall time of the communication call on this rank; waiting for a slower peer is
  part of it, as it is part of the step time.  On a GPU (`timed_events`) they are the current CUDA
  stream's time between events recorded around the call, read when the seconds are read (once per
  epoch), so timing never synchronises the device on the step's path (cluster/hostsync.py).
"""
from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from .hostsync import EventSpans

LINKS = ("intra", "inter")
PHASES = ("halo", "gradient", "evaluation", "setup")


def _index(link: str, phase: str) -> tuple[int, int]:
    try:
        i = LINKS.index(link)
    except ValueError:
        raise ValueError(f"unknown link class {link!r}: use one of {LINKS}") from None
    try:
        j = PHASES.index(phase)
    except ValueError:
        raise ValueError(f"unknown phase {phase!r}: use one of {PHASES}") from None
    return i, j


class Ledger:
    """Counters bytes[link, phase] (int64) and seconds[link, phase] (float64) for one rank."""

    def __init__(self, synchronize: Callable[[], None] | None = None):
        # `synchronize` is called before each timer reading in `timed` (torch.cuda.synchronize on a
        # GPU), so asynchronous kernels are charged to the call that launched them.
        self._synchronize = synchronize
        self._bytes = np.zeros((len(LINKS), len(PHASES)), dtype=np.int64)
        self._seconds = np.zeros((len(LINKS), len(PHASES)), dtype=np.float64)
        self._spans: Optional[EventSpans] = None  # timed_events' spans, added to _seconds when read
        self._span_keys: List[Tuple[int, int]] = []  # (link, phase index) of every event span since reset
        self._span_s: List[float] = []  # their seconds, once read

    def add(self, link: str, phase: str, nbytes: int, seconds: float = 0.0) -> None:
        i, j = _index(link, phase)
        nbytes = int(nbytes)
        if nbytes < 0 or seconds < 0:
            raise ValueError(f"ledger entries must be non-negative, got nbytes={nbytes}, seconds={seconds}")
        self._bytes[i, j] += nbytes
        self._seconds[i, j] += float(seconds)

    @contextlib.contextmanager
    def timed(self, link: str, phase: str):
        """Add the wall time of the `with` body to seconds[link, phase] (bytes are added separately)."""
        _index(link, phase)
        if self._synchronize is not None:
            self._synchronize()
        start = time.perf_counter()
        try:
            yield self
        finally:
            if self._synchronize is not None:
                self._synchronize()
            self.add(link, phase, 0, time.perf_counter() - start)

    @contextlib.contextmanager
    def timed_events(self, link: str, phase: str):
        """`timed` on a GPU: CUDA events on the current stream around the body, no synchronisation;
        the span's seconds are added when the ledger's seconds are next read."""
        key = _index(link, phase)
        from .hostsync import EventSpans, _event
        if self._spans is None:
            self._spans = EventSpans()
        spans = self._spans
        start = _event()
        try:
            yield self
        finally:
            spans.add(key, start, _event())
            self._span_keys.append(key)

    def span_cursor(self) -> int:
        """The number of event spans recorded since reset (a LayerClock mark)."""
        return len(self._span_keys)

    def span_seconds(self, begin: int, end: int, phases=("halo", "setup")) -> float:
        """Seconds of the event spans begin..end-1 (span_cursor marks) in the given phases."""
        self._read_spans()
        cols = {PHASES.index(p) for p in phases}
        return float(sum(s for (_, j), s in zip(self._span_keys[begin:end], self._span_s[begin:end]) if j in cols))

    def _read_spans(self) -> None:
        if self._spans is not None and len(self._spans):
            for key, seconds in self._spans.collect():
                self._seconds[key] += seconds
                self._span_s.append(seconds)

    def bytes(self, link: str, phase: str) -> int:
        return int(self._bytes[_index(link, phase)])

    def seconds(self, link: str, phase: str) -> float:
        self._read_spans()
        return float(self._seconds[_index(link, phase)])

    def total_bytes(self, link: str | None = None, phase: str | None = None) -> int:
        """Sum over the unnamed axes: total_bytes("inter") is all inter-server bytes of every phase."""
        return int(self._select(self._bytes, link, phase).sum())

    def total_seconds(self, link: str | None = None, phase: str | None = None) -> float:
        self._read_spans()
        return float(self._select(self._seconds, link, phase).sum())

    def reset(self) -> None:
        self._bytes[:] = 0
        self._seconds[:] = 0.0
        if self._spans is not None:
            self._spans.collect()  # drop spans of the previous epoch (read or not)
        self._span_keys, self._span_s = [], []

    def snapshot(self) -> dict:
        """{"bytes": {link: {phase: int}}, "seconds": {link: {phase: float}}} of this rank."""
        self._read_spans()
        return _as_dict(self._bytes, self._seconds)

    def reduce(self, comm, op: str = "sum") -> dict:
        """Collective over `comm`: bytes summed over ranks; seconds summed (op="sum") or the
        slowest rank's (op="max").  Returns the snapshot layout, identical on every rank."""
        from mpi4py import MPI  # the ledger itself is usable without MPI (unit tests, reports)

        if op not in ("sum", "max"):
            raise ValueError(f"Ledger.reduce op must be 'sum' or 'max', got {op!r}")
        self._read_spans()
        total_bytes = np.empty_like(self._bytes)
        total_seconds = np.empty_like(self._seconds)
        comm.Allreduce(self._bytes, total_bytes, op=MPI.SUM)
        comm.Allreduce(self._seconds, total_seconds, op=MPI.SUM if op == "sum" else MPI.MAX)
        return _as_dict(total_bytes, total_seconds)

    def gather_bytes(self, comm) -> np.ndarray:
        """Collective over `comm`: every rank's bytes table, int64 [rank, link, phase], on every rank.

        The per-rank tables (not only their sum) say which rank and server is the busiest sender:
        a shaped link is as slow as the egress with the most to send, not as the average one."""
        out = np.empty((comm.Get_size(),) + self._bytes.shape, dtype=np.int64)
        comm.Allgather(self._bytes, out)
        return out

    @staticmethod
    def record_classes(per_rank: np.ndarray) -> dict:
        """The epoch record's byte classes of a [rank, link, phase] table (`gather_bytes`):
        {"intra_halo", "inter_halo", "intra_grad", "inter_grad"} -> int64[rank].

        Set-up traffic inside an epoch is the per-step planning of co-batched training: it is counted
        as halo.  Evaluation traffic is not part of a training epoch."""
        halo, setup, grad = (PHASES.index(p) for p in ("halo", "setup", "gradient"))
        out = {}
        for i, link in enumerate(LINKS):
            out[f"{link}_halo"] = per_rank[:, i, halo] + per_rank[:, i, setup]
            out[f"{link}_grad"] = per_rank[:, i, grad]
        return out

    @staticmethod
    def _select(table: np.ndarray, link: str | None, phase: str | None) -> np.ndarray:
        rows = slice(None) if link is None else _index(link, PHASES[0])[0]
        cols = slice(None) if phase is None else _index(LINKS[0], phase)[1]
        return table[rows, cols]


def _as_dict(bytes_table: np.ndarray, seconds_table: np.ndarray) -> dict:
    return {
        "bytes": {l: {p: int(bytes_table[i, j]) for j, p in enumerate(PHASES)} for i, l in enumerate(LINKS)},
        "seconds": {l: {p: float(seconds_table[i, j]) for j, p in enumerate(PHASES)} for i, l in enumerate(LINKS)},
    }
