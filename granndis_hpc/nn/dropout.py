"""Counter-based dropout: the mask of an element is a function of (seed, epoch, layer, vertex id, column).

docs/design.md §6: results must not depend on S x G where the method is exact, dropout included.  A per-rank
generator draws a rank's masks from a stream whose position depends on how many rows the rank holds,
so fb, flx and the same run on another cluster shape follow different trajectories.  Here a mask
element is a hash of its counters instead (splitmix64's finaliser over a Weyl sequence, in torch int64
ops so it runs vectorised on any device; each 64-bit hash decides four elements by its 16-bit lanes): any rank draws
the owner's mask for a row it holds, a
single process on the whole graph draws the same masks, and activation checkpointing recomputes the
same masks by construction.

    drop = RowDropout(seed, epoch, row_ids)   # row_ids: global ids of the rows (None: 0..n-1)
    h = drop(layer, h, p)                     # keep-rate 1 - p, kept values scaled by 1 / (1 - p)
    x_src = drop.sources(x_src, p)            # input dropout: layer 0's source rows, halo rows included

Input dropout (--input-dropout) drops the raw features, key layer 0 (the hidden dropouts are keyed by
the conv they feed, l >= 1, so 0 is free).  A rank applies it to the static features of its own rows
*and* of its cached layer-0 halo rows, drawing each halo row's mask from the row's global id: that is
the mask its owner would have drawn and sent, so the cached halo stays valid and nothing is exchanged.

No MPI and no files here (nn knows neither).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import cpu_kernels

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / phi: splitmix64's increment
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _signed(v: int) -> int:
    """A 64-bit pattern as the int64 torch stores (torch arithmetic wraps modulo 2^64)."""
    v &= _M64
    return v - (1 << 64) if v >> 63 else v


def _mix_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (exact 64-bit arithmetic)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * _MUL1) & _M64
    z = ((z ^ (z >> 27)) * _MUL2) & _M64
    return z ^ (z >> 31)


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic: mask off the copied sign bits; in place on
    the shift's result, so one temporary the size of z)."""
    return (z >> s).bitwise_and_((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, elementwise on int64 (multiplication wraps like uint64's)."""
    z = (z ^ _srl(z, 30)) * _signed(_MUL1)
    z = (z ^ _srl(z, 27)) * _signed(_MUL2)
    return z ^ _srl(z, 31)


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """The int64 key of one (seed, epoch, layer): nested hashing, so nearby counters give unrelated keys."""
    k = _mix_int(int(seed) * _GOLDEN + 1)
    k = _mix_int(k ^ (int(epoch) * _GOLDEN + 2))
    k = _mix_int(k ^ (int(layer) * _GOLDEN + 3))
    return _signed(k)


def keep_mask(seed: int, epoch: int, layer: int, row_ids: torch.Tensor, width: int, p: float,
              block_elements: Optional[int] = None) -> torch.Tensor:
    """Bool [len(row_ids), width]: element (i, c) is kept with probability 1 - p, as a function of
    (seed, epoch, layer, row_ids[i], c) only.

    Each row gets a hashed start (row id and key); its 64-bit word j is step j + 1 of a splitmix64
    stream from that start (the full finaliser), and its four 16-bit lanes decide columns 4j..4j+3:
    column c is kept iff lane c % 4 of word c // 4, read as a signed int16, is at least
    round(p * 2^16) - 2^15.  So one hash serves four elements (about three int64 passes an element
    instead of ten), the comparison is one int16 pass into the bool mask, and the keep rate is 1 - p
    rounded to a multiple of 2^-16.  The lanes are the int16 view of the words (little-endian, as on
    every platform torch runs on): lane k is bits 16k..16k+15.  block_elements: the elements hashed
    at a time (default mask_block_elements(device)); the mask does not depend on it."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"keep_mask: p must be in [0, 1), got {p!r}")
    ids = row_ids.to(torch.int64)
    if ids.dim() != 1:
        raise ValueError(f"keep_mask: row_ids must be 1-D, got shape {tuple(ids.shape)}")
    out = torch.empty((ids.shape[0], width), dtype=torch.bool, device=ids.device)
    threshold = _threshold(p)
    if threshold > _I16_MAX:  # p within 2^-17 of 1: no lane reaches the threshold
        return out.fill_(False)
    row_start = _row_starts(seed, epoch, layer, ids)
    words = -(-int(width) // LANES)
    steps = torch.arange(1, words + 1, dtype=torch.int64, device=ids.device) * _signed(_GOLDEN)
    # Blocks of rows, so that the int64 words (2 bytes a mask element, and as much again for the shift's
    # temporary) exist for at most mask_block_elements(device) elements at a time beside the bool mask.
    # Each block is the same 16 tensor operations, so the operations a call launches grow with the
    # number of blocks only: one block up to DEVICE_MASK_BLOCK_ELEMENTS on a GPU.
    block = mask_block_elements(ids.device) if block_elements is None else int(block_elements)
    step = max(1, block // (words * LANES))
    for a in range(0, ids.shape[0], step):  # a few blocks per layer, not a loop over rows
        z = _mix_(row_start[a:a + step].unsqueeze(1) + steps.unsqueeze(0))
        torch.ge(z.view(torch.int16)[:, :width], threshold, out=out[a:a + step])
    return out


# On the CPU, 2^16 elements (2^14 words, 128 KiB): a 100 k x 64 mask in 12-18 ms on one thread, against
# 43-47 ms for the former one-hash-per-element mask; smaller blocks cost more calls (28 ms at 2^14
# elements), larger ones leave the L2 cache (17 ms at 2^18).  (The CPU trainer hashes in the C kernel,
# nn/cpu_kernels.c; this is its torch-ops path.)
MASK_BLOCK_ELEMENTS = 1 << 16
# On a GPU every operation is a kernel launch (~5-10 us each) and the cache argument does not hold: one
# block up to 2^25 elements (a 100 k x 256 activation in 16 launches, not 7,800), at most 128 MiB of
# transient int64 words and shift temporaries; a larger tensor in blocks of that size.
DEVICE_MASK_BLOCK_ELEMENTS = 1 << 25
LANES = 4  # keep decisions per 64-bit hash: 16 bits each
_I16_MAX = (1 << 15) - 1


def mask_block_elements(device) -> int:
    """The mask elements keep_mask hashes in one block on `device` (see MASK_BLOCK_ELEMENTS)."""
    return MASK_BLOCK_ELEMENTS if torch.device(device).type == "cpu" else DEVICE_MASK_BLOCK_ELEMENTS


def _threshold(p: float) -> int:
    """The signed 16-bit lane value from which an element is kept: P(lane >= t) = 1 - round(p 2^16) / 2^16."""
    return int(round(p * 65536.0)) - (1 << 15)


def _row_starts(seed: int, epoch: int, layer: int, ids: torch.Tensor) -> torch.Tensor:
    return _mix(ids * _signed(_GOLDEN) + stream_key(seed, epoch, layer))


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser in place on z (every bit of the result is used: four 16-bit lanes)."""
    z ^= _srl(z, 30)
    z *= _signed(_MUL1)
    z ^= _srl(z, 27)
    z *= _signed(_MUL2)
    z ^= _srl(z, 31)
    return z


def keep_elements(seed: int, epoch: int, layer: int, row_ids: torch.Tensor, rows: torch.Tensor,
                  cols: torch.Tensor, p: float) -> torch.Tensor:
    """keep_mask(seed, epoch, layer, row_ids, width, p)[rows, cols] for index vectors rows, cols,
    computed only at those elements (the nonzeros of sparse input features)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"keep_elements: p must be in [0, 1), got {p!r}")
    row_start = _row_starts(seed, epoch, layer, row_ids.to(torch.int64))
    cols = cols.to(torch.int64)
    z = _mix_(row_start[rows] + (cols // LANES + 1) * _signed(_GOLDEN))
    # The lane's 16 bits with the sign bit flipped: unsigned order of that is the signed int16 order.
    lane = ((z >> (16 * (cols % LANES))) & 0xFFFF) ^ 0x8000
    return lane >= _threshold(p) + (1 << 15)


def apply_mask(h: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """h * keep / (1 - p), saving what torch's own dropout saves for backward on that device (a float
    mask on CPU, a bool mask on CUDA), so the memory model's activation formula still holds."""
    scale = 1.0 / (1.0 - p)
    if h.device.type == "cuda":
        return torch.where(keep, h * scale, h.new_zeros(()))
    # uint8 -> float converts vectorised (bool -> float does not: 4x slower), scaled in place.
    return h * keep.view(torch.uint8).to(h.dtype).mul_(scale)


class _KeyedDropoutCPU(torch.autograd.Function):
    """apply_mask(h, keep_mask(...), p) by the C kernel (nn/cpu_kernels.c): the mask hashed and applied
    in one pass; the same float mask saved for the backward, the same values."""

    @staticmethod
    def forward(ctx, h, row_start, p):
        y, m = cpu_kernels.dropout(h, row_start, _threshold(p), 1.0 / (1.0 - p))
        ctx.save_for_backward(m)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (m,) = ctx.saved_tensors
        return grad_y * m, None, None


def drop_rows(seed: int, epoch: int, layer: int, row_ids: torch.Tensor, h: torch.Tensor, p: float) -> torch.Tensor:
    """apply_mask(h, keep_mask(seed, epoch, layer, row_ids, h.shape[1], p), p): on the CPU by the C kernel."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p!r}")
    ids = row_ids.to(torch.int64)
    if ids.dim() == 1 and ids.shape[0] == h.shape[0] and cpu_kernels.dropout_applies(h):
        return _KeyedDropoutCPU.apply(h, _row_starts(seed, epoch, layer, ids), p)
    return apply_mask(h, keep_mask(seed, epoch, layer, ids, h.shape[1], p), p)


# Below this fraction of nonzeros, input dropout hashes only the nonzero elements (a dropped zero is
# zero): Cora's bag-of-words rows are 1.3 % nonzero, and hashing all 1433 columns of every layer-0
# source row cost 20x the first layer's matmul (measured, 1500 x 1433 rows).  Above it, the index
# arrays (16 bytes per nonzero) would cost more memory than the dense mask.
SPARSE_INPUT_DENSITY = 0.25


def drop_sparse_rows(seed: int, epoch: int, layer: int, row_ids: torch.Tensor, h: torch.Tensor,
                     p: float) -> torch.Tensor:
    """Dropout of h's rows (global ids row_ids) equal to apply_mask(h, keep_mask(...), p), hashing only
    h's nonzero elements when h is sparse enough (input features)."""
    n, width = h.shape
    # Count first: on dense features (products' 100 floats a row) the index arrays of torch.nonzero
    # would be 16 bytes per element, built every step only to be dropped for the dense mask (measured:
    # the largest single op of an inductive flx step, whose layer 0 reads 2x fb's source rows).
    if int(torch.count_nonzero(h)) > SPARSE_INPUT_DENSITY * h.numel():
        return drop_rows(seed, epoch, layer, row_ids[:n], h, p)
    rows, cols = torch.nonzero(h, as_tuple=True)
    keep = keep_elements(seed, epoch, layer, row_ids[:n], rows, cols, p)
    return h.index_put((rows, cols), h[rows, cols] * (keep.to(h.dtype) * (1.0 / (1.0 - p))))


RowIds = Union[None, torch.Tensor, Sequence[Optional[torch.Tensor]]]


class RowDropout:
    """The dropout of one forward pass: `drop(layer, h, p)` drops the rows of h, which are the first
    h.shape[0] rows whose global ids `row_ids` gives.

    row_ids: None (the rows are vertices 0..n-1: a single process on the whole graph), one tensor (the
    global ids of a rank's own rows, of which every layer's rows are a prefix), or one tensor per layer
    of a plan (layer l's own rows; a layer past the last, such as a head after the last conv, uses the
    last layer's).  The key is (seed, epoch, layer): the same on every rank, different every epoch.
    source_ids: global ids of layer 0's source rows (own rows, then halo rows) for `sources`; None: the
    rows are vertices 0..n-1 (single process) or, when row_ids is given, the own rows only."""

    INPUT_LAYER = 0  # the key of input dropout (hidden dropouts use the conv they feed, l >= 1)

    def __init__(self, seed: int, epoch: int, row_ids: RowIds = None, source_ids: Optional[torch.Tensor] = None):
        self.seed, self.epoch, self.source_ids = int(seed), int(epoch), source_ids
        # One form inside: a tuple per layer (one tensor is every layer's; the engine's views hand the
        # tuple, View.layer_row_ids / LayeredView.layer_row_ids).
        self.layer_ids = (None,) if row_ids is None else (row_ids,) if isinstance(row_ids, torch.Tensor) \
            else tuple(row_ids)
        if not self.layer_ids:
            raise ValueError("RowDropout: row_ids is an empty sequence; pass None, one tensor or one per layer")

    def ids(self, layer: int, n: int, device) -> torch.Tensor:
        ids = self.layer_ids[min(layer, len(self.layer_ids) - 1)]
        if ids is None:
            return torch.arange(n, device=device)
        if ids.shape[0] < n:
            raise ValueError(f"RowDropout layer {layer}: {n} rows but only {ids.shape[0]} row ids; the rows "
                             "must be a prefix of the rows the ids name")
        return ids[:n].to(device)

    def __call__(self, layer: int, h: torch.Tensor, p: float) -> torch.Tensor:
        if p == 0.0:
            return h
        return drop_rows(self.seed, self.epoch, layer, self.ids(layer, h.shape[0], h.device), h, p)

    def at(self, layer: int, h: torch.Tensor, p: float, rows: torch.Tensor) -> torch.Tensor:
        """Dropout of h, whose rows are the rows ``rows`` (indices into the layer's rows) of what
        ``__call__`` drops: the same masks, drawn for those rows only (boundary-first pipelining drops
        the rows the next exchange sends before the others)."""
        if p == 0.0:
            return h
        ids = self.layer_ids[min(layer, len(self.layer_ids) - 1)]
        ids = rows.to(h.device) if ids is None else ids.to(h.device).index_select(0, rows.to(ids.device))
        return drop_rows(self.seed, self.epoch, layer, ids, h, p)

    def sources(self, h_src: torch.Tensor, p: float) -> torch.Tensor:
        """Input dropout of layer 0's source rows h_src (own rows, then halo rows), key layer 0."""
        if p == 0.0:
            return h_src
        if self.source_ids is None:  # own rows only (single process: all rows)
            return drop_sparse_rows(self.seed, self.epoch, self.INPUT_LAYER,
                                    self.ids(self.INPUT_LAYER, h_src.shape[0], h_src.device), h_src, p)
        ids = self.source_ids
        if ids.shape[0] != h_src.shape[0]:
            raise ValueError(f"RowDropout.sources: {h_src.shape[0]} source rows but {ids.shape[0]} source ids; "
                             "pass the ids of layer 0's own rows followed by its halo rows")
        return drop_sparse_rows(self.seed, self.epoch, self.INPUT_LAYER, ids.to(h_src.device), h_src, p)
