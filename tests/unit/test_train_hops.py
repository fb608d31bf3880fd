"""graph/train_hop (preprocess/build/inductive.py train_hops): the hop of every row of a server file within the
train-induced graph, on small hand-made graphs whose hops are written out here."""
import numpy as np
import pytest

from granndis_hpc.shards import TRAIN_HOP_UNREACHED as NO
from granndis_hpc.preprocess.build.inductive import train_hops


def csr(n, edges):
    """In-edge CSR (sources per destination, sorted) of the directed edges (src, dst)."""
    edges = sorted(edges, key=lambda e: (e[1], e[0]))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount([d for _, d in edges], minlength=n), out=indptr[1:])
    return indptr, np.array([s for s, _ in edges], dtype=np.int64)


def test_a_chain_an_unreachable_training_row_and_a_row_outside_the_training_set():
    # Rows 0 and 6 inner (hop 0), 6 not a training vertex.  The chain 0 <- 1 <- 2 <- 3 of training rows;
    # 4 is a training row reached only through the non-training 5 (4 -> 5 -> 0); 7 feeds only 6.
    # Full-graph hops: 1: 1, 5, 7; 2: 2, 4; 3: 3.
    indptr, indices = csr(8, [(1, 0), (2, 1), (3, 2), (5, 0), (4, 5), (7, 6), (0, 1)])
    hop = np.array([0, 1, 2, 3, 2, 1, 0, 1])
    train = np.array([1, 1, 1, 1, 1, 0, 0, 1], dtype=bool)
    assert train_hops(indptr, indices, hop, train, 3).tolist() == [0, 1, 2, 3, NO, NO, NO, NO]
    # Not reached within the depth: the sentinel, as for a row never reached.
    assert train_hops(indptr, indices, hop, train, 2).tolist() == [0, 1, 2, NO, NO, NO, NO, NO]
    assert train_hops(indptr, indices, hop, train, 0).tolist() == [0, NO, NO, NO, NO, NO, NO, NO]


def test_the_hop_is_the_shortest_train_induced_path_not_the_full_graph_hop():
    # 0 inner; 3 is two full-graph hops away through the non-training 1, and three through training rows
    # (3 -> 4 -> 2 -> 0), which a 2-hop BFS does not reach.
    indptr, indices = csr(5, [(1, 0), (3, 1), (2, 0), (4, 2), (3, 4)])
    hop = np.array([0, 1, 1, 2, 2])
    train = np.array([1, 0, 1, 1, 1], dtype=bool)
    out = train_hops(indptr, indices, hop, train, 3)
    assert out.dtype == np.uint8 and out.tolist() == [0, NO, 1, 3, 2]
    assert train_hops(indptr, indices, hop, train, 2).tolist() == [0, NO, 1, NO, 2]


def test_a_preload_deeper_than_the_sentinel_is_refused():
    indptr, indices = csr(1, [])
    with pytest.raises(ValueError, match="graph/train_hop stores hops below 255"):
        train_hops(indptr, indices, np.zeros(1), np.ones(1, dtype=bool), 255)
