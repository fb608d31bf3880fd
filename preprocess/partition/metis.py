"""METIS (multi-constraint) through its C API, from the METIS library that pymetis installs.

Which METIS: pymetis' (a dependency that brings METIS as a wheel wherever pip runs).  Every build's GPU
split and locality blocks go through it, and another METIS build gives other partitions (measured:
Debian's libmetis 5.1.0 and cmeel-metis 5.2.1, both with 32-bit idx_t, differ from pymetis' 64-bit METIS
on every graph tried), so the partitions of a build follow the pymetis version alone.

How: pymetis' Python API partitions with one constraint whatever vweights holds (measured with pymetis
2025.2.2: the training constraint was ignored), so METIS_PartGraphRecursive / METIS_PartGraphKway, METIS'
own public API since METIS 5.0, are called through ctypes.  The library is the shared object in pymetis'
package folder that exports them (pymetis links METIS into its extension; a pymetis built against a
system METIS reaches the same names through the libmetis it loads).  Only pymetis' public module is
imported, none of its private functions is called, and idx_t's width is read from the library itself
(native_types), so a pymetis that renames its internals or builds METIS with another idx_t still works.
Where the folder holds no such library, pymetis' public part_graph partitions with one constraint, and
metis_part says so.  NULL tpwgts/ubvec select METIS' defaults, so real_t's width does not enter.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from granndis_hpc.preprocess.partition.native_types import (METIS_NOPTIONS, METIS_OK, PartitionerError, c_index,
                                                            c_pointer, metis_idx_bits)

METIS_API = ("METIS_SetDefaultOptions", "METIS_PartGraphRecursive", "METIS_PartGraphKway")


@dataclass(frozen=True)
class MetisLib:
    lib: ctypes.CDLL
    path: str
    idx_dtype: np.dtype


def _pymetis_folder() -> Path:
    try:
        import pymetis
    except ImportError as exc:  # pragma: no cover - pymetis is a hard dependency
        raise PartitionerError("pymetis is not installed; `pip install pymetis`") from exc
    return Path(pymetis.__file__).parent


def _shared_objects(folder: Path) -> list[Path]:
    """The shared libraries (extension modules included) directly in `folder`, by name."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so", ".dylib", ".dll")
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes))


def find_metis(folder: Path) -> Optional[MetisLib]:
    """The first shared object in `folder` that reaches METIS' API, with idx_t read from it; None if none."""
    for path in _shared_objects(folder):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        if all(hasattr(lib, name) for name in METIS_API):
            return MetisLib(lib, str(path), np.dtype(f"int{metis_idx_bits(lib, str(path))}"))
    return None


@functools.lru_cache(maxsize=1)
def load_metis() -> Optional[MetisLib]:
    """pymetis' METIS (module docstring), once per process; None where its folder holds none."""
    return find_metis(_pymetis_folder())


def metis_part(xadj: np.ndarray, adjncy: np.ndarray, nparts: int, vwgt: np.ndarray | None):
    """METIS partition of a symmetric graph (no self loops) with vwgt int [n, ncon] constraints.

    Returns (part int64 [n], number of constraints METIS actually balanced).
    """
    n = xadj.shape[0] - 1
    if nparts == 1 or n == 0:
        return np.zeros(n, dtype=np.int64), (1 if vwgt is None else vwgt.shape[1])
    metis = load_metis()
    if metis is None:  # no METIS library reachable: single constraint through pymetis' API
        import pymetis
        part = pymetis.part_graph(nparts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))[1]
        return np.asarray(part, dtype=np.int64), 1
    idx, num = metis.idx_dtype, c_index(metis.idx_dtype)
    ncon = 1 if vwgt is None else int(vwgt.shape[1])
    xadj_c = np.ascontiguousarray(xadj, dtype=idx)
    adjncy_c = np.ascontiguousarray(adjncy if adjncy.size else np.zeros(1), dtype=idx)
    vwgt_c = None if vwgt is None else np.ascontiguousarray(vwgt, dtype=idx).reshape(-1)
    options = np.zeros(METIS_NOPTIONS, dtype=idx)
    metis.lib.METIS_SetDefaultOptions(c_pointer(options))
    nv, nc, npart, obj = num(n), num(ncon), num(nparts), num(0)
    part = np.zeros(n, dtype=idx)
    # Recursive bisection balances better for few parts (pymetis' own default: recursive up to 8 parts).
    fn = metis.lib.METIS_PartGraphRecursive if nparts <= 8 else metis.lib.METIS_PartGraphKway
    rc = fn(ctypes.byref(nv), ctypes.byref(nc), c_pointer(xadj_c), c_pointer(adjncy_c), c_pointer(vwgt_c), None,
            None, ctypes.byref(npart), None, None, c_pointer(options), ctypes.byref(obj), c_pointer(part))
    if rc != METIS_OK:
        raise PartitionerError(f"METIS ({metis.path}) returned {rc} (n={n}, nparts={nparts}, ncon={ncon})")
    return part.astype(np.int64), ncon
