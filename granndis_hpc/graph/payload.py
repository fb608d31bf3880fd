"""Where a run may send partial aggregates instead of halo rows (--halo-payload), and which server pairs
and layers do: the refusals and the per-server-pair choice, shared by the engine (engine/partial.py, which
plans and runs the exchange) and the memory model (memory_model/payload.py, which predicts its bytes for
--mode auto and `preprocess plan`), so that both decide alike.  Pure NumPy; `problem` reads only each
layer's class name and its ``weighted_sum`` (nn/contract.py Layer).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

__all__ = ["FLOAT32", "PAYLOAD_MODES", "choose", "pair_bytes", "problem", "world_problem"]
FLOAT32 = 4
PAYLOAD_MODES = ("fb", "flx")  # the modes whose world view exchanges rows between servers every step


def world_problem(payload: str, mode: str, world_layers: Optional[Sequence[bool]] = None) -> Optional[str]:
    """What refuses --halo-payload `payload` for `mode` whatever the model (None: nothing): the modes and
    depths that exchange no rows between servers.  world_layers: per layer, whether training runs it on
    the world view (flx: the layers after the k preloaded ones)."""
    if payload == "rows":
        return None
    fix = "or use --halo-payload rows"
    if mode not in PAYLOAD_MODES:
        return (f"--halo-payload {payload} is implemented for --mode fb and for flx with --preloaded-layers "
                f"below --layers (got --mode {mode}); {fix}")
    if mode == "flx" and world_layers is not None and not any(world_layers):
        return (f"--halo-payload {payload} with --mode flx changes the layers after the k preloaded ones, "
                f"which exchange rows between servers; this run preloads every layer (k = --layers): use "
                f"--preloaded-layers below --layers, {fix}")
    return None


def problem(payload: str, mode: str, row_dtype, input_dropout: float, convs,
            world_layers: Optional[Sequence[bool]] = None) -> Optional[str]:
    """What refuses --halo-payload `payload` in this run (None: nothing); the message says how to fix it.
    world_layers: as `world_problem`.  Attention layers (GAT, and so attention dropout) are not weighted
    sums: refused with the layers."""
    if payload == "rows":
        return None
    why = world_problem(payload, mode, world_layers)
    if why:
        return why
    fix = "or use --halo-payload rows"
    if row_dtype is not None:
        return f"--halo-payload {payload} needs float32 layers (--precision fp32), {fix}"
    if input_dropout > 0:
        return f"--halo-payload {payload} does not support --input-dropout (it drops halo rows), {fix}"
    bad = sorted({type(c).__name__ for c in convs if c.weighted_sum is None})
    if bad or not convs:
        return (f"--halo-payload {payload} needs layers whose aggregation is a weighted sum (sage, gcn, gin, "
                f"sage-sum, rgcn); this model's {', '.join(bad)} is not; {fix}")
    return None


def choose(payload: str, rows: np.ndarray, partials: np.ndarray, peer_server: Sequence[int],
           in_widths: Sequence[int], message_widths: Sequence[int], static: Sequence[bool],
           rows_once: Optional[np.ndarray] = None) -> List[np.ndarray]:
    """Per layer, [sender, receiver] bool: whether that rank pair sends partials.

    rows / partials [receiver, sender]: the pair's counts (receiver_counts of every rank).  A layer
    whose rows are not exchanged per pass (`static`) sends none.  The choice is per ordered server
    pair: the sum over its rank pairs of rows x in width against partials x message width.  rows_once
    [sender, receiving server] (the per-server route): the rows cross once per receiving server, so a
    server pair's rows are the sum over its senders of those instead."""
    server = np.asarray(peer_server, dtype=np.int64)
    n_servers = int(server.max()) + 1
    across = server[:, None] != server[None, :]  # [sender, receiver]

    def by_servers(m):  # [receiver, sender] ranks -> [sending server, receiving server]
        out = np.zeros((n_servers, n_servers), dtype=np.int64)
        np.add.at(out, (server[:, None], server[None, :]), np.asarray(m, dtype=np.int64).T)
        return out
    rows_s, partials_s = by_servers(rows), by_servers(partials)
    if rows_once is not None:
        rows_s = np.zeros((n_servers, n_servers), dtype=np.int64)
        np.add.at(rows_s, server, np.asarray(rows_once, dtype=np.int64))
        rows_s[np.arange(n_servers), np.arange(n_servers)] = 0
    out = []
    for w_in, w_msg, fixed in zip(in_widths, message_widths, static):
        if payload == "rows" or fixed:
            out.append(np.zeros_like(across))
            continue
        if payload == "partial":
            out.append(across.copy())
            continue
        smaller = partials_s * int(w_msg) < rows_s * int(w_in)
        out.append(across & smaller[server[:, None], server[None, :]])
    return out


def pair_bytes(rows: np.ndarray, partials: np.ndarray, use: np.ndarray, in_width: int, message_width: int,
               inter: np.ndarray) -> int:
    """Bytes one layer's forward sends over the pairs `inter` [sender, receiver] (the backward the same):
    rows x in width where the pair sends rows, partials x message width where it sends partials."""
    rows_t, partials_t = np.asarray(rows).T, np.asarray(partials).T  # [sender, receiver]
    sent = np.where(use, partials_t * int(message_width), rows_t * int(in_width))
    return int(sent[inter].sum()) * FLOAT32
