"""Which chunk files hold a global row range: shared by our chunked format (preprocess/formats/chunked.py) and
DistDGL's (preprocess/formats/distdgl.py), which both list a field as consecutive chunks with row offsets."""
from __future__ import annotations

import numpy as np


def chunk_pieces(offsets: np.ndarray, files: list, lo: int, hi: int):
    """(file, memmap, start, end) of every chunk overlapping the global range lo..hi-1 (chunk c holds
    offsets[c]..offsets[c+1]-1)."""
    first = max(int(np.searchsorted(offsets, lo, side="right")) - 1, 0)
    for c in range(first, len(files)):
        a, b = int(offsets[c]), int(offsets[c + 1])
        if a >= hi:
            break
        if min(hi, b) > max(lo, a):
            yield files[c][0], files[c][1], max(lo, a) - a, min(hi, b) - a
