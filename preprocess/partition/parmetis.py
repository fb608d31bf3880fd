"""ParMETIS_V3_PartKway, and PT-Scotch through its own API, through ctypes (METIS, on one rank: metis.py).

The library is found from $GRANNDIS_PARMETIS_LIB, else libparmetis.so, else
libptscotchparmetisv3.so.  Two implementations share the ParMETIS v3 API:

- PT-Scotch's compatibility layer (Debian `libscotchparmetis-dev`): it exports SCOTCH_* symbols.  It
  accepts ncon=2 but does not honour the second constraint (measured, docs/design.md §8), so callers use
  one constraint there.  Its reported edge cut is 0.
- Karypis' ParMETIS, which balances both constraints.

Either way idx_t's width (and real_t's, which only Karypis' ParMETIS takes from us) is read from the
loaded library (native_types: SCOTCH_numSizeof, or what the METIS under ParMETIS writes), never from
the environment.

Reproducibility (measured on Debian's PT-Scotch 7.0.3, Cora): PT-Scotch's threads make its result vary
from run to run (and its random state carries over between calls in one process), whatever the seed in
options[].  `_scotch_reproducible` runs the call with one Scotch thread (SCOTCH_PTHREAD_NUMBER=1, read by
Scotch at every call) and Scotch's generator seeded and reset: then the same graph, seed and rank count
give the same partition.  Karypis' ParMETIS takes the seed from options[2].

The band width (PT-Scotch only; docs/design.md §8): PT-Scotch's ParMETIS_V3_PartKway maps
with its default parallel strategy, whose refinement at every uncoarsening level gathers the band graph
(the vertices within `width` = 3 of the separator) whole onto every process and runs FM on it there.
On graphs without locality that band is most of the graph: measured, ~190 B per vertex of the whole
graph on every rank and the largest part of ParMETIS' CPU growth with P
(docs/performance/build-scaling.md).  So we call PT-Scotch's own API (SCOTCH_dgraphMapCompute) with the same
default strategy but that band 1 vertex wide (SCOTCH_BAND_WIDTH; GRANNDIS_SCOTCH_BAND_WIDTH=3 with
GRANNDIS_SCOTCH_BAND_GATHER=always gives the compatibility layer's partition exactly).  Measured at
800k vertices, P = 8: ParMETIS CPU 68 -> 36 s,
its peak RSS 0.343 -> 0.272 GiB, the same cut (1-hop halo 18.1k/17.8k -> 18.0k/17.8k vertices).
A graph that PT-Scotch partitions sequentially (P = 1, or small enough to fold onto one process, e.g.
Cora) never reaches that band: its partition is unchanged.  Even 1 wide, the finest level's band of
the local graphs holds 25-50 % of the arcs, so a band is gathered only while it has fewer than
SCOTCH_BAND_GATHER slices' worth of arcs, the distributed diffusion refining larger ones alone
(GRANNDIS_SCOTCH_BAND_GATHER; `always` with width 3 is the compatibility layer's strategy exactly).
Measured at P = 8: the server call's peak 272 -> 221 MiB (800k) and 607 -> 536 MiB (2.45M), 1-hop
halos +0.3 % / +0.05 %.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

from granndis_hpc.cluster import as_group

from granndis_hpc.preprocess.partition.native_types import (METIS_OK, PartitionerError, c_index, c_pointer,
                                                            parmetis_type_bits)

PARMETIS_NAMES = ("libparmetis.so", "libptscotchparmetisv3.so")


@dataclass
class ParMetisLib:
    lib: ctypes.CDLL
    path: str
    idx_dtype: np.dtype
    real_dtype: np.dtype
    is_scotch: bool
    band_width: Optional[int] = None  # PT-Scotch's parallel band in the last _scotch_map call (describe)
    band_gather: Optional[float] = None  # its gather limit in slices' arcs there (None: every band)

    @property
    def name(self) -> str:
        return "pt-scotch-parmetis" if self.is_scotch else "parmetis"

    @property
    def native_scotch(self) -> bool:
        """PT-Scotch called through its own API (_scotch_map), not its ParMETIS compatibility layer."""
        return self.is_scotch and hasattr(self.lib, "SCOTCH_dgraphMapCompute")

    def describe(self) -> str:
        """The library as the manifest records it (with the band width its last call used where it is
        PT-Scotch's own API: another PT-Scotch's strategy text keeps its own width 3, see _scotch_map)."""
        how = ""
        if self.band_width:
            gather = "always" if self.band_gather is None else f"below {self.band_gather:g} slices' arcs"
            how = f"; SCOTCH_dgraphMapCompute, band width {self.band_width}, band gathered {gather}"
        return f"{self.name} ({self.path}, idx_t {self.idx_dtype.itemsize * 8}-bit{how})"


def load_parmetis() -> ParMetisLib:
    """The ParMETIS library (module docstring), with its idx_t and real_t widths read from it."""
    lib, path = _open_parmetis()
    is_scotch = hasattr(lib, "SCOTCH_ParMETIS_V3_PartKway")
    idx_bits, real_bits = parmetis_type_bits(lib, path, is_scotch)
    return ParMetisLib(lib=lib, path=path, idx_dtype=np.dtype(f"int{idx_bits}"),
                       real_dtype=np.dtype(f"float{real_bits}"), is_scotch=is_scotch)


def _open_parmetis() -> tuple[ctypes.CDLL, str]:
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
        raise PartitionerError(f"{cand} does not export ParMETIS_V3_PartKway; set GRANNDIS_PARMETIS_LIB to a ParMETIS "
                               "library")
    return lib, str(cand)


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
    num = c_index(pm.idx_dtype)
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


# glibc's malloc during a ParMETIS call: its allocations of at least SCOTCH_MMAP_MIB MiB are
# mmapped, so each is returned to the system when freed instead of leaving a hole in the heap that
# only a smaller later allocation can fill (with glibc's dynamic threshold, raised to 32 MiB by numpy's
# arrays, PT-Scotch's level-by-level arrays lived in the heap).  Measured at 2.45M vertices, P = 8
# (every live array traced): the server call's peak 522-536 -> 512-520 MiB, the GPU split's
# 494-513 -> 467-491, the same partition.  After the call the thresholds are those the dynamic rule
# settles at (32 MiB, trim at 64).  GRANNDIS_SCOTCH_MMAP_MIB=0 leaves malloc as it is.
SCOTCH_MMAP_MIB = 1.0
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_AFTER = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def _libc_malloc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes, libc.malloc_trim.argtypes = [ctypes.c_int, ctypes.c_int], [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc
        return None


class MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2: malloc's counters, read by the memory probes (tests, bench/)."""
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def libc_malloc_info():
    """glibc with mallinfo2's result type set (its mallopt, malloc_trim and mallinfo2), or None."""
    libc = _libc_malloc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = MallInfo2
    return libc


@contextlib.contextmanager
def _heap_for_call():
    """malloc's thresholds at SCOTCH_MMAP_MIB for a ParMETIS call (above), the heap's free pages
    returned first (malloc_trim); a no-op without glibc or with GRANNDIS_SCOTCH_MMAP_MIB=0."""
    mib = _env_number("GRANNDIS_SCOTCH_MMAP_MIB", SCOTCH_MMAP_MIB, lambda v: v >= 0, "a number >= 0 (0: off)")
    libc = _libc_malloc() if mib > 0 else None
    if libc is None:
        yield
        return
    threshold = max(int(mib * 2 ** 20), 1)
    libc.malloc_trim(0)
    libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    libc.mallopt(_M_TRIM_THRESHOLD, threshold)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_AFTER)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_AFTER)


def parmetis_part_kway(pm: ParMetisLib, comm, vtxdist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                       nparts: int, vwgt: np.ndarray | None, seed: int, imbalance: float = 1.03) -> np.ndarray:
    """Collective over `comm` (an MPI communicator or a cluster.Group): part (int64) of this rank's
    vertices vtxdist[rank]:vtxdist[rank+1].

    vwgt: None or int [n_local, ncon].  The graph must be symmetric without self loops.
    imbalance 1.03 (not 1.05): Karypis' ubvec, which it uses in full, and we promise balance within 5 %.
    PT-Scotch (its ParMETIS layer and _scotch_map alike) maps with its default 5 % and ignores it.
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
    seed = int(seed) % (2 ** 31)  # fits idx_t and SCOTCH_Num of either width
    part = np.zeros(max(n_local, 1), dtype=idx)
    if pm.native_scotch:
        with _scotch_reproducible(pm, seed), _heap_for_call():
            pm.band_width, pm.band_gather = _scotch_map(pm, as_group(comm), xadj_c, adjncy_c, vwgt_c, nparts, part)
        return part[:n_local].astype(np.int64)
    wgtflag = np.array([0 if vwgt is None else 2], dtype=idx)
    numflag = np.array([0], dtype=idx)
    ncon_c = np.array([ncon], dtype=idx)
    nparts_c = np.array([nparts], dtype=idx)
    tpwgts = np.full(ncon * nparts, 1.0 / nparts, dtype=pm.real_dtype)
    ubvec = np.full(ncon, imbalance, dtype=pm.real_dtype)
    options = np.array([1, 0, seed], dtype=idx)  # use options; no debug output; random seed (Karypis')
    edgecut = np.zeros(1, dtype=idx)
    comm_ptr = ctypes.c_void_p(as_group(comm).c_handle_address())  # the MPI_Comm * it takes
    with _scotch_reproducible(pm, seed), _heap_for_call():
        rc = pm.lib.ParMETIS_V3_PartKway(
            c_pointer(vtxdist_c), c_pointer(xadj_c), c_pointer(adjncy_c), c_pointer(vwgt_c), None,
            c_pointer(wgtflag), c_pointer(numflag), c_pointer(ncon_c), c_pointer(nparts_c), c_pointer(tpwgts),
            c_pointer(ubvec), c_pointer(options), c_pointer(edgecut), c_pointer(part), comm_ptr)
    if rc != METIS_OK:
        raise PartitionerError(f"ParMETIS_V3_PartKway ({pm.path}) returned {rc}")
    return part[:n_local].astype(np.int64)


# The parallel band's width in PT-Scotch's mapping strategy (module docstring); 3 is PT-Scotch's own.
SCOTCH_BAND_WIDTH = 1
# The one place of the default parallel strategy (SCOTCH_stratDgraphMapBuild, PT-Scotch 7) that sets the
# width of the band refined at every uncoarsening level of the distributed multilevel.
_PARALLEL_BAND = "asc=b{width=3,bnd=(d{pass=40,dif=1"


# The refinement of that band at every level: gathered whole onto every process and refined there by
# FM (`q`), then made exact (`x`).  We gather it only while it has fewer than SCOTCH_BAND_GATHER times
# the mean slice's arcs (the graph's arcs / P): above that the distributed diffusion (`d`) alone refines
# it, so no process holds more than about two slices' worth of band.  On the local graphs this skips
# the gather at the finest level only (800k: the band there has 4.4M-8.8M of the graph's 17.8M arcs),
# docs/performance/build-scaling.md.
SCOTCH_BAND_GATHER = 2.0
_BAND_REFINE = "|)q{strat=f{move=80,pass=-1,bal=0.01,type=b}}x{"
_BAND_GATHER = "q{strat=f{move=80,pass=-1,bal=0.01,type=b}}"


def _env_number(name: str, default: float, valid, rule: str) -> float:
    """$name as a number (default when unset), refused with a clear error unless valid(value)."""
    raw = os.environ.get(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # fails every rule below
    if not valid(value):
        raise PartitionerError(f"{name} must be {rule}, got {raw!r}")
    return value


def scotch_band_gather() -> float | None:
    """The factor f of SCOTCH_BAND_GATHER ($GRANNDIS_SCOTCH_BAND_GATHER: a positive number, or `always`
    for PT-Scotch's own strategy, which gathers every band); None for always."""
    if os.environ.get("GRANNDIS_SCOTCH_BAND_GATHER") == "always":
        return None
    return _env_number("GRANNDIS_SCOTCH_BAND_GATHER", SCOTCH_BAND_GATHER, lambda v: v > 0,
                       "a positive number or 'always'")


def scotch_band_width() -> int:
    raw = os.environ.get("GRANNDIS_SCOTCH_BAND_WIDTH", str(SCOTCH_BAND_WIDTH))
    if not raw.isdigit() or int(raw) < 1:
        raise PartitionerError(f"GRANNDIS_SCOTCH_BAND_WIDTH must be a positive integer, got {raw!r}")
    return int(raw)


def _scotch_strategy_text(lib, strat) -> str:
    """The strategy as PT-Scotch writes it (SCOTCH_stratSave), to edit and parse back."""
    libc = ctypes.CDLL(None)
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.SCOTCH_stratSave.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", prefix="granndis-scotch-strat-") as tmp:
        stream = libc.fopen(tmp.name.encode(), b"w")
        if not stream:
            raise PartitionerError(f"cannot write PT-Scotch's strategy to {tmp.name}")
        rc = lib.SCOTCH_stratSave(strat, stream)
        libc.fclose(stream)
        if rc != 0:
            raise PartitionerError("SCOTCH_stratSave failed")
        return tmp.read()


def _scotch_map(pm: ParMetisLib, group, xadj, adjncy, vwgt, nparts: int, part) -> tuple[int, Optional[float]]:
    """What PT-Scotch's ParMETIS_V3_PartKway does (libscotchmetis/parmetis_dgraph_part.c: build the
    distributed graph, map it onto nparts equal parts with the default strategy), with the parallel band
    scotch_band_width() wide and gathered below scotch_band_gather() slices' arcs.  Collective over
    `group`; fills part[:n_local] and returns the band width and gather factor used: 3 and None
    (PT-Scotch's own) where this PT-Scotch's default strategy text is not the one we know how to edit.  vwgt: as the
    compatibility layer reads it (the first n_local values of the flattened weights; callers pass one
    constraint)."""
    lib, V = pm.lib, ctypes.c_void_p
    num = c_index(pm.idx_dtype)
    for fn in ("SCOTCH_dgraphAlloc", "SCOTCH_stratAlloc", "SCOTCH_archAlloc", "SCOTCH_dmapAlloc"):
        getattr(lib, fn).restype = V
    lib.SCOTCH_dgraphInit.argtypes = [V, V]
    lib.SCOTCH_dgraphBuild.argtypes = [V, num, num, num, V, V, V, V, num, num, V, V, V]
    lib.SCOTCH_stratDgraphMapBuild.argtypes = [V, num, num, num, ctypes.c_double]
    lib.SCOTCH_stratDgraphMap.argtypes = [V, ctypes.c_char_p]
    lib.SCOTCH_archCmpltw.argtypes = [V, num, V]
    lib.SCOTCH_dgraphMapInit.argtypes = [V, V, V, V]
    lib.SCOTCH_dgraphMapCompute.argtypes = [V, V, V]
    for fn in ("SCOTCH_stratInit", "SCOTCH_stratExit", "SCOTCH_archInit", "SCOTCH_archExit", "SCOTCH_dgraphExit"):
        getattr(lib, fn).argtypes = [V]
    lib.SCOTCH_dgraphMapExit.argtypes = [V, V]

    def check(rc, what):
        if rc != 0:
            raise PartitionerError(f"{what} ({pm.path}) returned {rc}")

    n_local, edges = xadj.shape[0] - 1, int(xadj[-1])
    width = scotch_band_width()
    # PT-Scotch's opaque objects, allocated by the library (their size is its own), freed in `finally`.
    graf, strat, arch, mapp = (lib.SCOTCH_dgraphAlloc(), lib.SCOTCH_stratAlloc(), lib.SCOTCH_archAlloc(),
                               lib.SCOTCH_dmapAlloc())
    comm = V.from_address(group.c_handle_address()).value  # MPI_Comm by value (Open MPI: a pointer)
    check(lib.SCOTCH_dgraphInit(graf, V(comm)), "SCOTCH_dgraphInit")
    lib.SCOTCH_stratInit(strat)
    lib.SCOTCH_archInit(arch)
    try:
        check(lib.SCOTCH_dgraphBuild(graf, num(0), num(n_local), num(n_local), c_pointer(xadj),
                                     c_pointer(xadj[1:]), c_pointer(vwgt), None, num(edges), num(edges),
                                     c_pointer(adjncy), None, None),
              "SCOTCH_dgraphBuild")
        # The default SCOTCH_dgraphMapCompute would build (library_dgraph_map.c): flags 0, imbalance 0.05.
        check(lib.SCOTCH_stratDgraphMapBuild(strat, num(0), num(group.size), num(nparts), ctypes.c_double(0.05)),
              "SCOTCH_stratDgraphMapBuild")
        text = _scotch_strategy_text(lib, strat)
        if text.count(_PARALLEL_BAND) != 1:  # another PT-Scotch's strategy: its default, unedited
            width = 3
        gather = scotch_band_gather()
        if gather is not None and text.count(_BAND_REFINE) != 1:
            gather = None
        if width != 3 or gather is not None:
            lib.SCOTCH_stratExit(strat)
            lib.SCOTCH_stratInit(strat)
            edited = text.replace(_PARALLEL_BAND, _PARALLEL_BAND.replace("width=3", f"width={width}"))
            if gather is not None:
                arcs = int(group.allreduce_sum(np.array([edges], dtype=np.int64))[0])
                limit = max(1, int(gather * arcs / group.size))
                # Scotch's conditional strategy: /(condition)?strategy; with `edge` the band's arcs.
                edited = edited.replace(_BAND_REFINE, _BAND_REFINE.replace(
                    _BAND_GATHER, f"/(edge<{limit})?{_BAND_GATHER};"))
            check(lib.SCOTCH_stratDgraphMap(strat, edited.encode()), "SCOTCH_stratDgraphMap")
        equal = np.ones(nparts, dtype=pm.idx_dtype)  # the compat layer's target weights for equal tpwgts
        check(lib.SCOTCH_archCmpltw(arch, num(nparts), c_pointer(equal)), "SCOTCH_archCmpltw")
        check(lib.SCOTCH_dgraphMapInit(graf, mapp, arch, c_pointer(part)), "SCOTCH_dgraphMapInit")
        try:
            check(lib.SCOTCH_dgraphMapCompute(graf, mapp, strat), "SCOTCH_dgraphMapCompute")
        finally:
            lib.SCOTCH_dgraphMapExit(graf, mapp)
        return width, gather
    finally:
        lib.SCOTCH_archExit(arch)
        lib.SCOTCH_stratExit(strat)
        lib.SCOTCH_dgraphExit(graf)
        if hasattr(lib, "SCOTCH_memFree"):
            lib.SCOTCH_memFree.argtypes = [V]
            for handle in (graf, strat, arch, mapp):
                lib.SCOTCH_memFree(handle)
