"""Host staging of device rows for MPI: reused pinned buffers, and copies on a side stream ordered by
CUDA events, so that staging never synchronises the device.

MPI moves host memory (the inter-server blocks always; the intra-server blocks and gradient buckets
with the MPI transport), so on a GPU each such message is copied device -> host before it is posted and
host -> device after it arrives.  A pageable copy (`t.cpu()`, `t.to(device)` of pageable memory) blocks
the host until every kernel queued before it has run; here instead:

- `to_host(src)`: the copy is queued on a side stream after an event recorded on the current stream
  (it starts when the rows are computed, not before) into a pinned buffer of the pool; it returns the
  host rows and the event that marks them complete.  The MPI send is posted once that event has
  completed: by the progress thread, or by the caller when it waits (cluster/pending.MPIProgress), so
  the host computes on while the copy runs.  `src` is recorded on the side stream, so the allocator
  does not reuse its memory before the copy has read it.
- `to_device(host, into)`: the received rows are copied on the side stream into a device tensor made
  on the current stream, which then waits for the copy's event: the host does not wait at all.
- Buffers return to the pool when the exchange is done with them (`release`, with the event of the
  copy still reading them, if any); a buffer is lent again only once that event has completed, so a
  copy in flight is never overwritten.  Buffers are sized in powers of two and reused across layers,
  steps and epochs: the pool holds about the largest exchange in flight at once.

On the CPU there is nothing to stage (MPI reads the tensors' own memory) and the callers skip this
module, unless `emulate=True` (the --host-staging option), which runs the same staging logic with
plain host buffers and synchronous copies: tests exercise the GPU code's buffer handling and order on
the CPU, with the same results.  The streams, events and copies of the GPU branch come from
cluster/deviceops.py, where tests install a CUDA double that runs that branch itself on the CPU.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch

from . import deviceops

MIN_BUFFER_BYTES = 1 << 12


def wait_event(event) -> None:
    """Wait for a staging event (None: nothing to wait for); no wait when it has completed."""
    if event is not None and not event.query():
        event.synchronize()


class Lease:
    """A pool buffer lent to one exchange: `rows` is the typed view of it the exchange uses."""

    __slots__ = ("buffer", "rows")

    def __init__(self, buffer: torch.Tensor, rows: torch.Tensor):
        self.buffer, self.rows = buffer, rows


class PinnedPool:
    """Host buffers lent and returned; pinned on a GPU (page-locked: the copies run asynchronously)."""

    def __init__(self, pin: bool):
        self.pin = pin
        self._free: List[Tuple[torch.Tensor, Any]] = []  # (buffer, event still reading it or None)
        self.allocated_bytes = 0  # every buffer made (reused ones once): the pool's host memory
        self.lent = 0             # buffers currently lent

    def acquire(self, shape, dtype: torch.dtype = torch.uint8) -> Lease:
        shape = tuple(int(n) for n in shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        best = None
        for i, (buf, event) in enumerate(self._free):
            if buf.numel() >= nbytes and (event is None or event.query()):
                if best is None or buf.numel() < self._free[best][0].numel():
                    best = i
        if best is None:
            size = max(MIN_BUFFER_BYTES, 1 << max(nbytes - 1, 0).bit_length())
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
            self.allocated_bytes += size
        else:
            buf, _ = self._free.pop(best)
        self.lent += 1
        return Lease(buf, buf[:nbytes].view(dtype).view(shape))

    def release(self, lease: Optional[Lease], event=None) -> None:
        """Return a buffer; `event`: the copy still reading it (it is lent again once that completed)."""
        if lease is None:
            return
        self.lent -= 1
        self._free.append((lease.buffer, event))


class HostStaging:
    """The staging of one Communicator: its pool and, on a GPU, its side stream (see the module doc)."""

    def __init__(self, device: torch.device, emulate: bool = False):
        # Streams, events and copies from the one place a test can swap (cluster/deviceops.py).
        self._ops = deviceops.current()
        self.cuda = self._ops.streams_on(device)
        self.copies = self.cuda or bool(emulate)  # False: MPI reads the tensors themselves
        self.device = device
        self.pool = PinnedPool(pin=device.type == "cuda")
        self._stream: Any = self._ops.new_stream(device) if self.cuda else None
        # The side stream's last event: every copy queued so far completes no later (one stream, in
        # order), so a buffer released with it is never overwritten while a copy reads or writes it.
        self._last = None

    def to_host(self, src: torch.Tensor) -> Tuple[Lease, torch.Tensor, object]:
        """A device tensor -> (lease, its host copy, the event of the copy's completion or None).
        The caller must not read the host copy (or post it to MPI) before the event has completed."""
        lease = self.pool.acquire(src.shape, src.dtype)
        if not self.cuda:
            lease.rows.copy_(src)
            return lease, lease.rows, None
        ops = self._ops
        produced = ops.current_stream(self.device).record_event()
        with ops.use_stream(self._stream):
            self._stream.wait_event(produced)
            ops.copy_(lease.rows, src)
            self._last = self._stream.record_event()
        ops.record_stream(src, self._stream)
        return lease, lease.rows, self._last

    def to_device(self, host: torch.Tensor, into: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Host rows -> device (a new tensor, or `into`), ordered before the current stream's next work;
        the host does not wait."""
        if not self.cuda:
            return host.clone() if into is None else into.copy_(host)
        ops = self._ops
        current = ops.current_stream(self.device)
        out = torch.empty(host.shape, dtype=host.dtype, device=self.device) if into is None else into
        after = current.record_event()  # `into` may be read or written by queued kernels
        with ops.use_stream(self._stream):
            self._stream.wait_event(after)
            ops.copy_(out, host)
            self._last = self._stream.record_event()
        current.wait_event(self._last)
        ops.record_stream(out, self._stream)
        return out

    def release(self, *leases: Optional[Lease]) -> None:
        """Return buffers to the pool once every copy queued so far has completed."""
        for lease in leases:
            self.pool.release(lease, self._last)
