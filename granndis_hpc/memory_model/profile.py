"""Measuring a step's peak on CPU (the memory model's tests and bench/check_memory_model.py compare
the estimate with it); torch's profiler, kept out of the pure estimate."""
from __future__ import annotations

import itertools

import torch


def measure_step_peak(fn) -> int:
    """Peak bytes torch allocates on CPU while fn() runs, above the level it starts at: every CPU
    allocation and free the profiler records, summed in time order.  (Resident memory is no measure:
    the C heap keeps freed blocks.)  On CUDA use torch.cuda.max_memory_allocated instead."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU),
                    key=lambda e: e.start_ns())
    return int(max(itertools.accumulate((e.nbytes() for e in events), initial=0)))
