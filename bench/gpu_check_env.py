"""The device check's environment stage: what this interpreter has, as one JSON object on stdout.

Every fact is read on its own (a missing piece is reported, the others still are): the Python, torch and
the CUDA it was built for, the GPUs it sees, NCCL, mpi4py and its MPI library, the package's C kernels,
torch_geometric.  `--need-cuda` makes the exit status non-zero when torch sees no GPU.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys


def _try(facts, key, fn):
    try:
        facts[key] = fn()
    except Exception as exc:  # noqa: BLE001 -- reported as that fact's problem; the others are still read
        facts[key] = None
        facts.setdefault("missing", []).append(f"{key}: {type(exc).__name__}: {exc}".splitlines()[0][:300])


def _torch(facts):
    import torch

    facts["torch"] = torch.__version__
    facts["torch_cuda_build"] = torch.version.cuda  # None: a CPU wheel
    facts["cuda_available"] = bool(torch.cuda.is_available())
    n = torch.cuda.device_count() if facts["cuda_available"] else 0
    facts["gpus"] = [{"name": torch.cuda.get_device_name(i),
                      "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                      "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))} for i in range(n)]
    _try(facts, "nccl", lambda: ".".join(map(str, torch.cuda.nccl.version())) if facts["cuda_available"]
         and torch.distributed.is_nccl_available() else None)
    facts["gloo"] = bool(torch.distributed.is_gloo_available())


def _mpi(facts):
    import mpi4py

    mpi4py.rc.initialize = False  # the library's version needs no MPI_Init
    from mpi4py import MPI

    facts["mpi4py"] = mpi4py.__version__
    facts["mpi_library"] = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()


def _kernels(facts):
    from granndis_hpc.nn import cpu_kernels

    facts["c_kernels"] = cpu_kernels.library() is not None
    facts["c_kernels_note"] = cpu_kernels.fallback_reason() or cpu_kernels.kernel_name()


def _nvidia_smi():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().splitlines() if out.returncode == 0 else None


def main(argv=None) -> int:
    need_cuda = "--need-cuda" in (argv if argv is not None else sys.argv[1:])
    facts = {"python": platform.python_version(), "executable": sys.executable}
    _try(facts, "torch", lambda: _torch(facts) or facts.get("torch"))
    _try(facts, "mpi4py", lambda: _mpi(facts) or facts.get("mpi4py"))
    _try(facts, "granndis_hpc", lambda: __import__("granndis_hpc").__file__)
    if facts["granndis_hpc"]:
        _try(facts, "c_kernels", lambda: _kernels(facts) or facts.get("c_kernels"))
    _try(facts, "torch_geometric", lambda: __import__("torch_geometric").__version__)
    _try(facts, "nvidia_smi", _nvidia_smi)
    print(json.dumps(facts), flush=True)
    if not facts.get("torch") or not facts.get("mpi4py") or not facts.get("granndis_hpc"):
        return 1
    return 1 if need_cuda and not facts.get("cuda_available") else 0


if __name__ == "__main__":
    sys.exit(main())
