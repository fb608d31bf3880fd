"""Row-block layouts of exchange buffers (pure NumPy, no MPI).

An exchange buffer holds blocks of rows, one block per peer, in peer order: block p has
counts[p] rows and starts at offsets[p] = counts[0] + ... + counts[p-1].
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from .errors import ClusterError

# MPI counts are C ints; we count rows (with a row-sized datatype), so this bounds rows, not bytes.
MAX_MPI_COUNT = 2**31 - 1

# Point-to-point messages between servers (the world exchange's blocks, the 2-server leaders' gradient
# buckets) travel in messages of at most this many bytes, under the eager limit of Open MPI's TCP transport
# (64 KiB with its header), so that neither direction waits for a rendezvous handshake.  One message larger
# than the limit is a rendezvous: the sender waits for the receiver's clear-to-send, which, on the one TCP
# connection between the two ranks, queues behind the receiver's own outgoing message whenever that one
# was cleared first -- the two directions then run one after the other, and the later rank waits twice
# the wire time (docs/concepts.md).  Pieces of one block share its tag and match in posting order.
# GRANNDIS_MESSAGE_PIECE_BYTES sets another size (0: one message a block), for fabrics whose rendezvous
# does not queue behind data (RDMA), where fewer, larger messages cost less.
MESSAGE_PIECE_BYTES = 32768


def piece_bytes_setting(text: str) -> int:
    """GRANNDIS_MESSAGE_PIECE_BYTES's value: MESSAGE_PIECE_BYTES where unset or empty, else a whole number
    of bytes >= 0 (0: one message a block), or a ValueError saying what to give."""
    if not text.strip():
        return MESSAGE_PIECE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"GRANNDIS_MESSAGE_PIECE_BYTES={text!r}: give a whole number of bytes >= 0 "
                         f"(0: one message a block; default {MESSAGE_PIECE_BYTES})")
    return value


def message_pieces(count: int, item_bytes: int, piece_bytes: int = MESSAGE_PIECE_BYTES) -> List[Tuple[int, int]]:
    """[start, end) item ranges of the messages one block of `count` items of `item_bytes` bytes travels
    in: at most `piece_bytes` each (one item where an item is larger; where it is 0, the whole block, cut
    only where its count would pass MPI's int count, MAX_MPI_COUNT items); at least one, maybe empty."""
    step = MAX_MPI_COUNT if piece_bytes == 0 else max(1, min(MAX_MPI_COUNT, piece_bytes // item_bytes))
    return [(a, min(a + step, count)) for a in range(0, max(count, 1), step)]


def check_counts(counts: Sequence[int], peers: int, name: str) -> np.ndarray:
    """Counts as an int64 array of length `peers`, non-negative, or a ClusterError saying what is wrong."""
    try:
        arr = np.asarray(counts)
    except Exception as exc:  # noqa: BLE001
        raise ClusterError(f"{name} must be a sequence of {peers} non-negative integers: {exc}") from None
    if arr.ndim != 1 or arr.shape[0] != peers:
        raise ClusterError(f"{name} must have one entry per peer ({peers}), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ClusterError(f"{name} must hold integers, got {arr.tolist()}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ClusterError(f"{name} must be non-negative, got {arr.tolist()}")
    if arr.sum() > MAX_MPI_COUNT:
        raise ClusterError(f"{name} adds up to {int(arr.sum())} rows, more than one exchange can carry "
                           f"({MAX_MPI_COUNT}); split the exchange")
    return arr


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sum: where each peer's block starts."""
    out = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def block_rows(offsets: np.ndarray, counts: np.ndarray, peers: np.ndarray):
    """Rows of the blocks of `peers` (in that order), as a slice when they are adjacent in the
    buffer (the common case: a server's ranks are consecutive) and as an index array otherwise."""
    peers = np.asarray(peers, dtype=np.int64)
    if peers.size == 0:
        return slice(0, 0)
    starts, lens = offsets[peers], counts[peers]
    ends = starts + lens
    nonempty = lens > 0
    if not nonempty.any():
        return slice(0, 0)
    s, e = starts[nonempty], ends[nonempty]
    if np.all(s[1:] == e[:-1]):
        return slice(int(s[0]), int(e[-1]))
    # Concatenated aranges without a Python loop: position k of block b maps to starts[b] + k.
    total = int(lens.sum())
    block_start_in_out = offsets_of(lens)
    return np.repeat(starts - block_start_in_out, lens) + np.arange(total, dtype=np.int64)


def plan_buckets(nbytes: Sequence[int], dtypes: Sequence, bucket_bytes: int) -> list[list[int]]:
    """Indices of tensors per bucket: consecutive tensors of one dtype while they fit in bucket_bytes.

    The order depends only on the sizes and dtypes, which are the same on every rank.
    """
    buckets: list[list[int]] = []
    open_of: dict = {}          # dtype -> (bucket index, bytes so far)
    for i, (n, dt) in enumerate(zip(nbytes, dtypes)):
        current = open_of.get(dt)
        if current is not None and current[1] + n <= bucket_bytes:
            buckets[current[0]].append(i)
            open_of[dt] = (current[0], current[1] + n)
        else:
            buckets.append([i])
            open_of[dt] = (len(buckets) - 1, n)
    return buckets


# Buckets per backward, as a byte target: total gradient bytes / OVERLAP_BUCKETS, cut at layer
# boundaries (plan_layer_buckets).  Why a count and not DDP's fixed 25 MB (or a 1 MiB cap): our models
# hold 0.1-1 MB of parameters, so any fixed cap above that is one bucket, final only when the backward
# ends, and nothing overlaps (a 2-layer model's gradient is one 92 KB bucket).  The last bucket (layer
# 0's) is final only at the end of the backward, so about 1/OVERLAP_BUCKETS of the gradient's wire time
# stays exposed, or layer 0's share where that is larger (memory_model/epoch_time.py prices it); each
# bucket costs a few messages' latency (a send to the leader, the leaders' pair, a broadcast) and a
# blocking broadcast in finish(), so the count is bounded (at most 2 * OVERLAP_BUCKETS + 1) instead of
# one bucket per layer of a 56-layer model.
OVERLAP_BUCKETS = 8


def plan_layer_buckets(nbytes: Sequence[int], dtypes: Sequence, units: Sequence, target_bytes: int) -> list[list[int]]:
    """Indices of tensors per gradient bucket, for tensors listed in the order the backward makes them
    final (the last layer's first): consecutive tensors of one dtype, a bucket closed only where the
    unit (the layer, `units[i]`) changes, and there when the next unit would take it past
    `target_bytes`.  So the first bucket is the last layer's own (final as soon as that layer's backward
    is done) unless it is tiny, a layer is never split (its gradients become final together: a split buys
    no earlier post), and two consecutive buckets always hold more than `target_bytes`, which bounds the
    count by 2 * total / target_bytes + 1.  A dtype change closes a bucket (one dtype per bucket).

    The layout depends only on the sizes, dtypes and units, which are the same on every rank.
    """
    if target_bytes <= 0:
        raise ClusterError(f"target_bytes must be positive, got {target_bytes}")
    if not len(nbytes) == len(dtypes) == len(units):
        raise ClusterError(f"plan_layer_buckets: {len(nbytes)} sizes, {len(dtypes)} dtypes, {len(units)} units")
    # The bytes of each run of one unit that starts at i (what the unit would add to the open bucket).
    unit_bytes: Dict[int, int] = {}
    for i in range(len(nbytes) - 1, -1, -1):
        same = i + 1 < len(nbytes) and units[i + 1] == units[i] and dtypes[i + 1] == dtypes[i]
        unit_bytes[i] = int(nbytes[i]) + (unit_bytes[i + 1] if same else 0)
    buckets: list[list[int]] = []
    held = 0
    for i, (n, dt) in enumerate(zip(nbytes, dtypes)):
        new_unit = i == 0 or units[i] != units[i - 1]
        if i == 0 or dt != dtypes[i - 1] or (new_unit and held + unit_bytes[i] > target_bytes):
            buckets.append([])
            held = 0
        buckets[-1].append(i)
        held += int(n)
    return buckets
