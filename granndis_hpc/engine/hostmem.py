"""Host memory that CPU epochs reuse instead of handing it back to the system (glibc's malloc).

A CPU epoch allocates and frees the same tensors of a few to tens of MB every epoch.  glibc serves a
block above its mmap threshold with fresh pages (mmap) and returns the top of its heap above
M_TRIM_THRESHOLD to the system, so every epoch faulted in and zeroed its activations
again: measured on one rank of a 20 k-vertex graph (3-layer SAGE), 10-20 k page faults per epoch and
epochs of 0.14-0.40 s, against 0-6 k faults and 0.12-0.13 s with freed memory kept
(docs/performance/single-rank.md).  Keeping it makes the next epoch reuse the same pages; the process
keeps at most 1 GiB of freed heap beyond what its largest epoch held at once.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
TRIM_BYTES = 1 << 30  # free memory at the heap's top is handed back only beyond 1 GiB
# No block of its own pages (mmap) after set-up: every block comes from the heap and is reused.  Raising
# M_MMAP_THRESHOLD instead is not enough: glibc 2.36 accepts 32 MiB and still gave a 24 MiB tensor
# fresh pages on every allocation (measured), and a 100 k x 64 float32 activation is 25.6 MB.
MMAP_MAX = 0


def keep_freed_host_memory() -> bool:
    """Tell glibc to keep freed memory for reuse (call it after set-up: what set-up freed was handed back
    under the defaults); False where the C library has no mallopt (not Linux, musl) or refuses the
    values: malloc then keeps its defaults, which are correct, only slower."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already uses
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, MMAP_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
