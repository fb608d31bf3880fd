"""idx_t and real_t of the partitioning libraries called through ctypes, read from the loaded library.

METIS, ParMETIS and PT-Scotch take arrays of their index type (idx_t; SCOTCH_Num in PT-Scotch), whose
width is a build option (IDXTYPEWIDTH in metis.h; Debian builds PT-Scotch both ways, scotch-int32 and
scotch-int64); Karypis' ParMETIS also takes target part weights and tolerances as real_t
(REALTYPEWIDTH).  An array of another width than the library's is read as other numbers: a wrong
partition, or reads and writes past the array's end.  So every width is asked of the library the calls
go to, never taken from the environment or from a header, which may belong to another build:

- PT-Scotch: SCOTCH_numSizeof() returns sizeof(SCOTCH_Num), which is idx_t in its ParMETIS interface.
  It resolves from the libptscotch that the SCOTCH_* calls go to.
- METIS, and Karypis' ParMETIS (built on METIS with METIS' idx_t and real_t, and linked to it or
  containing it): METIS_SetDefaultOptions(options) sets the METIS_NOPTIONS entries of `options` to -1.
  METIS_NOPTIONS is 40 in every METIS 5 (the caller allocates the array, so the count is part of the
  API), so the bytes it writes into a larger zeroed buffer are 40 x sizeof(idx_t).
- real_t: METIS refuses target part weights that do not sum to 1 (METIS_ERROR_INPUT).  Targets
  {0.5, 0.5} written as float32 read as {~3e-5, 0} with a 64-bit real_t, and written as float64 read as
  {0, 1.75} with a 32-bit one, so a 2-vertex, 2-part METIS_PartGraphRecursive accepts exactly one of the
  two.  Only Karypis' ParMETIS needs real_t: METIS gets NULL targets (its defaults) and PT-Scotch's
  ParMETIS interface declares them float.

A width other than 32 or 64 bits, or a library that cannot tell its width, is refused with a one-line
error.  No environment variable overrides a width: where the library tells, an override could only
agree with it or be wrong.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys

import numpy as np

METIS_OK = 1
METIS_NOPTIONS = 40  # METIS 5's options[] length (metis.h)
TYPE_BITS = (32, 64)  # the widths METIS, ParMETIS and PT-Scotch build with


class PartitionerError(RuntimeError):
    pass


def c_pointer(a: np.ndarray | None):
    """An array's data as a C pointer (None: NULL)."""
    return a.ctypes.data_as(ctypes.c_void_p) if a is not None else None


def c_index(dtype: np.dtype):
    """The ctypes scalar of an index dtype (int32 or int64)."""
    return ctypes.c_int64 if np.dtype(dtype) == np.int64 else ctypes.c_int32


def checked_bits(bits: int, what: str, path: str) -> int:
    """`bits`, refused unless 32 or 64."""
    if bits not in TYPE_BITS:
        raise PartitionerError(f"{path}: {what} is {bits} bits wide, and only 32 or 64 are supported; use a "
                               "METIS/ParMETIS/PT-Scotch built with 32- or 64-bit types")
    return bits


def scotch_idx_bits(lib, path: str) -> int:
    """The width of SCOTCH_Num (idx_t of PT-Scotch's ParMETIS interface), from SCOTCH_numSizeof()."""
    lib.SCOTCH_numSizeof.restype, lib.SCOTCH_numSizeof.argtypes = ctypes.c_int, []
    return checked_bits(8 * int(lib.SCOTCH_numSizeof()), "SCOTCH_Num (SCOTCH_numSizeof)", path)


def metis_idx_bits(lib, path: str) -> int:
    """The width of METIS' idx_t: the bytes METIS_SetDefaultOptions writes (40 idx_t of -1)."""
    buf = np.zeros(4 * METIS_NOPTIONS * 8, dtype=np.uint8)  # room for 40 entries of up to 256 bits
    lib.METIS_SetDefaultOptions(c_pointer(buf))
    unset = np.flatnonzero(buf != 0xFF)
    written = int(unset[0]) if unset.size else buf.size
    if written == 0 or written % METIS_NOPTIONS or buf[written:].any():
        raise PartitionerError(f"{path}: METIS_SetDefaultOptions did not write {METIS_NOPTIONS} options of -1, "
                               "so its idx_t width is unknown; use a METIS 5 library")
    return checked_bits(8 * written // METIS_NOPTIONS, "idx_t (METIS_SetDefaultOptions)", path)


def metis_real_bits(lib, path: str, idx_bits: int) -> int:
    """The width of METIS' real_t: the float width in which METIS accepts targets {0.5, 0.5}."""
    accepted = [bits for bits in TYPE_BITS if _accepts_half_targets(lib, idx_bits, bits)]
    if len(accepted) != 1:
        found = " and ".join(f"float{b}" for b in accepted) or "neither float32 nor float64"
        raise PartitionerError(f"{path}: METIS accepted targets {{0.5, 0.5}} as {found}, so its real_t width is "
                               "unknown; use a METIS/ParMETIS built with 32- or 64-bit real_t")
    return accepted[0]


def _accepts_half_targets(lib, idx_bits: int, real_bits: int) -> bool:
    """Whether METIS_PartGraphRecursive accepts an edge's 2 vertices into 2 parts with targets {0.5, 0.5}
    written as float`real_bits` (zeros after them, so a wider real_t reads a small sum, not past the end)."""
    idx = np.dtype(f"int{idx_bits}")
    one, two = np.array([1], dtype=idx), np.array([2], dtype=idx)
    xadj, adjncy = np.array([0, 1, 2], dtype=idx), np.array([1, 0], dtype=idx)
    targets = np.zeros(4, dtype=np.dtype(f"float{real_bits}"))
    targets[:2] = 0.5
    objval, part = np.zeros(1, dtype=idx), np.zeros(2, dtype=idx)
    with _c_stdout_discarded():  # METIS prints the refused sum ("Input Error: ...")
        rc = lib.METIS_PartGraphRecursive(c_pointer(two), c_pointer(one), c_pointer(xadj), c_pointer(adjncy),
                                          None, None, None, c_pointer(two), c_pointer(targets), None, None,
                                          c_pointer(objval), c_pointer(part))
    return rc == METIS_OK


@contextlib.contextmanager
def _c_stdout_discarded():
    """File descriptor 1 on /dev/null, C's stdio buffers flushed on entry and before it is restored."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def parmetis_type_bits(lib, path: str, is_scotch: bool) -> tuple[int, int]:
    """(idx_t, real_t) widths of a ParMETIS library: PT-Scotch's interface or Karypis' ParMETIS."""
    if is_scotch:
        if not hasattr(lib, "SCOTCH_numSizeof"):
            raise PartitionerError(f"{path}: this PT-Scotch has no SCOTCH_numSizeof, so its index width is unknown; "
                                   "use PT-Scotch 6 or later")
        return scotch_idx_bits(lib, path), 32  # its parmetis.h declares tpwgts and ubvec float
    if not hasattr(lib, "METIS_SetDefaultOptions"):
        raise PartitionerError(f"{path}: this ParMETIS reaches no METIS_SetDefaultOptions, so its idx_t width is "
                               "unknown; use a ParMETIS linked to its shared libmetis, or PT-Scotch's")
    idx_bits = metis_idx_bits(lib, path)
    return idx_bits, metis_real_bits(lib, path, idx_bits)
