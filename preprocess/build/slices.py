"""Rows in contiguous slices over the ranks of a build (vtxdist: rank r holds global rows
vtxdist[r]..vtxdist[r+1]-1, the layout ParMETIS takes), and what every distributed phase does with them:
send edge keys v*n+u to the rank owning v, turn a rank's sorted keys into its rows' adjacency, and hold a
slice's arrays on disk while a phase does not read them.

The lowest layer of preprocess's distributed build: it imports no other preprocess module, so the
loaders (sliced.py), the partitioner (partition.py) and the locality order (locality.py) all build on it."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import numpy as np

from granndis_hpc.cluster import as_group


def vtxdist_for(n: int, size: int) -> np.ndarray:
    """Contiguous, balanced slices of the global ids, one per rank."""
    return (np.arange(size + 1, dtype=np.int64) * n) // size


def shuffle_to_owners(group, keys: np.ndarray, vtxdist: np.ndarray, n: int) -> np.ndarray:
    """Send every key v*n+u to the rank owning v (vtxdist ranges); returns the keys received, sorted."""
    keys.sort()
    cuts = np.searchsorted(keys, vtxdist * n)
    cuts[-1] = keys.shape[0]
    got = group.alltoallv(keys, np.diff(cuts))
    del keys
    got.sort()
    return got


def keys_to_adjacency(keys: np.ndarray, m: int, lo: int, hi: int):
    """(xadj, adjncy) of rows lo..hi-1 from their sorted distinct keys row*m+col (in place on keys)."""
    xadj = np.searchsorted(keys, np.arange(lo, hi + 1, dtype=np.int64) * m).astype(np.int64)
    np.remainder(keys, m, out=keys)
    return xadj, keys


SPILL_PREFIX = ".granndis-spill-"
_spill_root = None  # the build output directory (spill_directory); None: tempfile's directory


@contextlib.contextmanager
def spill_directory(path):
    """Within the block, `spilled` writes its temporary files under `path` (the build's output
    directory, where `prepare_output_dir` removes what a killed build left), not in $TMPDIR, where
    a rank killed mid-partition left its spill files for ever."""
    global _spill_root
    before, _spill_root = _spill_root, os.fspath(path) if path is not None else None
    try:
        yield
    finally:
        _spill_root = before


def _no_space(directory: str, exc: OSError) -> OSError:
    """numpy reports a short write as "N requested and M written" without an errno: say what it is."""
    import errno

    if exc.errno not in (None, errno.ENOSPC, errno.EDQUOT, errno.EFBIG) and "requested and" not in str(exc):
        return exc
    try:
        free = f"{shutil.disk_usage(directory).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    out = OSError(f"no space left in {directory} (No space left on device) for this rank's slice arrays "
                  f"({free}); free space there or build into another --out")
    out.errno = errno.ENOSPC
    return out


@contextlib.contextmanager
def spilled(comm, part, fields):
    """Collective: inside the block this rank's slice arrays `fields` (attributes of `part`, a
    sliced.GraphSlice or any object holding arrays, e.g. "features", "indices") are
    not in memory but in a temporary .npy file of its own (under the build's output directory, see
    spill_directory; else tempfile's directory), and `part.<field>` is None; after the block they are
    read back into memory, the same bytes.

    For the partition phase, whose peak is the partitioner's own structures (ParMETIS on the rank's
    slice): the features and labels are not read there at all and the edges only before and after the
    ParMETIS call, so holding them on disk meanwhile takes 4F + 8 B per row and 8 B per edge of the
    slice off the build's peak (docs/performance/build-scaling.md) at the cost of writing and reading them
    once.  A rank that cannot write or read its file fails every rank (group.errors)."""
    group = as_group(comm)
    fields = tuple(fields)
    with group.errors("writing this rank's slice arrays to a temporary file"):
        root = _spill_root if _spill_root is not None and os.path.isdir(_spill_root) else None
        tmp = tempfile.mkdtemp(prefix=SPILL_PREFIX if root else SPILL_PREFIX[1:], dir=root)
        try:
            for f in fields:
                np.save(os.path.join(tmp, f + ".npy"), getattr(part, f), allow_pickle=False)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _no_space(os.path.dirname(tmp), exc) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for f in fields:
        setattr(part, f, None)

    def restore():
        for f in fields:
            if getattr(part, f) is None:
                setattr(part, f, np.load(os.path.join(tmp, f + ".npy"), allow_pickle=False))

    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the block's exception is the one to report
            restore()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        with group.errors("reading this rank's slice arrays back from a temporary file"):
            restore()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
