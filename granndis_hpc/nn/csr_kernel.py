"""The CPU sparse product ``A @ H`` (CSR A, dense H) of the aggregations: a small C kernel, csr_spmm.c.

torch's CPU CSR product ran 5-15x the time its bytes take on one thread (docs/performance/single-rank.md);
csr_spmm.c keeps each output row's columns in vector registers.  It needs no torch headers: it is compiled
on first use with the system C compiler (``$CC``, else ``cc``) for the machine it runs on
(``-march=native``), into a cache directory shared by the ranks (``$GRANNDIS_KERNEL_CACHE``, else
``$XDG_CACHE_HOME/granndis_hpc`` or ``~/.cache/granndis_hpc``), named by a hash of the source, the flags,
the compiler and the CPU's features, so nodes of different CPU kinds on one shared home each build their
own.  The library is written under a temporary name and renamed into place: ranks that build it at the
same time all end up loading a complete file.

``$GRANNDIS_CSR_KERNEL`` chooses: ``auto`` (default: the C kernel where it builds, else torch's product,
with one warning saying why), ``native`` (the C kernel or an error) or ``torch`` (torch's product).
CUDA tensors, half-width dtypes and anything but a 2-D row-major H always use torch's product.
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

SOURCE = Path(__file__).with_name("csr_spmm.c")
CHOICES = ("auto", "native", "torch")
_FLAGS = ["-O3", "-fPIC", "-shared", "-std=c99"]
_NATIVE_FLAGS = ["-march=native"]



class KernelError(RuntimeError):
    """GRANNDIS_CSR_KERNEL=native where the C kernel cannot be built (or an unknown choice)."""


_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None
_failure: Optional[str] = None  # why the C kernel is not available (set once tried)
_tried = False
_warned = False


def choice() -> str:
    value = os.environ.get("GRANNDIS_CSR_KERNEL", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise KernelError(f"GRANNDIS_CSR_KERNEL={value!r}: choose one of {', '.join(CHOICES)}")
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
    errors = []
    for flags in (_FLAGS + _NATIVE_FLAGS, _FLAGS):  # a compiler without -march=native gets the portable build
        digest = hashlib.sha256()
        for part in (SOURCE.read_bytes(), " ".join(flags).encode(), compiler.encode(), _cpu_features().encode(),
                     platform.machine().encode()):
            digest.update(part)
            digest.update(b"\0")
        path = cache_dir() / f"csr_spmm-{digest.hexdigest()[:16]}.so"
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
        return library
    raise RuntimeError("could not compile nn/csr_spmm.c: " + " | ".join(errors))


def library() -> Optional[ctypes.CDLL]:
    """The loaded C kernel, building it on first call; None where it cannot be built (``auto``) or is off."""
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
                raise KernelError(f"GRANNDIS_CSR_KERNEL=native: {_failure}; install a C compiler, or set "
                                   "GRANNDIS_CSR_KERNEL=auto to fall back to torch's sparse product")
            if not _warned:
                _warned = True
                warnings.warn(f"the C sparse product is not available ({_failure}); using torch's "
                              "(slower on the CPU; set GRANNDIS_CSR_KERNEL=torch to silence this)")
        return _library


def kernel_name() -> str:
    """Which product aggregations use on the CPU: 'native' (the C kernel) or 'torch'."""
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
