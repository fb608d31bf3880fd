"""Agreement of a view's peers before its first exchanges: every peer planned, and all send rows of one
width and dtype (an exchange sizes its rows from local data, so a peer with other rows would corrupt
memory or hang it)."""
from __future__ import annotations

import numpy as np
import torch

from granndis_hpc.graph import planner

_DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.float16): 3}


def row_signature(features) -> int:
    """One integer for the width and dtype of a view's static rows (what its exchanges send)."""
    # A tensor, an array, or rows at their own widths (TypedRows: the widest width, float32)
    a = features if isinstance(features, torch.Tensor) or hasattr(features, "dtype") else np.asarray(features)
    dtype = np.dtype(str(a.dtype).replace("torch.", ""))
    width = int(a.shape[1]) if len(a.shape) == 2 else -1
    return width * 16 + _DTYPE_CODES.get(dtype, 15)


def agree_with_peers(alltoall_counts, num_peers: int, signature: int, problem, features) -> None:
    """Collective over the view's peers (one all-to-all of one integer): raise PlanError on every peer
    when any peer failed to plan (`problem`) or holds rows of another width or dtype."""
    mine = -1 if problem is not None else signature
    theirs = np.asarray(alltoall_counts([mine] * num_peers), dtype=np.int64)
    if problem is not None:
        raise problem
    failed = np.flatnonzero(theirs == -1)
    if failed.size:
        raise planner.PlanError(f"peer(s) {failed.tolist()} of this view could not plan their rows (their "
                                f"shard is inconsistent: see their message); run `granndis preprocess verify`")
    other = np.flatnonzero(theirs != signature)
    if other.size:
        shape = tuple(features.shape if hasattr(features, "shape") else np.shape(features))
        raise planner.PlanError(
            f"this rank's rows are {shape[1:] or shape} of {getattr(features, 'dtype', '?')} but peer(s) "
            f"{other.tolist()} of the view hold rows of another width or dtype: the exchange cannot agree on a "
            f"row size; the shard set's server files disagree: run `granndis preprocess verify` and rebuild it")
