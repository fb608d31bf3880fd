"""The CUDA streams, events and asynchronous copies of the code that orders work between streams, from
one place.

Three parts of the package decide an order on a GPU with streams and events, and nothing else: the
host staging of MPI messages (cluster/staging.py: copies on a side stream, the sends of
cluster/pending.py and cluster/allreduce.py deferred until a copy's event has completed), and the
co-batch loader's stream (engine/cobstream.py).  They take every stream, event and non-blocking copy
from `current()`, and decide whether a device takes that path with `current().streams_on(device)`.

On a GPU `current()` is `CudaOps`, which is torch.cuda itself and nothing more.  A test installs a
double with `using(ops)`: an object with the same methods whose streams and events follow CUDA's
ordering rules on the CPU (tests/cuda_double.py), so the GPU-only branches of those three run, and are
checked, in the CPU test suite.
"""
from __future__ import annotations

import contextlib

import torch


class CudaOps:
    """torch.cuda's streams, events and copies (the production implementation)."""

    name = "cuda"

    def streams_on(self, device: torch.device) -> bool:
        """Whether work on `device` is ordered by streams and events (else it runs in host order)."""
        return device.type == "cuda"

    def new_stream(self, device: torch.device):
        return torch.cuda.Stream(device)

    def current_stream(self, device: torch.device):
        return torch.cuda.current_stream(device)

    def use_stream(self, stream):
        """Context: `stream` is the calling thread's current stream."""
        return torch.cuda.stream(stream)

    def use_device(self, device: torch.device):
        """Context: `device` is the calling thread's current device (a new thread's is GPU 0)."""
        return torch.cuda.device(device)

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        """The allocator keeps `tensor`'s memory until the work queued on `stream` so far has run."""
        tensor.record_stream(stream)

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """dst <- src queued on the current stream (between device and pinned host memory: no host wait)."""
        return dst.copy_(src, non_blocking=True)

    def upload(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A host tensor on `device`, copied on the current stream from page-locked memory (torch's caching
        host allocator keeps that block until the copy has read it)."""
        return host.pin_memory().to(device, non_blocking=True)


_CURRENT = CudaOps()


def current():
    """The streams, events and copies in use (CudaOps unless a test installed a double)."""
    return _CURRENT


@contextlib.contextmanager
def using(ops):
    """Within the block, `current()` is `ops` (for the whole process: the objects made inside keep it)."""
    global _CURRENT
    saved, _CURRENT = _CURRENT, ops
    try:
        yield ops
    finally:
        _CURRENT = saved
