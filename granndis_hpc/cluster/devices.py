"""Which device each rank uses: pure functions of what the ranks report (unit-tested without GPUs),
applied collectively by cluster/topology.py.

A rank sees the GPUs its launcher left visible (CUDA_VISIBLE_DEVICES, set by Slurm's --gpus-per-task,
--gpu-bind or by hand).  The ranks of one host that see the same set of GPUs share them out in rank
order: with one GPU per rank (--gpus-per-task=1, --gpu-bind=single:1) every rank takes its only one;
with the node's G GPUs visible to every rank (--gpus-per-node=G) rank i of the host takes GPU i; with
--gpu-bind=closest (a socket's GPUs visible to the ranks of that socket) rank i of the socket takes its
i-th GPU.  More ranks than GPUs in a set is an error unless sharing is asked for (share=True, --share-gpus: two
emulated servers on one GPU), and `auto` never runs the job on the CPU because some ranks see no GPU.
"""
from __future__ import annotations

from typing import Hashable, List, Optional, Sequence, Tuple


def device_kind(requested: str, has_cuda: Sequence[bool], hosts: Sequence[str]) -> Tuple[str, str]:
    """("cuda" | "cpu", problem or "") for every rank from each rank's CUDA availability (by rank)."""
    if requested == "cpu":
        return "cpu", ""
    missing = [r for r, ok in enumerate(has_cuda) if not ok]
    if requested == "auto" and len(missing) == len(has_cuda):
        return "cpu", ""
    if missing:
        where = ", ".join(f"rank {r} on {hosts[r]}" for r in missing[:4]) + (" ..." if len(missing) > 4 else "")
        how = ("pass --device cpu to train on the CPU, or" if requested == "auto" else "use --device cpu, or")
        return "cuda", (f"device={requested} was requested but CUDA is not available on host {hosts[missing[0]]} "
                        f"({len(missing)} of {len(has_cuda)} ranks see no GPU: {where}); {how} "
                        f"start every rank on a GPU node with GPUs visible to it (check the launcher's "
                        f"--gpus-per-task / --gpu-bind and CUDA_VISIBLE_DEVICES)")
    return "cuda", ""


def gpu_positions(hosts: Sequence[str], visible_sets: Sequence[Hashable]) -> List[Tuple[int, int]]:
    """(position, count) per rank: its index among the ranks of its host that see the same GPUs (in
    rank order), and how many such ranks there are."""
    groups: dict = {}
    for r, key in enumerate(zip(hosts, visible_sets)):
        groups.setdefault(key, []).append(r)
    out = [(0, 0)] * len(hosts)
    for ranks in groups.values():
        for i, r in enumerate(ranks):
            out[r] = (i, len(ranks))
    return out


def select_gpu(position: int, count: int, visible: int, share: bool, host: str = "") -> Tuple[Optional[int], str]:
    """(index among this rank's visible GPUs, problem or "")."""
    if visible < 1:
        return None, f"no GPU is visible to this rank on {host or 'its host'}"
    if count > visible and not share:
        return None, (f"{count} ranks on {host or 'one host'} see the same {visible} GPU(s): start one rank per "
                      f"GPU (srun --gpus-per-task=1, or --ntasks-per-node equal to --gpus-per-node), or set "
                      f"--share-gpus to share them on purpose (emulated servers on one GPU)")
    return position % visible, ""
