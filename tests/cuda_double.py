"""A test double of a CUDA device for granndis_hpc/cluster/deviceops.py: streams, events and non-blocking
copies on the CPU that follow CUDA's ordering rules, so the code that orders work between streams (host
staging, the deferred sends of halos and gradient buckets, the co-batch loader's stream) runs its GPU
branch in the CPU test suite.

    device = CudaDouble(delay=0.002)
    with device.installed():          # deviceops.current() is the double; this thread checks its reads
        trainer = make_trainer(...)   # (HostStaging and LoaderStream take their streams from it)
        trainer.train_epoch()
    device.counts                     # copies, events recorded, waits, record_stream calls, ...

The model, and how it differs from a GPU:

- The host stream (the device's default stream, current in every thread until a stream is entered)
  is the host itself: what is queued on it has run when the call returns, so its events are complete
  once recorded and making it wait for an event blocks the host until that event completes.
- Every other stream is a worker thread that runs what is queued on it in order: copies, event records
  and waits for other streams' events.  An event is complete only when its stream has run everything
  queued before it; an event never recorded is complete (CUDA's rule).
- A copy on a worker stream first overwrites its destination with a poison (NaN for floats, all bits
  set for integers: NaN again when bytes are read as floats), sleeps `delay` seconds, then reads its
  source and writes the destination.  So reading the destination before the copy's event has been
  waited for gives poison or stale rows, and changing the source before then changes what is copied:
  a missing wait gives wrong results, not right ones by luck of timing.
- Torch operations run on the host.  While a thread has a worker stream entered (the co-batch loader),
  an operation that touches a tensor a copy queued on that stream is still writing first waits for it:
  stream order, as kernels on that stream would have.  In a thread where the double checks reads
  (`installed()`'s thread, and every thread while it has a worker stream entered), an operation that
  touches a tensor a copy on *another* stream is still writing raises DoubleRaceError: a missing
  wait_event is an error at the operation that needs it, whatever the timing.
- Not modelled: kernels that run after the host has moved on (the host stream is synchronous, so a
  missing host synchronisation before the host reads device data is not detected; SyncCounter counts
  those), the caching allocator (record_stream is counted, it changes no memory), timing events'
  elapsed time, NCCL.
"""
from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from granndis_hpc.cluster import deviceops


class DoubleRaceError(AssertionError):
    """An operation touched a tensor that a copy on another stream was still writing (no wait before it)."""


class DoubleEvent:
    """A CUDA event of the double: complete once its stream has run what was queued before it."""

    def __init__(self, device: "CudaDouble"):
        self._device = device
        self._done = threading.Event()
        self._done.set()  # never recorded: complete
        self.stream = None

    def record(self, stream=None) -> None:
        (stream or self._device.current_stream(None)).record_event(self)

    def query(self) -> bool:
        done = self._done.is_set()
        self._device.count("query" if done else "query_pending")
        return done

    def synchronize(self) -> None:
        self._device.count("event_synchronize")
        self._device.block_on(self)

    def wait(self, stream=None) -> None:
        (stream or self._device.current_stream(None)).wait_event(self)


class DoubleStream:
    """A stream of the double: the host itself (`host=True`), or a worker thread running its queue in order."""

    def __init__(self, device: "CudaDouble", name: str, host: bool = False):
        self._device, self.name, self.host = device, name, host
        self._queue: queue.Queue = queue.Queue()
        self._queued = 0  # submitted and not yet run
        self._count_lock = threading.Lock()
        if not host:
            self._thread = threading.Thread(target=self._run, name=f"cuda-double-{name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except BaseException as exc:  # reported by the next host wait and by close()
                self._device.errors.append(exc)
            finally:
                with self._count_lock:
                    self._queued -= 1

    def submit(self, work) -> None:
        if self.host:
            work()
        else:
            with self._count_lock:
                self._queued += 1
            self._queue.put(work)

    def stop(self) -> None:
        if not self.host:
            self._queue.put(None)
            self._thread.join(timeout=self._device.timeout)

    def record_event(self, event: DoubleEvent | None = None) -> DoubleEvent:
        event = event or DoubleEvent(self._device)
        self._device.count("record_host" if self.host else "record_side")
        event._done.clear()
        event.stream = self
        self.submit(event._done.set)
        return event

    def wait_event(self, event: DoubleEvent) -> None:
        self._device.count("host_wait_event" if self.host else "side_wait_event")
        if self.host:
            self._device.block_on(event)
        else:
            self.submit(lambda: self._device.block_on(event))

    def wait_stream(self, other: "DoubleStream") -> None:
        self.wait_event(other.record_event())

    def query(self) -> bool:
        """True when everything queued on the stream has run."""
        with self._count_lock:
            return self._queued == 0

    def synchronize(self) -> None:
        self._device.count("stream_synchronize")
        self._device.block_on(self.record_event())


class _Copy:
    """One copy queued on a worker stream; `done` once it has written its destination."""

    __slots__ = ("stream", "done")

    def __init__(self, stream):
        self.stream, self.done = stream, threading.Event()


def _poison(t: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-1 if t.dtype.is_signed else torch.iinfo(t.dtype).max)


def _storage_key(t) -> int | None:
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type != "cpu" or t.numel() == 0:
        return None  # (empty tensors may share the null pointer)
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


# Operations that take only the shape of their tensor argument, not its values.
_NO_DATA = {"empty_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "zeros_like",
            "ones_like", "full_like", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}


class _StreamOrder(TorchDispatchMode):
    """The thread's torch operations against the copies still in flight (see the module doc)."""

    def __init__(self, device: "CudaDouble"):
        super().__init__()
        self._device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._device.order(func, list(args) + list(kwargs.values()))
        return func(*args, **kwargs)


class CudaDouble:
    """The double of one CUDA device (see the module doc); `delay`: seconds before each copy writes."""

    def __init__(self, delay: float = 0.002, timeout: float = 60.0):
        self.delay, self.timeout = float(delay), float(timeout)
        self.counts: collections.Counter = collections.Counter()
        self.errors: list = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._host = DoubleStream(self, "host", host=True)
        self._streams: list = []
        self._in_flight: dict = {}  # storage data_ptr -> [_Copy]

    # ---- the deviceops interface -------------------------------------------------------------
    name = "cuda-double"

    def streams_on(self, device: torch.device) -> bool:
        return True

    def new_stream(self, device) -> DoubleStream:
        stream = DoubleStream(self, f"stream{len(self._streams) + 1}")
        self._streams.append(stream)
        self.count("streams")
        return stream

    def current_stream(self, device) -> DoubleStream:
        return getattr(self._local, "stream", None) or self._host

    @contextlib.contextmanager
    def use_stream(self, stream: DoubleStream):
        saved = getattr(self._local, "stream", None)
        self._local.stream = stream
        self.count("use_stream")
        try:
            if stream.host or getattr(self._local, "checking", False):
                yield
            else:
                with self._checking():
                    yield
        finally:
            self._local.stream = saved

    def use_device(self, device):
        self.count("use_device")
        return contextlib.nullcontext()

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        self.count("record_stream")

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        stream = self.current_stream(None)
        if stream.host:
            self.count("host_copies")
            return dst.copy_(src)
        self.count("copies")
        copy = _Copy(stream)
        key = _storage_key(dst)
        if key is not None:
            with self._lock:
                self._in_flight.setdefault(key, []).append(copy)

        def run():
            try:
                _poison(dst)
                time.sleep(self.delay)
                dst.copy_(src)
            finally:
                copy.done.set()
                with self._lock:
                    held = self._in_flight.get(key, [])
                    if copy in held:
                        held.remove(copy)
                    if not held:
                        self._in_flight.pop(key, None)
        stream.submit(run)
        return dst

    def upload(self, host: torch.Tensor, device) -> torch.Tensor:
        self.count("uploads")
        return self.copy_(torch.empty_like(host), host)

    # ---- for the tests -----------------------------------------------------------------------
    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def block_on(self, event: DoubleEvent) -> None:
        if not event._done.wait(self.timeout):
            raise DoubleRaceError(f"waited {self.timeout:.0f} s for an event on {event.stream.name}: its stream "
                                  "never reached it")
        self.raise_errors()

    def raise_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def order(self, func, args) -> None:
        """Before an operation of a checking thread: wait for the copies of its current stream that write
        a tensor it touches; raise for those of another stream."""
        if not self._in_flight or func.is_view or func.__name__.split(".")[0] in _NO_DATA:
            return  # a view, or a new tensor of the same shape: the rows are not read
        current = self.current_stream(None)
        for arg in args:
            for t in (arg if isinstance(arg, (list, tuple)) else (arg,)):
                key = _storage_key(t)
                if key is None:
                    continue
                with self._lock:
                    pending = [c for c in self._in_flight.get(key, ()) if not c.done.is_set()]
                for copy in pending:
                    if copy.stream is current:
                        self.count("stream_ordered")
                        copy.done.wait(self.timeout)
                    else:
                        raise DoubleRaceError(
                            f"{func} on stream {current.name} touches a tensor that a copy on {copy.stream.name} "
                            "is still writing: the stream must wait for that copy's event first")

    @contextlib.contextmanager
    def _checking(self):
        self._local.checking = True
        try:
            with _StreamOrder(self):
                yield
        finally:
            self._local.checking = False

    @contextlib.contextmanager
    def installed(self, check: bool = True):
        """deviceops.current() is this double within the block; check=True: the calling thread's
        operations are checked against the copies in flight.  The worker streams stop at the end."""
        try:
            with deviceops.using(self):
                if check:
                    with self._checking():
                        yield self
                else:
                    yield self
            self.raise_errors()
        finally:
            for stream in self._streams:
                stream.stop()
