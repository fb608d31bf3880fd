"""The C kernels of the CPU path (cpu_kernels.c): the aggregations' sparse product ``A @ H`` and the
keyed dropout's forward.

torch's CPU CSR product adds every entry into the output row in memory, and the keyed mask takes several
int64 passes an element (docs/performance/single-rank.md); cpu_kernels.c keeps each output row's
columns in vector registers and hashes and applies a mask in one pass, with the same results bit for
bit.  It is built with the package (setup.py), as the extension module ``granndis_hpc.nn._cpu_kernels``,
and loaded only from there: importing the module finds the library inside the installed package, and its
functions are then called through ctypes on that same file.  Nothing is compiled at run time, and no
library is read from a cache or any other directory.

``$GRANNDIS_CPU_KERNELS`` chooses: ``auto`` (default: the C kernels where the package was installed with
them, else torch's ops; the trainer says so once at start-up), ``native`` (the C kernels or an error) or
``torch`` (torch's ops).  CUDA tensors, half-width dtypes and non-contiguous operands always use torch's
ops.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import threading
from typing import Optional

import torch

CHOICES = ("auto", "native", "torch")
EXTENSION = "granndis_hpc.nn._cpu_kernels"
REINSTALL = ("reinstall granndis-hpc where a C compiler is available at install time "
             "(pip install --force-reinstall --no-deps granndis-hpc, or `make setup` in a checkout)")


class KernelError(RuntimeError):
    """GRANNDIS_CPU_KERNELS=native where the C kernels are not installed (or an unknown choice)."""


_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None
_failure: Optional[str] = None  # why the C kernels are not available (set once tried)
_dispatch: Optional[str] = None  # the instruction set the loaded library runs on this CPU
_tried = False


def choice() -> str:
    value = os.environ.get("GRANNDIS_CPU_KERNELS", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise KernelError(f"GRANNDIS_CPU_KERNELS={value!r}: choose one of {', '.join(CHOICES)}")
    return value


_SPMM = ("csr_spmm_f32_i32", "csr_spmm_f32_i64", "csr_spmm_f64_i32", "csr_spmm_f64_i64")
_DROPOUT = (("dropout_float", ctypes.c_float), ("dropout_double", ctypes.c_double))


def _declare(library: ctypes.CDLL) -> None:
    """Set the kernels' signatures; AttributeError where the library lacks one of them."""
    for name in _SPMM:
        fn = getattr(library, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int]
    for name, scale in _DROPOUT:
        fn = getattr(library, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, scale] + \
            [ctypes.c_void_p] * 3 + [ctypes.c_int]


def _load():
    """(the library, its dispatch) from the installed extension module; RuntimeError saying why not."""
    try:
        module = importlib.import_module(EXTENSION)
    except ImportError as exc:
        raise RuntimeError(f"the extension {EXTENSION} is not installed ({exc})") from None
    path = getattr(module, "__file__", None)
    if not path:
        raise RuntimeError(f"the extension {EXTENSION} has no file")
    try:
        library = ctypes.CDLL(path)  # the file the import loaded: dlopen hands back the same library
        _declare(library)
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"{path} is not a complete build of the C kernels ({exc})") from None
    return library, str(getattr(module, "dispatch", "unknown"))


def library() -> Optional[ctypes.CDLL]:
    """The loaded C kernels; None where they are not installed (``auto``) or are off (``torch``)."""
    global _library, _failure, _dispatch, _tried
    mode = choice()
    if mode == "torch":
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _library, _dispatch = _load()
            except RuntimeError as exc:
                _failure = str(exc)
        if _library is None and mode == "native":
            raise KernelError(f"GRANNDIS_CPU_KERNELS=native: {_failure}; {REINSTALL}, or set "
                              "GRANNDIS_CPU_KERNELS=auto to fall back to torch's ops")
        return _library


def fallback_reason() -> Optional[str]:
    """Why the CPU path uses torch's ops although the C kernels were asked for (``auto``), else None: what
    the trainer prints once at start-up."""
    if choice() == "torch" or library() is not None:
        return None
    return (f"the C kernels are not available ({_failure}); using torch's ops (slower on the CPU): {REINSTALL}, "
            "or set GRANNDIS_CPU_KERNELS=torch to silence this")


def dispatch() -> Optional[str]:
    """The instruction set the C kernels run with on this CPU (x86-64-v4, x86-64-v3, ...), None without them."""
    return _dispatch if library() is not None else None


def kernel_name() -> str:
    """What the CPU path uses: 'native' (the C kernels) or 'torch'."""
    return "native" if library() is not None else "torch"


def csr_matmul(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``a @ h`` for a sparse CSR ``a`` [n, m] and a dense ``h`` [m, d]: the C kernel where it applies."""
    if (h.device.type != "cpu" or h.dtype not in (torch.float32, torch.float64) or h.dim() != 2
            or a.dtype != h.dtype or a.layout != torch.sparse_csr):
        return a @ h
    lib = library()
    if lib is None:
        return a @ h
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    if crow.dtype != col.dtype or crow.dtype not in (torch.int32, torch.int64):
        return a @ h
    n_rows, n_cols = a.shape
    if h.shape[0] != n_cols:
        raise RuntimeError(f"csr_matmul: a is {n_rows} x {n_cols} but h has {h.shape[0]} rows")
    h = h.contiguous()
    out = torch.empty(n_rows, h.shape[1], dtype=h.dtype)
    if n_rows == 0 or h.shape[1] == 0:
        return out.zero_()
    fn = getattr(lib, "csr_spmm_%s_%s" % ("f32" if h.dtype == torch.float32 else "f64",
                                          "i32" if crow.dtype == torch.int32 else "i64"))
    # (ctypes releases the GIL for the call: a communication thread runs on meanwhile.)
    fn(n_rows, h.shape[1], crow.data_ptr(), col.data_ptr(), val.data_ptr(), h.data_ptr(), out.data_ptr(),
       torch.get_num_threads())
    return out


def dropout_applies(h: torch.Tensor) -> bool:
    """Whether dropout() takes h: contiguous float32/float64 rows on the CPU, the C kernels built."""
    return (h.device.type == "cpu" and h.dtype in (torch.float32, torch.float64) and h.dim() == 2
            and h.is_contiguous() and library() is not None)


def dropout(h: torch.Tensor, row_start: torch.Tensor, threshold: int, scale: float):
    """(y, m) for h that dropout_applies to: m = keep * scale for nn/dropout.py's keep mask of rows whose
    hashed starts are ``row_start`` (int64 [n]) and the lane threshold, y = h * m."""
    if row_start.shape != (h.shape[0],):
        raise ValueError(f"dropout: {h.shape[0]} rows but row_start of shape {tuple(row_start.shape)}")
    row_start = row_start.to(torch.int64).contiguous()
    y, m = torch.empty_like(h), torch.empty_like(h)
    lib = library()
    if lib is None:
        raise KernelError("dropout: the C kernels are not loaded (call it only where dropout_applies)")
    fn = lib.dropout_float if h.dtype == torch.float32 else lib.dropout_double
    fn(h.shape[0], h.shape[1], row_start.data_ptr(), int(threshold), scale, h.data_ptr(), y.data_ptr(),
       m.data_ptr(), torch.get_num_threads())
    return y, m
