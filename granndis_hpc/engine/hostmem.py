"""Host memory that CPU epochs reuse instead of handing it back to the system (glibc's malloc).

A CPU epoch allocates and frees the same tensors of a few to tens of MB every epoch.  glibc serves a
block above its mmap threshold (raised on the fly, at most 32 MiB) with fresh pages and returns the top
of its heap above M_TRIM_THRESHOLD to the system, so every epoch faulted in and zeroed its activations
again: measured on one rank of a 20 k-vertex graph (3-layer SAGE), 10-20 k page faults per epoch and
epochs of 0.14-0.40 s, against 0-6 k faults and 0.12-0.13 s with freed memory kept
(docs/performance/single-rank.md).  Keeping it makes the next epoch reuse the same pages; the process
holds at most what its largest epoch held at once.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_BYTES = 1 << 30  # blocks up to 1 GiB come from (and go back to) the heap, which is never trimmed
FALLBACK_MMAP_BYTES = 32 << 20  # the largest threshold older glibc accepts


def keep_freed_host_memory() -> bool:
    """Tell glibc to keep freed memory for reuse; False where the C library has no mallopt (not Linux,
    musl) or refuses the values: malloc then keeps its defaults, which are correct, only slower."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already uses
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not mallopt(M_TRIM_THRESHOLD, KEEP_BYTES):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) or mallopt(M_MMAP_THRESHOLD, FALLBACK_MMAP_BYTES))
