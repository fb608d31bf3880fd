"""The operators that make the host wait for a GPU from inside torch's C++ code, recognised by name on any
device (the rule table `SYNCING_OPS`), and the dispatch mode that records them (`SyncingOps`, used by
`hostsync.SyncCounter(ops=True)`).

On a GPU these operators stop the host until the queued kernels have run: an output whose size depends
on the data (its count is read back), a value read as a Python number, or an index made from host data
and copied to the device with a blocking copy.  They are the same operators on the CPU, where nothing
waits, so a step run on the CPU under `SyncingOps` lists what *would* synchronise on a GPU, each with
the file and line of this package that issued it.  The rules do not know where a tensor lives on a
GPU run, so they are an upper bound: a value read from, or a tensor made in, host memory (a pinned
staging buffer, `torch.from_numpy` kept on the host) would be counted though it does not wait.

A `TorchDispatchMode` is thread-local state that autograd carries into the threads that run a backward:
on the CPU a CPU graph's backward runs in the thread that called `backward()` (tested); on a GPU the
device's own autograd thread, which restores the caller's thread-local state (`at::ThreadLocalState`,
the dispatch modes included) for each graph task (torch's design, not run here), so the backward's
operators are seen too; a backward operator of torch's own (C++) nodes is placed at the forward line that made its node
(autograd's anomaly-mode traceback, switched on while recording).  Threads the step did not start a
backward in (the MPI progress thread, the co-batch loader, the CUDA double's streams) do not carry the
mode: they wait instead of the step.
"""
from __future__ import annotations

import os
import re
import sys
from types import FrameType
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN = (os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostsync.py"))
_SIZE = "output size depends on the data: its count is read back to the host"


def _masked(args, kwargs) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _always(args, kwargs) -> bool:
    return True


# aten operator (overload packet) -> (when it synchronises, why).  The rule table of docs/gpu.md.
SYNCING_OPS: Dict[str, Tuple[Callable, str]] = {
    **{op: (_always, _SIZE) for op in ("nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique",
                                        "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive")},
    "repeat_interleave": (lambda a, k: k.get("output_size") is None,
                          "without output_size the output's length (the repeats' sum) is read back"),
    "bincount": (_always, "the output's length (the largest value) is read back"),
    **{op: (_masked, "a boolean mask index is turned into positions with nonzero")
       for op in ("index", "index_put", "index_put_", "_index_put_impl_")},
    "_local_scalar_dense": (_always, "a tensor's value read as a Python number (.item(), float(t), if t:)"),
    "is_nonzero": (_always, "a tensor's truth value read by the host"),
    "equal": (_always, "torch.equal returns a Python bool"),
    # A 0-dim one is a Python number made a tensor (t[mask] = 1.0), which a kernel takes as an argument.
    "lift_fresh": (lambda a, k: a[0].dim() > 0, "a tensor made from Python or NumPy data (a list or array "
                                                "index, torch.tensor, torch.from_numpy): a blocking copy "
                                                "to the device"),
}

_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


class SyncingOps(TorchDispatchMode):
    """Records [(aten op, "file:line")] of the operators in `SYNCING_OPS` issued from `package`'s code.

    An operator is the package's when the innermost Python frame outside torch is the package's (so
    torch's Python wrappers such as `torch.unique` count for their caller, while torch's optimizers,
    which read their own host-side state, do not); in a backward node of torch's own, the forward line
    that made the node.  `quiet()` is true while a Python-level counted call runs (hostsync), so its
    operator is not recorded twice."""

    def __init__(self, package: str, root: str, record: Callable[[str, str], None],
                 quiet: Callable[[], bool]):
        super().__init__()
        self.package, self.root, self._record, self._quiet = package + os.sep, root, record, quiet
        self._anomaly: Optional[Tuple[bool, bool]] = None
        self.backward_ops = 0  # operators run inside a backward node (shows that the backward was seen)

    def _ours(self, path: str, line) -> Optional[str]:
        path = os.path.abspath(path)
        if path.startswith(self.package) and path not in _OWN:
            return f"{os.path.relpath(path, self.root)}:{line}"
        return None

    def _where(self) -> Optional[str]:
        frame: Optional[FrameType] = sys._getframe(2)
        while frame is not None:  # innermost first
            path = os.path.abspath(frame.f_code.co_filename)
            if path.startswith(_TORCH + "optim" + os.sep):
                return None  # the optimizer's own state (its step count lives on the host)
            if path.startswith(_TORCH + "autograd" + os.sep) and torch._C._current_autograd_node() is not None:
                break  # the engine runs a node of torch's own: no Python frame of its backward
            if path not in _OWN and not path.startswith(_TORCH):
                return self._ours(path, frame.f_lineno)
            frame = frame.f_back
        node = torch._C._current_autograd_node()
        return None if node is None else self._where_backward(node)

    def _where_backward(self, node) -> Optional[str]:
        for entry in reversed(node.metadata.get("traceback_", [])):  # innermost forward frame first
            found = _TRACE_LINE.search(entry)
            if found and not os.path.abspath(found.group(1)).startswith(_TORCH):
                return self._ours(found.group(1), found.group(2))
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._current_autograd_node() is not None:
            self.backward_ops += 1
        rule = SYNCING_OPS.get(func.overloadpacket.__name__)
        if rule is not None and not self._quiet() and rule[0](args, kwargs):
            where = self._where()
            if where is not None:
                self._record(f"aten.{func.overloadpacket.__name__}", where)
        return func(*args, **kwargs)

    def __enter__(self):
        # Anomaly mode keeps each node's forward traceback, for placing a backward operator (global state,
        # restored on exit; check_nan off, so nothing else changes).
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.set_anomaly_enabled(True, False)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._anomaly is not None:
                torch.set_anomaly_enabled(*self._anomaly)


