"""What setting up a co-batch costs, for `preprocess plan --inter-rate`'s prices of the co-batch options.

--mode auto times it on the cluster at start-up (engine/cobsetup.py); plan has no cluster, so it runs the
same timing (the batched mode's registry entry, `setup_timer`: no engine import here) on each server's
graph of a build that samples co-batches, one server at a time on this host, and keeps the slowest
server's fixed seconds and seconds per row.  The graphs are those the plan assembles anyway to sample the
first co-batch of each count (halo_counts.count_build on a sliced source, sets.plan_options on a whole
graph), so the timing adds a few small co-batches per server to that sampling.  `--cobatch-setup
SECONDS,SECONDS_PER_ROW` gives the two numbers instead (timed on the cluster, e.g. by a run's
`plan.auto.cobatch_setup`), and nothing is timed.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from granndis_hpc import registry

ZERO = {"cobatch_s": 0.0, "cobatch_row_s": 0.0, "method": ""}


def parse_setup(text: str) -> Tuple[float, float]:
    """--cobatch-setup SECONDS,SECONDS_PER_ROW: two numbers, neither negative."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        fixed, row = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--cobatch-setup {text!r}: give SECONDS,SECONDS_PER_ROW, two numbers such as 0.002,4e-6 "
                         f"(a run's summary.json plan.auto.cobatch_setup has cobatch_s and cobatch_row_s)") from None
    if not (fixed >= 0 and row >= 0):
        raise ValueError(f"--cobatch-setup {text!r}: the seconds must not be negative")
    return fixed, row


def time_graph(graph: dict, server: int, layers: int, sampler: str, fanout: int, seed: int, exact: bool,
               device) -> Optional[tuple]:
    """The batched mode's timing (engine/cobsetup.time_server_graph) of GPU 0's part of a co-batch on the
    server graph `graph` (indptr, indices, hop, train, offsets, in_degree, global_id)."""
    timer = registry.MODES.entry("cob").resolve("setup_timer")
    return timer(graph, layers, sampler, fanout, seed, server, 0, exact, device)


def timer(cfg, kind: str):
    """time_setup(server, graph) for the build of preload `kind` (count_build's, plan_options'), or None where
    the plan does not time the set-up (cfg.time_setup); the run plans a co-batch exactly on a full preload
    sampled without a fanout (engine/cobsetup.py)."""
    if not cfg.time_setup:
        return None
    device = timing_device()
    exact = kind == "full" and cfg.cob_fanout == -1 and cfg.cob_sampler == "sage"

    def time_setup(server: int, graph: dict) -> Optional[tuple]:
        return time_graph(graph, server, cfg.layers, cfg.cob_sampler, cfg.cob_fanout, cfg.seed, exact, device)
    return time_setup


def timing_device():
    """The device plan's compute rate is measured on: this machine's first GPU, else its CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def summary(timed: Dict[object, Optional[tuple]]) -> dict:
    """The Rates fields of the servers' timings ({(build, server): (fixed, per row, rows) or None}): the slowest
    server's fixed seconds and seconds per row, and the method in words."""
    got = {s: t for s, t in timed.items() if t is not None}
    if not got:
        return {**ZERO, "method": "co-batch set-up not priced (no server of the build has a training vertex)"}
    fixed = max(t[0] for t in got.values())
    row_s = max(t[1] for t in got.values())
    rows = int(np.max([t[2] for t in got.values()]))
    return {"cobatch_s": float(fixed), "cobatch_row_s": float(row_s), "servers": len(got),
            "method": (f"co-batch set-up {fixed * 1e3:.3g} ms + {row_s * 1e6:.3g} us per row (timed on this host, "
                       f"one server at a time, the slowest of {len(got)} server graphs' kept; co-batches of up to "
                       f"{rows:,} rows)")}


def given(text: str) -> dict:
    """--cobatch-setup's numbers as summary's fields."""
    fixed, row_s = parse_setup(text)
    return {"cobatch_s": fixed, "cobatch_row_s": row_s,
            "method": f"co-batch set-up {fixed * 1e3:.3g} ms + {row_s * 1e6:.3g} us per row (--cobatch-setup)"}
