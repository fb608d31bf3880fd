"""Host synchronisation on the training step's path: timing that does not synchronise (Stopwatch, event
spans read once per epoch) and a counter of the calls that make the host wait for a GPU (SyncCounter).

On a GPU every call that brings a device value to the host (`.item()`, `float(t)`, `.tolist()`, `.cpu()`,
`.numpy()`, a blocking device-to-host copy) or synchronises the device (`torch.cuda.synchronize`, an
event's or a stream's `synchronize`) stops the host until the queued kernels have run, so the next
kernels, the next exchange's posting and the next step's host work cannot start early.  The step keeps
one: the loss it returns.  Timers record CUDA events on the current stream instead and are read at
the end of the epoch, when the host waits anyway.

`SyncCounter` is the test hook that keeps it so: while it is active it wraps those functions and
records each call made from this package's code (torch's own internals are not counted: e.g. Adam
reads its step counter, a host tensor, with `.item()`).  The same code runs on the CPU, where none of
these calls waits for anything but each still marks a place that would wait on a GPU; `np_view`
(cluster/pending.py) reads host buffers through `host_numpy`, which is not counted: on a GPU it is
only ever given host memory (pinned staging buffers), and a device tensor there raises instead of
synchronising.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TENSOR_NUMPY = torch.Tensor.numpy  # the unwrapped method: SyncCounter does not count host_numpy


def host_numpy(t: torch.Tensor):
    """NumPy view of a tensor in host memory (not counted by SyncCounter; raises on a device tensor)."""
    return _TENSOR_NUMPY(t.detach())


# ----------------------------------------------------------------------------- timing without syncs
def _event() -> "torch.cuda.Event":
    event = torch.cuda.Event(enable_timing=True)
    event.record()  # on the current stream: after the work queued so far
    return event


class EventSpans:
    """Time spans recorded as CUDA event pairs on the current stream, read (one wait) when asked.

    A span is the stream time between its two events: the kernels queued inside it plus any wait the
    stream was made to do (an NCCL exchange, a staging copy).  Host time spent while the stream was busy
    with earlier work is not in it: that time was hidden."""

    def __init__(self):
        self._open: List[Tuple[object, "torch.cuda.Event", "torch.cuda.Event"]] = []

    def add(self, key, start: "torch.cuda.Event", end: "torch.cuda.Event") -> None:
        self._open.append((key, start, end))

    def __len__(self) -> int:
        return len(self._open)

    def collect(self) -> List[Tuple[object, float]]:
        """[(key, seconds)] of every span added since the last collect, in order (waits for the last event)."""
        spans, self._open = self._open, []
        if not spans:
            return []
        spans[-1][2].synchronize()  # every earlier event completed before the last one on the stream
        return [(key, start.elapsed_time(end) / 1e3) for key, start, end in spans]


class Stopwatch:
    """Seconds of repeated spans: host wall time on the CPU; CUDA event pairs on a GPU, read by collect()."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._spans = EventSpans() if self.cuda else None
        self._start = None

    def start(self) -> None:
        self._start = _event() if self.cuda else time.perf_counter()

    def stop(self) -> float:
        """The span's seconds on the CPU; 0.0 on a GPU, where collect() reports it later."""
        start, self._start = self._start, None
        if self.cuda:
            self._spans.add(None, start, _event())
            return 0.0
        return time.perf_counter() - start

    def collect(self) -> float:
        """The seconds of the GPU spans stopped since the last collect (0.0 on the CPU)."""
        return sum(s for _, s in self._spans.collect()) if self.cuda else 0.0


# ----------------------------------------------------------------------------- the test hook
def _is_device(obj) -> bool:
    if isinstance(obj, torch.device):
        return True
    try:
        return isinstance(obj, str) and torch.device(obj) is not None
    except RuntimeError:  # not a device name
        return False


def _crosses_blocking(t: torch.Tensor, args, kwargs) -> bool:
    """Tensor.to(...) / copy_ between devices without non_blocking=True (a copy the host waits for)."""
    if kwargs.get("non_blocking", False) or any(a is True for a in args):
        return False
    target = kwargs.get("device")
    for a in args:
        if isinstance(a, torch.Tensor):
            target = a.device
        elif _is_device(a):
            target = torch.device(a)
    return target is not None and torch.device(target).type != t.device.type


class SyncCounter:
    """While active (`with SyncCounter() as c:`), records every call of this package's code on the
    entering thread that makes the host wait for a GPU (see the module's doc): c.calls is
    [(name, "file:line")].  Not thread-safe
    against other code patching the same functions; meant for tests and the device check.

    With `ops=True` it also records the operators that synchronise inside torch's C++ code
    (cluster/syncops.py: `nonzero`, a boolean mask index, `unique`, an index made from a list or NumPy
    array, a value read as a number, ...) as ("aten.<op>", "file:line"), and counts in every thread that
    carries the step's thread-local state -- the entering thread and the threads autograd runs its
    backward in -- instead of the entering thread only.  A Python-level call is recorded once (by its
    name), not again as the operator it dispatches; indexing a tensor with a list or a NumPy array is
    recorded as `aten.lift_fresh` (the index's copy to the device)."""

    TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, package: str = _PACKAGE, ops: bool = False):
        self.package = package
        self.calls: List[Tuple[str, str]] = []
        self._saved: List[Tuple[object, str, Callable]] = []
        self._mode = None
        self._inside = threading.local()  # depth of counted calls running on this thread
        if ops:
            from granndis_hpc.cluster.syncops import SyncingOps
            self._mode = SyncingOps(package, os.path.dirname(package), self._add,
                                    lambda: getattr(self._inside, "depth", 0) > 0)

    def _add(self, name: str, where: str) -> None:
        self.calls.append((name, where))

    def _in_step(self) -> bool:
        if self._mode is None:
            # Only the thread that entered: helper threads (the MPI progress thread waiting for a staging
            # copy before it posts the sends) wait instead of the step, which computes on meanwhile.
            return threading.get_ident() == self._thread
        return any(m is self._mode for m in _get_current_dispatch_mode_stack())

    def _caller(self) -> Optional[str]:
        if not self._in_step():
            return None
        frame = sys._getframe(2)
        path = frame.f_code.co_filename
        if not os.path.abspath(path).startswith(self.package + os.sep):
            return None
        return f"{os.path.relpath(path, os.path.dirname(self.package))}:{frame.f_lineno}"

    def _wrap(self, owner, name: str, when: Optional[Callable] = None) -> None:
        original = getattr(owner, name)
        counter = self

        def counted(*args, **kwargs):
            where = counter._caller()
            if where is not None and (when is None or when(*args, **kwargs)):
                counter.calls.append((name, where))
            inside = counter._inside
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth -= 1

        self._saved.append((owner, name, original))
        setattr(owner, name, counted)

    def __enter__(self) -> "SyncCounter":
        self._thread = threading.get_ident()
        for name in self.TENSOR_METHODS:
            self._wrap(torch.Tensor, name)
        self._wrap(torch.Tensor, "to", lambda t, *a, **k: _crosses_blocking(t, a, k))
        self._wrap(torch.Tensor, "copy_", lambda t, src, *a, **k: src.device.type != t.device.type and
                   not (k.get("non_blocking", False) or (a and a[0] is True)))
        self._wrap(torch.cuda, "synchronize")
        self._wrap(torch.cuda.Event, "synchronize")
        self._wrap(torch.cuda.Stream, "synchronize")
        if self._mode is not None:
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def backward_ops(self) -> int:
        """With ops=True: how many operators ran inside a backward node while active (any, syncing or not)."""
        return 0 if self._mode is None else self._mode.backward_ops
