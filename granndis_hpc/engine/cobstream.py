"""The co-batch loader's own CUDA stream: the next co-batch's device tensors are made in the loader
thread while the current step computes, and the step waits for them on the device, never on the host.

- `building()`: the loader thread's block in which every tensor of a co-batch is made: on a GPU the
  loader's stream is current, so the copies and the kernels of its set-up (index gathers, aggregation
  matrices) queue there, beside the step's work on the main stream.
- `put(array)`: a host array on the device: copied into page-locked memory (torch's caching host
  allocator, which keeps the block until the copy reading it has completed) and sent with a
  non-blocking copy on the loader's stream, so neither thread waits for it.
- `ready()`: an event recorded on the loader's stream after the co-batch's last copy and kernel.
- `wait(event)`: the main thread makes its current stream wait for that event before the step uses the
  co-batch: an ordering between two streams, no host synchronisation, no device-wide one.
- `retire(item)`: a co-batch the main stream is done with is kept alive until an event recorded on
  the main stream then has completed (checked with `query`, never waited for): its tensors were
  allocated on the loader's stream, whose next allocations may reuse their memory as soon as they
  are freed, while the main stream's queued kernels may still read them.

On the CPU there is nothing to order and the loader makes host tensors directly, unless `emulate=True`
(--host-staging), which runs this same logic with plain copies and stand-in events, so the tests check
on the CPU that every co-batch is made in the loader, waited for before its step and kept until
retired, with the same results.  The GPU branch's streams, events and copies come from
cluster/deviceops.py, where tests install a CUDA double that runs that branch itself on the CPU.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, List, Set, Tuple

import numpy as np
import torch

from ..cluster import deviceops


class HostEvent:
    """The CPU stand-in of a CUDA event (emulation): complete once recorded."""

    def __init__(self):
        self.thread = threading.current_thread().name

    def query(self) -> bool:
        return True


class LoaderStream:
    """The co-batch loader's stream, events and retired co-batches (see the module doc)."""

    def __init__(self, device: torch.device, emulate: bool = False):
        self.device = device
        self._ops = deviceops.current()  # streams and events from the one place tests swap
        self.cuda = self._ops.streams_on(device)
        self.active = self.cuda or bool(emulate)  # False: plain host tensors (the CPU)
        self._stream = self._ops.new_stream(device) if self.cuda else None
        self._retired: List[Tuple[Any, object]] = []  # (event on the main stream, co-batch)
        # Counters for the tests: arrays put, threads that put them, events waited for, co-batches retired.
        self.put_threads: Set[str] = set()  # their names
        self.puts, self.waits, self.retired = 0, 0, 0

    def building(self):
        """The loader thread's context for making one co-batch's tensors."""
        if not self.cuda:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()  # a new thread's current device is GPU 0 until it sets its own
        stack.enter_context(self._ops.use_device(self.device))
        stack.enter_context(self._ops.use_stream(self._stream))
        return stack

    def put(self, array, dtype=None) -> torch.Tensor:
        """A host array as a tensor on the device (non-blocking, from pinned memory, on a GPU)."""
        host = torch.as_tensor(np.ascontiguousarray(array), dtype=dtype)
        if self.active:
            self.puts += 1
            self.put_threads.add(threading.current_thread().name)
        if not self.cuda:
            return host if host.device == self.device else host.to(self.device)
        return self._ops.upload(host, self.device)

    def ready(self):
        """The event marking the co-batch's tensors complete (None when inactive)."""
        if not self.active:
            return None
        return self._stream.record_event() if self.cuda else HostEvent()

    def wait(self, event) -> None:
        """Main thread, before the step uses the co-batch: order its stream after the loader's work."""
        if not self.active:
            return
        if event is None:
            raise RuntimeError("a co-batch reached its step without the loader's ready event")
        self.waits += 1
        if self.cuda:
            self._ops.current_stream(self.device).wait_event(event)

    def retire(self, item) -> None:
        """Main thread: `item` (a co-batch) is no longer used by new work; free it once the main stream's
        work queued so far has run."""
        if not self.active or item is None:
            return
        event = self._ops.current_stream(self.device).record_event() if self.cuda else HostEvent()
        self._retired.append((event, item))
        self.retired += 1
        self.collect()

    def collect(self) -> int:
        """Drop the retired co-batches whose event has completed; returns how many are still held."""
        self._retired = [(e, item) for e, item in self._retired if not e.query()]
        return len(self._retired)
