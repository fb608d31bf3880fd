"""Feature rows held at their own type's width: a set whose vertex types' widths differ (graph/hetero.py
``widths``) keeps each row's features once, at its type's width, in memory as in the shards.

A ``TypedRows`` holds one dense block per vertex type, [rows of that type, the type's width], the type's
rows in row order, plus each row's type (``row_type``): row i is row ``rank_i`` of block ``row_type[i]``,
where ``rank_i`` counts the rows of its type before it.  Nothing is stored for the columns a row lacks,
so its feature bytes are the sum over its rows of their widths x 4 (``nbytes``), where one matrix [rows,
widest] would hold HAN's DBLP's 334-float author rows at 4231 floats.  The relational models' input
projection (nn/hetero_models.py) reads each block through its type's Linear, so the rows are never
widened; a reader that needs the padded matrix (a homogeneous model on such a set, the content digest,
a sampled batch's rows) asks for it (``padded``) of the rows it reads.

The blocks are NumPy arrays on the host (a rank's slice, a sampler's server rows) and torch tensors once
``to`` has put them on a device (a view's rows).  A set of one width keeps its plain [rows, F] matrix.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .hetero import GraphTypes


class TypedRows:
    """Rows at their own type's width: ``blocks[t]`` [rows of type t, widths[t]] in row order and
    ``row_type`` [rows] (NumPy, or torch after ``to``); ``width``: the widest type's, the width the
    padded matrix and the manifest's num_features have."""

    dtype = np.dtype(np.float32)

    def __init__(self, blocks: Sequence[Any], row_type: Any, width: int):
        self.blocks: Tuple[Any, ...] = tuple(blocks)
        self.row_type, self.width = row_type, int(width)
        self._rank: Optional[np.ndarray] = None  # rank_in_type, computed once (a sampler takes rows per batch)

    # ---- construction (host) ------------------------------------------------------------------
    @classmethod
    def from_flat(cls, flat: np.ndarray, types: GraphTypes, global_id: np.ndarray, width: int) -> "TypedRows":
        """The rows with these global ids from their flat entries (shards/typed_rows.py: each row at its
        own width, in row order)."""
        row_type = np.asarray(types.vertex_type(np.asarray(global_id, dtype=np.int64)), dtype=np.int64)
        widths = np.asarray(types.widths, dtype=np.int64)
        flat = np.asarray(flat, dtype=np.float32)
        if flat.shape != (int(widths[row_type].sum()),):
            raise ValueError(f"flat feature rows: {flat.shape[0] if flat.ndim == 1 else flat.shape} entries for "
                             f"rows whose widths sum to {int(widths[row_type].sum())}")
        # A type's entries are where its rows' are (one byte per entry for the mask, not an index array).
        blocks = []
        for t, w in enumerate(widths.tolist()):
            mine = row_type == t
            blocks.append(flat[np.repeat(mine, widths[row_type])].reshape(int(np.count_nonzero(mine)), w))
        return cls(blocks, row_type, width)

    @classmethod
    def from_padded(cls, rows: np.ndarray, types: GraphTypes, global_id: np.ndarray) -> "TypedRows":
        """The rows of a zero-padded matrix [n, widest] (each row's features first) at their own widths."""
        rows = np.asarray(rows, dtype=np.float32)
        row_type = np.asarray(types.vertex_type(np.asarray(global_id, dtype=np.int64)), dtype=np.int64)
        blocks = [np.ascontiguousarray(rows[row_type == t, :w]) for t, w in enumerate(types.widths)]
        return cls(blocks, row_type, rows.shape[1])

    # ---- what every holder reads ----------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, int]:
        """(rows, the widest width): the padded matrix's shape, what the manifest's num_features says."""
        return int(self.row_type.shape[0]), self.width

    @property
    def widths(self) -> Tuple[int, ...]:
        return tuple(int(b.shape[1]) for b in self.blocks)

    @property
    def nbytes(self) -> int:
        """Bytes of the feature rows held: each row's own width x 4."""
        return int(sum(int(b.shape[0]) * int(b.shape[1]) * 4 for b in self.blocks))

    def __len__(self) -> int:
        return int(self.row_type.shape[0])

    def counts_before(self, n: int) -> list:
        """Rows of each type among the first n."""
        head = self.row_type[:n]
        return [int((head == t).sum()) for t in range(len(self.blocks))]

    def __getitem__(self, rows: slice) -> "TypedRows":
        """Rows a..b-1 (a slice of step 1): views of the blocks, nothing copied."""
        if not isinstance(rows, slice):
            raise TypeError("TypedRows takes contiguous row slices; use take() for other rows")
        a, b, step = rows.indices(len(self))
        if step != 1:
            raise IndexError("TypedRows takes contiguous row slices")
        b = max(a, b)
        lo, hi = self.counts_before(a), self.counts_before(b)
        return TypedRows([blk[i:j] for blk, i, j in zip(self.blocks, lo, hi)], self.row_type[a:b], self.width)

    def take(self, idx) -> "TypedRows":
        """The rows at positions idx (host form; any order), copied at their own widths."""
        idx = np.asarray(idx, dtype=np.int64)
        rank = self.rank_in_type()
        kind = self.row_type[idx]
        blocks = [blk[rank[idx[kind == t]]] for t, blk in enumerate(self.blocks)]
        return TypedRows(blocks, kind, self.width)

    def rank_in_type(self) -> np.ndarray:
        """int64 [rows]: each row's position in its type's block (host form; computed on the first call)."""
        if self._rank is not None:
            return self._rank
        row_type = np.asarray(self.row_type)
        order = np.argsort(row_type, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(row_type, minlength=len(self.blocks)))])
        rank = np.empty(row_type.shape[0], dtype=np.int64)
        rank[order] = np.arange(row_type.shape[0], dtype=np.int64) - starts[row_type[order]]
        self._rank = rank
        return rank

    def padded(self) -> np.ndarray:
        """float32 [rows, width]: the zero-padded matrix of these rows (host form).  Its callers read it
        for a bounded set of rows, or where a model reads the padded rows themselves."""
        out = np.zeros(self.shape, dtype=np.float32)
        for t, blk in enumerate(self.blocks):
            out[np.asarray(self.row_type) == t, : blk.shape[1]] = np.asarray(blk)
        return out

    def all_finite(self) -> bool:
        return all(bool(np.all(np.isfinite(np.asarray(b)))) for b in self.blocks)

    def finite_rows(self) -> np.ndarray:
        """bool [rows]: whether each row's features are all finite (host form)."""
        ok = np.ones(len(self), dtype=bool)
        for t, blk in enumerate(self.blocks):
            ok[np.asarray(self.row_type) == t] = np.isfinite(np.asarray(blk)).all(axis=1)
        return ok

    def padded_tensor(self, device):
        """The zero-padded matrix as a torch tensor on `device` (host form)."""
        import torch

        return torch.as_tensor(self.padded(), device=device)

    def to(self, device) -> "TypedRows":
        """The rows as torch tensors on `device` (a view's rows; the model's input projection reads them)."""
        import torch  # the host form (shards, samplers) does not need torch

        return TypedRows([torch.as_tensor(np.ascontiguousarray(b), device=device) for b in self.blocks],
                         torch.as_tensor(np.asarray(self.row_type, dtype=np.int64), device=device), self.width)
