"""Bytes of a LayerGraph's index tensors and cached matrices (nn/graph.LayerGraph), from its row counts
(`lr`: an estimate.LayerRows, which estimate.py imports this module to count): what memory_model/estimate.py
counts for training views and memory_model/induced.py for evaluation's."""
from __future__ import annotations

from granndis_hpc.units import FLOAT32_BYTES as F32
from granndis_hpc.units import INT64_BYTES as I64


def _graph_bytes(lr, self_loops: bool, forward_cache: bool, transpose_cache: bool) -> int:
    """A LayerGraph: indptr, indices, degrees, its exchange indices (send, halo rows) and the cached CSR
    adjacency (crow, col, values; self_loops adds the n_dst self-loop entries) and its transpose."""
    b = (lr.n_dst + 1) * I64 + lr.nnz * I64 + lr.n_dst * F32 + lr.n_src * F32
    b += lr.n_send * I64 + lr.n_halo * I64
    entries = lr.nnz + (lr.n_dst if self_loops else 0)
    if forward_cache:
        b += (lr.n_dst + 1) * I64 + entries * (I64 + F32)
    if transpose_cache:
        b += (lr.n_src + 1) * I64 + entries * (I64 + F32)
    return b


def _split_graph_bytes(lr, self_loops: bool, split: bool, transposed: bool) -> int:
    """The matrices an overlapped layer adds to its graph (nn/graph.LayerGraph._matrix): its adjacency
    split into own-source and halo-source columns (the same entries again, two row pointers), each split
    again by destination rows first/rest when the layer is boundary-first (four row pointers), and
    their transposes for the backward."""
    entries = (lr.nnz + (lr.n_dst if self_loops else 0)) * (I64 + F32)
    parts = 2 if split else 1
    b = entries + parts * (lr.n_dst + 2) * I64
    if transposed:
        b += entries + parts * (lr.n_own_in + lr.n_halo + 2) * I64
    return b
