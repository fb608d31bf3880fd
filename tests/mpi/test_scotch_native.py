"""PT-Scotch through its own API (preprocess/parmetis._scotch_map) against its ParMETIS layer, 4 ranks.

With the band PT-Scotch's default 3 vertices wide, our SCOTCH_dgraphMapCompute call must give exactly
the partition of the compatibility layer's ParMETIS_V3_PartKway (the same graph build, strategy, target
and seed); with the band 1 wide (the build's default) the partition is valid, as balanced and cuts about
as many edges.  The graph (24k vertices, communities) is large enough that PT-Scotch's distributed
multilevel refines in parallel (it folds graphs under max(2000 P, 10000) vertices onto one process, where
the band width plays no part).  The cut is counted with scipy, independently of the code under test.
"""
import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from granndis_hpc.preprocess.partition.parmetis import load_parmetis, parmetis_part_kway
from granndis_hpc.preprocess.build.slices import vtxdist_for
from tests.mpi.test_partition import community_graph

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _scotch_or_skip():
    pm = load_parmetis()
    if not pm.native_scotch:
        pytest.skip("the ParMETIS library here is not PT-Scotch")
    return pm


def _partition(pm, g, nparts, monkeypatch, width=None, compat=False, gather=None):
    vtxdist = vtxdist_for(g.num_vertices, WORLD.size)
    lo, hi = int(vtxdist[WORLD.rank]), int(vtxdist[WORLD.rank + 1])
    xadj = (g.indptr[lo:hi + 1] - g.indptr[lo]).astype(pm.idx_dtype)
    adjncy = g.indices[g.indptr[lo]:g.indptr[hi]].astype(pm.idx_dtype)
    if width is not None:
        monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_WIDTH", str(width))
    if gather is not None:
        monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", str(gather))
    if compat:  # hide the native entry point: parmetis_part_kway falls back to ParMETIS_V3_PartKway
        monkeypatch.setattr(type(pm), "native_scotch", property(lambda self: False))
    local = parmetis_part_kway(pm, WORLD, vtxdist, xadj, adjncy, nparts, None, seed=5)
    monkeypatch.undo()
    return np.concatenate(WORLD.allgather(local))


def _cut(g, parts):
    a = sp.csr_matrix((np.ones(g.indices.size), g.indices, g.indptr), shape=(g.num_vertices,) * 2).tocoo()
    return int((parts[a.row] != parts[a.col]).sum())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nparts", [2, 3])
def test_native_band_3_equals_parmetis_layer_and_band_1_cuts_as_well(nparts, monkeypatch):
    pm = _scotch_or_skip()
    g = community_graph(n=24000, communities=40, m=150000, p_out=0.05, seed=1)
    compat = _partition(pm, g, nparts, monkeypatch, compat=True)
    band3 = _partition(pm, g, nparts, monkeypatch, width=3, gather="always")
    np.testing.assert_array_equal(band3, compat)
    assert pm.band_width == 3 and "band width 3, band gathered always" in pm.describe()  # the manifest's
    band1 = _partition(pm, g, nparts, monkeypatch)
    assert pm.band_width == 1 and "band width 1, band gathered below 2 slices' arcs" in pm.describe()
    random_cut = _cut(g, np.arange(g.num_vertices) % nparts)
    for parts in (compat, band1):
        counts = np.bincount(parts, minlength=nparts)
        assert counts.min() > 0 and counts.max() / (g.num_vertices / nparts) <= 1.06, counts
    assert _cut(g, band1) <= 1.1 * _cut(g, compat) < 0.5 * random_cut, (_cut(g, band1), _cut(g, compat), random_cut)


@pytest.mark.timeout(120)
def test_band_gathered_only_below_the_limit(monkeypatch):
    """The band gathered onto every process only while it has fewer arcs than f slices' worth: with f
    so small that no band is gathered the strategy still parses and gives a valid, balanced partition
    that differs from gathering every band, and cuts at most 1.3x its edges; with f so large that every
    band is below the limit the partition is exactly the one of gathering every band."""
    pm = _scotch_or_skip()
    g = community_graph(n=24000, communities=40, m=150000, p_out=0.05, seed=1)
    always = _partition(pm, g, 2, monkeypatch, gather="always")
    never = _partition(pm, g, 2, monkeypatch, gather=1e-6)
    np.testing.assert_array_equal(_partition(pm, g, 2, monkeypatch, gather=1e6), always)
    assert not np.array_equal(never, always)
    counts = np.bincount(never, minlength=2)
    assert counts.min() > 0 and counts.max() / (g.num_vertices / 2) <= 1.06, counts
    assert _cut(g, never) <= 1.3 * _cut(g, always), (_cut(g, never), _cut(g, always))


@pytest.mark.timeout(120)
def test_heap_thresholds_leave_the_partition(monkeypatch):
    """glibc's thresholds during the call (parmetis._heap_for_call, GRANNDIS_SCOTCH_MMAP_MIB; 0 = off)
    place PT-Scotch's allocations elsewhere, not its partition: the same parts with and without."""
    pm = _scotch_or_skip()
    g = community_graph(n=24000, communities=40, m=150000, p_out=0.05, seed=1)
    monkeypatch.setenv("GRANNDIS_SCOTCH_MMAP_MIB", "0")
    off = _partition(pm, g, 2, monkeypatch)
    np.testing.assert_array_equal(_partition(pm, g, 2, monkeypatch), off)


def test_band_gather_must_be_positive_or_always(monkeypatch):
    from granndis_hpc.preprocess.partition.parmetis import PartitionerError, scotch_band_gather
    for bad in ("0", "-1", "x"):
        monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", bad)
        with pytest.raises(PartitionerError, match="GRANNDIS_SCOTCH_BAND_GATHER must be"):
            scotch_band_gather()
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", "always")
    assert scotch_band_gather() is None
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", "2")
    assert scotch_band_gather() == 2.0


def test_band_width_must_be_positive(monkeypatch):
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_WIDTH", "0")
    from granndis_hpc.preprocess.partition.parmetis import PartitionerError, scotch_band_width
    with pytest.raises(PartitionerError, match="GRANNDIS_SCOTCH_BAND_WIDTH must be a positive integer"):
        scotch_band_width()
