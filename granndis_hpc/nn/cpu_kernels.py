"""The C kernels of the CPU path (cpu_kernels.c): the aggregations' sparse product ``A @ H`` and the
keyed dropout's forward.

torch's CPU CSR product adds every entry into the output row in memory, and the keyed mask takes several
int64 passes an element (docs/performance/single-rank.md); cpu_kernels.c keeps each output row's
columns in vector registers and hashes and applies a mask in one pass, with the same results bit for
bit.  It needs no torch headers: it is compiled on first use with the system C compiler (``$CC``, else
``cc``) for the machine it runs on (``-march=native``), into a cache directory shared by the ranks
(``$GRANNDIS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/granndis_hpc`` or ``~/.cache/granndis_hpc``), named
by a hash of the source, the flags, the compiler and the CPU's features, so nodes of different CPU
kinds on one shared home each build their own.  The library is written under a temporary name and
renamed into place: ranks that build it at the same time all end up loading a complete file.

``$GRANNDIS_CPU_KERNELS`` chooses: ``auto`` (default: the C kernels where they build, else torch's ops,
with one warning saying why), ``native`` (the C kernels or an error) or ``torch`` (torch's ops).
CUDA tensors, half-width dtypes and non-contiguous operands always use torch's ops.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Optional

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.c")
CHOICES = ("auto", "native", "torch")
_FLAGS = ["-O3", "-fPIC", "-shared", "-std=c99"]
_NATIVE_FLAGS = ["-march=native"]


class KernelError(RuntimeError):
    """GRANNDIS_CPU_KERNELS=native where the C kernels cannot be built (or an unknown choice)."""


_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None
_failure: Optional[str] = None  # why the C kernels are not available (set once tried)
_tried = False
_warned = False


def choice() -> str:
    value = os.environ.get("GRANNDIS_CPU_KERNELS", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise KernelError(f"GRANNDIS_CPU_KERNELS={value!r}: choose one of {', '.join(CHOICES)}")
    return value


def cache_dir() -> Path:
    if os.environ.get("GRANNDIS_KERNEL_CACHE"):
        return Path(os.environ["GRANNDIS_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "granndis_hpc"


def _cpu_features() -> str:
    """The CPU's feature flags (what -march=native compiles for), so a shared cache keeps one build per kind."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compile(compiler: str, flags, out: Path) -> Optional[str]:
    """Compile SOURCE into `out` (via a temporary file and a rename); None, or the compiler's complaint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE), "-lpthread"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errors = [line for line in lines if "error" in line]
            return (errors or lines or [f"exit status {proc.returncode}"])[0]
        os.replace(tmp, out)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH (set CC to one)")
    errors, source, cpu = [], SOURCE.read_bytes(), _cpu_features().encode()
    for flags in (_FLAGS + _NATIVE_FLAGS, _FLAGS):  # a compiler without -march=native gets the portable build
        digest = hashlib.sha256()
        for part in (source, " ".join(flags).encode(), compiler.encode(), cpu, platform.machine().encode()):
            digest.update(part)
            digest.update(b"\0")
        path = cache_dir() / f"cpu_kernels-{digest.hexdigest()[:16]}.so"
        if not path.exists():
            error = _compile(compiler, flags, path)
            if error is not None:
                errors.append(f"{compiler} {' '.join(flags)}: {error}")
                continue
        library = ctypes.CDLL(str(path))
        for name in ("csr_spmm_f32_i32", "csr_spmm_f32_i64", "csr_spmm_f64_i32", "csr_spmm_f64_i64"):
            fn = getattr(library, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int]
        for name, scale in (("dropout_float", ctypes.c_float), ("dropout_double", ctypes.c_double)):
            fn = getattr(library, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, scale] + \
                [ctypes.c_void_p] * 3 + [ctypes.c_int]
        return library
    raise RuntimeError("could not compile nn/cpu_kernels.c: " + " | ".join(errors))


def library() -> Optional[ctypes.CDLL]:
    """The loaded C kernels, built on first call; None where they cannot be built (``auto``) or are off."""
    global _library, _failure, _tried, _warned
    mode = choice()
    if mode == "torch":
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _library = _build()
            except (RuntimeError, OSError) as exc:
                _failure = str(exc)
        if _library is None:
            if mode == "native":
                raise KernelError(f"GRANNDIS_CPU_KERNELS=native: {_failure}; install a C compiler, or set "
                                  "GRANNDIS_CPU_KERNELS=auto to fall back to torch's ops")
            if not _warned:
                _warned = True
                warnings.warn(f"the C kernels are not available ({_failure}); using torch's ops "
                              "(slower on the CPU; set GRANNDIS_CPU_KERNELS=torch to silence this)")
        return _library


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
    fn = lib.dropout_float if h.dtype == torch.float32 else lib.dropout_double
    fn(h.shape[0], h.shape[1], row_start.data_ptr(), int(threshold), scale, h.data_ptr(), y.data_ptr(),
       m.data_ptr(), torch.get_num_threads())
    return y, m
