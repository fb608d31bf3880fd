"""Which device each rank uses: pure functions of what the ranks report (unit-tested without GPUs),
applied collectively by cluster/topology.py.

A rank sees the GPUs its launcher left visible (CUDA_VISIBLE_DEVICES, set by Slurm's --gpus-per-task,
--gpu-bind or by hand).  The ranks of one host that see the same set of GPUs share them out in rank
order: with one GPU per rank (--gpus-per-task=1, --gpu-bind=single:1) every rank takes its only one;
with the node's G GPUs visible to every rank (--gpus-per-node=G) rank i of the host takes GPU i; with
--gpu-bind=closest (a socket's GPUs visible to the ranks of that socket) rank i of the socket takes its
i-th GPU.  More ranks than GPUs in a set is an error unless sharing is asked for (share=True, --share-gpus: two
emulated servers on one GPU), and `auto` never runs the job on the CPU because some ranks see no GPU, nor
because torch cannot use the GPUs the scheduler gave the job (a CPU wheel of torch on a GPU node).
"""
from __future__ import annotations

from typing import Hashable, List, Mapping, Optional, Sequence, Tuple

# Where a launcher says it gave this rank GPUs.  Counts (a zero count is no GPU; Slurm writes a typed count
# as "a100:4") and lists of GPU indices (any entry, "0" included, is a GPU).
_GPU_COUNTS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS",
               "SLURM_GPUS_PER_SOCKET")
_GPU_LISTS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
# CUDA_VISIBLE_DEVICES values that hide every GPU (Slurm writes NoDevFiles when gres gives the step none).
_NO_GPUS = {"", "-1", "none", "nodevfiles", "void"}


def scheduler_gpus(environ: Mapping[str, str]) -> str:
    """The first variable that says the scheduler gave this rank GPUs, as NAME=VALUE; "" when none does."""
    for name in _GPU_LISTS:
        value = environ.get(name, "").strip()
        if value.lower() not in _NO_GPUS:
            return f"{name}={value}"
    for name in _GPU_COUNTS:
        value = environ.get(name, "").strip()
        counts = [part.rsplit(":", 1)[-1] for part in value.split(",") if part.strip()]
        if any(c.strip().isdigit() and int(c) > 0 for c in counts) or any(not c.strip().isdigit() for c in counts):
            return f"{name}={value}"
    return ""


def device_kind(requested: str, has_cuda: Sequence[bool], hosts: Sequence[str],
                allocated: Sequence[str] = (), torch_build: str = "") -> Tuple[str, str]:
    """("cuda" | "cpu", problem or "") for every rank from each rank's CUDA availability (by rank), the GPUs
    the scheduler gave each rank (scheduler_gpus, by rank; "" for none) and the torch build of the ranks."""
    if requested == "cpu":
        return "cpu", ""
    missing = [r for r, ok in enumerate(has_cuda) if not ok]
    if requested == "auto" and len(missing) == len(has_cuda):
        given = [r for r, what in enumerate(allocated) if what]
        if not given:
            return "cpu", ""
        r = given[0]
        # A job that asked for GPUs and would quietly train on the CPU (hours instead of minutes) is refused.
        return "cpu", (f"--device auto: the scheduler gave rank {r} on {hosts[r]} GPUs ({allocated[r]}; "
                       f"{len(given)} of {len(has_cuda)} ranks have GPUs) but {torch_build or 'this torch'} sees "
                       f"no CUDA, so the job would train on the CPU; install a CUDA build of torch in the ranks' "
                       f"environment (see https://pytorch.org/get-started/locally/ or the site's module), or "
                       f"pass --device cpu to train on the CPU deliberately")
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
