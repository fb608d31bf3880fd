"""The partition phase's adjacency of a symmetric slice (dist_build.SlicedAccess.adjacency): its own
rows without their loops, no keys and no shuffle, equal to the whole graph's symmetric adjacency
(partition.symmetric_adjacency, the whole-graph build's) row for row."""
import numpy as np
import pytest

from granndis_hpc.preprocess.build.distributed import SlicedAccess
from granndis_hpc.preprocess.partition.twolevel import symmetric_adjacency
from granndis_hpc.preprocess.build.sliced import GraphSlice


def _graph(n, loops, seed=0):
    rng = np.random.default_rng(seed)
    a = np.zeros((n, n), dtype=bool)
    e = rng.integers(0, n, (2, 6 * n))
    a[e[0], e[1]] = True
    a |= a.T
    np.fill_diagonal(a, False)
    if loops:
        a[np.arange(0, n, 3), np.arange(0, n, 3)] = True
    a[7, :] = a[:, 7] = False  # an isolated vertex: an empty row
    indptr = np.concatenate([[0], np.cumsum(a.sum(1))]).astype(np.int64)
    return indptr, np.nonzero(a)[1].astype(np.int64)


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("lo,hi", [(0, 60), (5, 31), (31, 60)])
def test_symmetric_slice_is_its_own_adjacency(loops, lo, hi):
    n = 60
    indptr, indices = _graph(n, loops)
    rows = hi - lo
    part = GraphSlice(name="t", num_vertices=n, num_edges=int(indices.shape[0]), num_classes=2,
                      vtxdist=np.array([lo, hi]), lo=lo, hi=hi, edge_offset=int(indptr[lo]),
                      indptr=indptr[lo:hi + 1] - indptr[lo], indices=indices[indptr[lo]:indptr[hi]].copy(),
                      features=np.zeros((rows, 1), np.float32), labels=np.zeros(rows, np.int64),
                      train_mask=np.zeros(rows, bool), val_mask=np.zeros(rows, bool), test_mask=np.zeros(rows, bool),
                      symmetric=True)
    access = SlicedAccess(None, part, np.zeros(n, bool))  # no group: the symmetric path sends nothing
    xadj, adjncy = access.adjacency(np.array([lo, hi]))
    want_xadj, want_adjncy = symmetric_adjacency(indptr, indices, lo, hi)
    assert np.array_equal(xadj, want_xadj) and np.array_equal(adjncy, want_adjncy)
    assert not np.any(adjncy == np.repeat(np.arange(lo, hi), np.diff(xadj)))  # no loops left
