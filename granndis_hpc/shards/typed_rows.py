"""Feature rows of a heterogeneous set whose vertex types have different widths (graph/hetero.py ``widths``).

A rank's slice and a sampler's server rows hold them at their own widths too (graph/typed_features.py
``TypedRows``, built from the flat entries read here); the canonical graph of a build and the readers of a
file's rows in blocks (verify, the content pass) see them as one float32 matrix [rows, widest width], a
row's features first, zeros after them.  In a server file the ``features`` dataset is flat: float32 [sum of
the rows' widths], each row at its own type's width, in row order, so nothing is stored for the padding.
Row i of a file starts at the sum of the widths of rows 0..i-1, which its global ids give (a row's type is a
binary search of its id), so a rank's contiguous rows are one contiguous range of the flat dataset.  A set
of one width keeps its [rows, F] dataset; `widths_of` tells the two apart from the manifest.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from granndis_hpc.graph.hetero import GraphTypes, types_of

# h5py chunks of the flat dataset: about schema.FEATURE_CHUNK_BYTES, in float32 entries.
FLAT_CHUNK_ENTRIES = (1 << 20) // 4


def widths_of(manifest: dict) -> Optional[GraphTypes]:
    """The set's types where its vertex types' widths differ (flat features), None otherwise."""
    types = types_of(manifest.get("dataset", {}))
    return types if types is not None and types.typed_widths else None


def row_widths(types: GraphTypes, global_id) -> np.ndarray:
    """int64 width of each row, by its global id."""
    return types.row_widths(global_id)


def flat_offsets(widths: np.ndarray) -> np.ndarray:
    """int64 [rows + 1]: where each row starts in the flat dataset (the last entry: its length)."""
    out = np.zeros(widths.shape[0] + 1, dtype=np.int64)
    np.cumsum(widths, out=out[1:])
    return out


def _mask(widths: np.ndarray, width: int) -> np.ndarray:
    """bool [rows, width]: the columns each row holds (its first widths[i]); row-major order of its True
    entries is the flat order."""
    return np.arange(int(width), dtype=np.int64)[None, :] < widths[:, None]


def pack(rows: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """float32 flat: each row of `rows` [n, W] at its own width, in row order."""
    rows = np.asarray(rows, dtype=np.float32)
    return np.ascontiguousarray(rows[_mask(widths, rows.shape[1])])


def unpack(flat: np.ndarray, widths: np.ndarray, width: int) -> np.ndarray:
    """float32 [n, width] from the flat entries of rows of the given widths (zeros after each row's)."""
    out = np.zeros((widths.shape[0], int(width)), dtype=np.float32)
    out[_mask(widths, width)] = np.asarray(flat, dtype=np.float32)
    return out


def flat_length(types: GraphTypes, global_id) -> int:
    """Entries of the flat dataset of the rows with these global ids."""
    return int(row_widths(types, global_id).sum())


def read_scattered(dset, types: GraphTypes, server_global_id: np.ndarray, sorted_rows: np.ndarray,
                   width: int) -> np.ndarray:
    """Rows [len(sorted_rows), width] of a flat dataset at the given increasing file rows: the span from
    the first to the last is read in one slice and the rows are taken from it."""
    if sorted_rows.size == 0:
        return np.zeros((0, int(width)), dtype=np.float32)
    offsets = flat_offsets(row_widths(types, server_global_id))
    lo, hi = int(offsets[sorted_rows[0]]), int(offsets[sorted_rows[-1] + 1])
    span = dset[lo:hi]
    widths = offsets[sorted_rows + 1] - offsets[sorted_rows]
    starts = offsets[sorted_rows] - lo
    # Every entry of the rows: its row's start plus its column (no loop over rows).
    within = np.arange(int(widths.sum()), dtype=np.int64) - np.repeat(flat_offsets(widths)[:-1], widths)
    return unpack(span[np.repeat(starts, widths) + within], widths, width)


class FlatRows:
    """A flat features dataset seen as the [rows, width] matrix of its rows (zero-padded): ``shape``,
    ``dtype`` and row slices ``[a:b]``, what readers that take a file's features a block of rows at a time
    use (verify, the content pass)."""

    def __init__(self, dset, types: GraphTypes, global_id: np.ndarray, width: int):
        self.dset, self.width = dset, int(width)
        self.widths = row_widths(types, global_id)
        self.offsets = flat_offsets(self.widths)
        self.shape = (int(self.widths.shape[0]), self.width)
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("FlatRows takes contiguous row slices")
        b = max(a, b)
        return unpack(self.dset[int(self.offsets[a]):int(self.offsets[b])], self.widths[a:b], self.width)


def feature_rows(f, manifest: dict):
    """An open server file's features as rows: the dataset itself, or a FlatRows over a flat one."""
    types = widths_of(manifest)
    if types is None:
        return f["features"]
    return FlatRows(f["features"], types, f["vertices/global_id"][:], int(manifest["dataset"]["num_features"]))
