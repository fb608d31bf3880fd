"""Peak memory of this process, for the epoch record and summary.json."""
from __future__ import annotations

import resource

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: max allocated on CUDA, peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def peak_reserved_bytes(device: torch.device) -> int:
    """Peak memory the CUDA caching allocator reserved (what the GPU must hold: allocated bytes plus its
    cached, fragmented blocks); 0 on the CPU."""
    return int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else 0
