"""Sparse CSR matrices from COO entries, for nn/graph.py's cached adjacencies (pure torch and scipy)."""
from __future__ import annotations

import warnings
from typing import Tuple

import numpy as np
import scipy.sparse  # (imported here, not on first use: ~0.5 s that would land in a training step)
import torch


# The largest row count, column count and nnz whose CSR indices are int32.
INT32_INDEX_LIMIT = 2 ** 31 - 1


def _csr(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape: Tuple[int, int]) -> torch.Tensor:
    """A sparse CSR tensor without torch's 'beta' and 'invariant checks' warnings on every call.

    Its indices are int32 where they fit: torch's CPU product (MKL) converts int64 indices to int32 on
    every call, a copy of the column indices per product (6 of 2.5 M entries per epoch of a 3-layer
    SAGE on 100 k vertices), and int32 halves the index bytes every product reads.  The products are
    the same, bit for bit."""
    if max(shape[0], shape[1], col.numel()) <= INT32_INDEX_LIMIT:
        crow, col = crow.to(torch.int32), col.to(torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            return torch.sparse_csr_tensor(crow, col, val, size=shape, check_invariants=False)
        except TypeError:  # torch < 2.0 has no check_invariants argument
            return torch.sparse_csr_tensor(crow, col, val, size=shape)


def coo_to_csr(rows, cols, vals, shape) -> torch.Tensor:
    """CSR from COO entries, duplicates summed (a multi-edge counts as often as it occurs)."""
    if rows.device.type == "cpu" and vals.dtype in _SCIPY_DTYPES:
        return _coo_to_csr_scipy(rows, cols, vals, shape)
    return _coo_to_csr_torch(rows, cols, vals, shape)


def _coo_to_csr_torch(rows, cols, vals, shape) -> torch.Tensor:
    n_rows, n_cols = shape
    # Sort by (row, col) with one key; int64 does not overflow for any realistic graph.
    key = rows * max(n_cols, 1) + cols
    # Canonical CSR input (sorted, no multi-edges) is already in order: skip the O(nnz log nnz) sort.
    if key.numel() > 1 and not bool((key[1:] > key[:-1]).all()):
        key, order = torch.sort(key)
        vals = vals[order]
    if key.numel():
        unique, inverse = torch.unique_consecutive(key, return_inverse=True)
        if unique.numel() != key.numel():
            vals = torch.zeros(unique.numel(), dtype=vals.dtype, device=vals.device).index_add_(0, inverse, vals)
            key = unique
    r, c = key // max(n_cols, 1), key % max(n_cols, 1)
    crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=n_rows), 0)
    return _csr(crow, c, vals, shape)


# On the CPU scipy's COO -> CSR conversion (a counting pass by row, then a sort inside each row) gives
# the same matrix as the torch path above (columns sorted in every row, duplicates summed: a normalised
# adjacency's duplicate entries hold equal values, so the order of their sum does not matter) about 5x
# faster than its global torch.sort (200k graph, 0.7M entries: 0.011 s against 0.064 s): a co-batch
# loader builds ~10 of these per co-batch (engine/cobatch.py).  scipy has no bfloat16.
_SCIPY_DTYPES = (torch.float32, torch.float64)


def _coo_to_csr_scipy(rows, cols, vals, shape) -> torch.Tensor:
    m = scipy.sparse.csr_matrix((vals.detach().numpy(), (rows.numpy(), cols.numpy())), shape=shape)
    m.sum_duplicates()  # (sorts the columns of every row too)
    crow = torch.from_numpy(m.indptr.astype(np.int64, copy=False))
    col = torch.from_numpy(m.indices.astype(np.int64, copy=False))
    return _csr(crow, col, torch.from_numpy(m.data), shape)
