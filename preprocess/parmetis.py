"""ParMETIS_V3_PartKway and METIS (multi-constraint) through ctypes.

ParMETIS: the library is found from $GRANNDIS_PARMETIS_LIB, else libparmetis.so, else
libptscotchparmetisv3.so.  Two implementations share the ParMETIS v3 API:

- PT-Scotch's compatibility layer (Debian `libscotchparmetis-dev`): it exports SCOTCH_* symbols and
  tells its index width through SCOTCH_numSizeof().  It accepts ncon=2 but does not honour the second
  constraint (measured, docs/design.md §8), so callers use one constraint there.  Its reported edge cut is 0.
- Karypis' ParMETIS: idx_t width is a build option with no run-time query; it is read from
  $GRANNDIS_PARMETIS_IDXTYPEWIDTH (default 32, ParMETIS' default build) and real_t from
  $GRANNDIS_PARMETIS_REALTYPEWIDTH (default 32).

Reproducibility (measured on Debian's PT-Scotch 7.0.3, Cora): PT-Scotch's threads make its result vary
from run to run (and its random state carries over between calls in one process), whatever the seed in
options[].  `_scotch_reproducible` runs the call with one Scotch thread (SCOTCH_PTHREAD_NUMBER=1, read by
Scotch at every call) and Scotch's generator seeded and reset: then the same graph, seed and rank count
give the same partition.  Karypis' ParMETIS takes the seed from options[2].

METIS: pymetis 2025.2 silently uses ncon=1 whatever vweights holds (measured: the training constraint was
ignored), so we call METIS_PartGraphRecursive / METIS_PartGraphKway from the METIS that pymetis bundles
(its extension exports them; idx_t width from pymetis._internal._idx_type_width()).  NULL tpwgts/ubvec
select METIS' defaults, so real_t's width does not matter.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass

import numpy as np

from granndis_hpc.cluster import as_group

METIS_OK = 1
PARMETIS_NAMES = ("libparmetis.so", "libptscotchparmetisv3.so")


class PartitionerError(RuntimeError):
    pass


@dataclass
class ParMetisLib:
    lib: ctypes.CDLL
    path: str
    idx_dtype: np.dtype
    real_dtype: np.dtype
    is_scotch: bool

    @property
    def name(self) -> str:
        return "pt-scotch-parmetis" if self.is_scotch else "parmetis"


def load_parmetis() -> ParMetisLib:
    env = os.environ.get("GRANNDIS_PARMETIS_LIB")
    candidates = [env] if env else list(PARMETIS_NAMES)
    errors = []
    for cand in candidates:
        try:
            lib = ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError as exc:
            errors.append(f"{cand}: {exc}")
    else:
        raise PartitionerError(
            "cannot load a ParMETIS library (" + "; ".join(errors) + "). Install Debian's libscotchparmetis-dev "
            "(`make setup`), load your site's parmetis module, set GRANNDIS_PARMETIS_LIB=/path/to/libparmetis.so, "
            "or use --partitioner metis")
    if not hasattr(lib, "ParMETIS_V3_PartKway"):
        raise PartitionerError(f"{cand} does not export ParMETIS_V3_PartKway; set GRANNDIS_PARMETIS_LIB to a ParMETIS library")
    is_scotch = hasattr(lib, "SCOTCH_ParMETIS_V3_PartKway")
    if is_scotch and hasattr(lib, "SCOTCH_numSizeof"):
        lib.SCOTCH_numSizeof.restype = ctypes.c_int
        width = 8 * int(lib.SCOTCH_numSizeof())
        real_width = 32  # PT-Scotch's parmetis.h declares tpwgts/ubvec as float
    else:
        width = int(os.environ.get("GRANNDIS_PARMETIS_IDXTYPEWIDTH", "32"))
        real_width = int(os.environ.get("GRANNDIS_PARMETIS_REALTYPEWIDTH", "32"))
    if width not in (32, 64) or real_width not in (32, 64):
        raise PartitionerError(f"unsupported ParMETIS idx/real width {width}/{real_width}; set "
                               "GRANNDIS_PARMETIS_IDXTYPEWIDTH and GRANNDIS_PARMETIS_REALTYPEWIDTH to 32 or 64")
    return ParMetisLib(lib=lib, path=str(cand), idx_dtype=np.dtype(f"int{width}"),
                       real_dtype=np.dtype(f"float{real_width}"), is_scotch=is_scotch)


@contextlib.contextmanager
def _scotch_reproducible(pm: ParMetisLib, seed: int):
    """Make a PT-Scotch call a function of its inputs and `seed` (no-op for Karypis' ParMETIS).

    Threaded Scotch is not reproducible (measured: with 2 threads every build of Cora differed, with 1
    none did), so the call runs single-threaded; parallelism comes from the MPI ranks.  The variable is
    set for this call only and restored after it.  Seeding and resetting Scotch's generator on every
    rank makes the result independent of earlier calls in the same process (measured: without the
    reset, consecutive calls in one process differed).
    """
    if not pm.is_scotch:
        yield
        return
    num = ctypes.c_int64 if pm.idx_dtype == np.int64 else ctypes.c_int32
    old = os.environ.get("SCOTCH_PTHREAD_NUMBER")
    os.environ["SCOTCH_PTHREAD_NUMBER"] = "1"
    try:
        if hasattr(pm.lib, "SCOTCH_randomSeed"):
            pm.lib.SCOTCH_randomSeed.argtypes = [num]
            pm.lib.SCOTCH_randomSeed(num(seed))
        if hasattr(pm.lib, "SCOTCH_randomReset"):
            pm.lib.SCOTCH_randomReset()
        yield
    finally:
        if old is None:
            os.environ.pop("SCOTCH_PTHREAD_NUMBER", None)
        else:
            os.environ["SCOTCH_PTHREAD_NUMBER"] = old


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p) if a is not None else None


def parmetis_part_kway(pm: ParMetisLib, comm, vtxdist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                       nparts: int, vwgt: np.ndarray | None, seed: int, imbalance: float = 1.03) -> np.ndarray:
    """Collective over `comm` (an MPI communicator or a cluster.Group): part (int64) of this rank's
    vertices vtxdist[rank]:vtxdist[rank+1].

    vwgt: None or int [n_local, ncon].  The graph must be symmetric without self loops.
    imbalance 1.03 (not 1.05): PT-Scotch uses the whole allowance, and we promise balance within 5 %.
    The result is reproducible for the same inputs, seed and rank count (see _scotch_reproducible).
    """
    idx = pm.idx_dtype
    vtxdist_c = np.ascontiguousarray(vtxdist, dtype=idx)
    xadj_c = np.ascontiguousarray(xadj, dtype=idx)
    # ParMETIS dereferences adjncy even for a rank without edges: never pass an empty buffer.
    adjncy_c = np.ascontiguousarray(adjncy if adjncy.size else np.zeros(1), dtype=idx)
    n_local = xadj_c.shape[0] - 1
    ncon = 1 if vwgt is None else int(vwgt.shape[1])
    vwgt_c = None if vwgt is None else np.ascontiguousarray(vwgt, dtype=idx).reshape(-1)
    if vwgt_c is not None and vwgt_c.size == 0:
        vwgt_c = np.zeros(ncon, dtype=idx)
    wgtflag = np.array([0 if vwgt is None else 2], dtype=idx)
    numflag = np.array([0], dtype=idx)
    ncon_c = np.array([ncon], dtype=idx)
    nparts_c = np.array([nparts], dtype=idx)
    tpwgts = np.full(ncon * nparts, 1.0 / nparts, dtype=pm.real_dtype)
    ubvec = np.full(ncon, imbalance, dtype=pm.real_dtype)
    seed = int(seed) % (2 ** 31)  # fits idx_t and SCOTCH_Num of either width
    options = np.array([1, 0, seed], dtype=idx)  # use options; no debug output; random seed (Karypis')
    edgecut = np.zeros(1, dtype=idx)
    part = np.zeros(max(n_local, 1), dtype=idx)
    comm_ptr = ctypes.c_void_p(as_group(comm).c_handle_address())  # the MPI_Comm * it takes
    with _scotch_reproducible(pm, seed):
        rc = pm.lib.ParMETIS_V3_PartKway(
            _ptr(vtxdist_c), _ptr(xadj_c), _ptr(adjncy_c), _ptr(vwgt_c), None, _ptr(wgtflag), _ptr(numflag),
            _ptr(ncon_c), _ptr(nparts_c), _ptr(tpwgts), _ptr(ubvec), _ptr(options), _ptr(edgecut), _ptr(part),
            comm_ptr)
    if rc != METIS_OK:
        raise PartitionerError(f"ParMETIS_V3_PartKway ({pm.path}) returned {rc}")
    return part[:n_local].astype(np.int64)


def _metis_lib():
    try:
        import pymetis._internal as internal
    except ImportError as exc:  # pragma: no cover - pymetis is a hard dependency
        raise PartitionerError("pymetis is not installed; `pip install pymetis`") from exc
    lib = ctypes.CDLL(internal.__file__)
    if not hasattr(lib, "METIS_PartGraphKway"):
        return None, None
    width = int(internal._idx_type_width()) if hasattr(internal, "_idx_type_width") else 64
    return lib, np.dtype(f"int{width}")


def metis_part(xadj: np.ndarray, adjncy: np.ndarray, nparts: int, vwgt: np.ndarray | None):
    """METIS partition of a symmetric graph (no self loops) with vwgt int [n, ncon] constraints.

    Returns (part int64 [n], number of constraints METIS actually balanced).
    """
    n = xadj.shape[0] - 1
    if nparts == 1 or n == 0:
        return np.zeros(n, dtype=np.int64), (1 if vwgt is None else vwgt.shape[1])
    lib, idx = _metis_lib()
    if lib is None:  # a pymetis build without exported symbols: single constraint through its API
        import pymetis
        part = pymetis.part_graph(nparts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))[1]
        return np.asarray(part, dtype=np.int64), 1
    ncon = 1 if vwgt is None else int(vwgt.shape[1])
    xadj_c = np.ascontiguousarray(xadj, dtype=idx)
    adjncy_c = np.ascontiguousarray(adjncy if adjncy.size else np.zeros(1), dtype=idx)
    vwgt_c = None if vwgt is None else np.ascontiguousarray(vwgt, dtype=idx).reshape(-1)
    options = np.zeros(40, dtype=idx)  # METIS_NOPTIONS
    lib.METIS_SetDefaultOptions(_ptr(options))
    ctype = ctypes.c_int64 if idx == np.int64 else ctypes.c_int32
    nv, nc, npart, obj = ctype(n), ctype(ncon), ctype(nparts), ctype(0)
    part = np.zeros(n, dtype=idx)
    # Recursive bisection balances better for few parts (pymetis' own default: recursive up to 8 parts).
    fn = lib.METIS_PartGraphRecursive if nparts <= 8 else lib.METIS_PartGraphKway
    rc = fn(ctypes.byref(nv), ctypes.byref(nc), _ptr(xadj_c), _ptr(adjncy_c), _ptr(vwgt_c), None, None,
            ctypes.byref(npart), None, None, _ptr(options), ctypes.byref(obj), _ptr(part))
    if rc != METIS_OK:
        raise PartitionerError(f"METIS returned {rc} (n={n}, nparts={nparts}, ncon={ncon})")
    return part.astype(np.int64), ncon
