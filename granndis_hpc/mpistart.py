"""MPI started by the entry points, after the GPU is chosen: `init_mpi` runs before anything imports
mpi4py's MPI module (granndis-train, granndis predict, the device check).

mpi4py initialises MPI when `mpi4py.MPI` is first imported.  A CUDA-aware MPI (UCX, Open MPI's smcuda)
creates its CUDA context on the current device while it initialises, which is GPU 0 until a device is
set: every rank of a node then holds a stray context on GPU 0, and on GPUs in exclusive-process mode
every rank but one fails.  So the entry points turn automatic initialisation off (`mpi4py.rc`), set
the device from what the launcher says about the rank before MPI exists -- its local rank
(OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, PMI_LOCAL_RANK) and the GPUs it sees --
and then call `MPI_Init_thread`, asking for MPI_THREAD_MULTIPLE.

The local rank modulo the visible GPUs is the GPU the topology's collective choice gives
(cluster/devices.py) whenever a node's ranks are placed in blocks (rank i of a node takes GPU i; one
rank per GPU sees GPU 0 only); after MPI starts, cluster/topology.py makes that choice from every
rank's report and sets it, so an interleaved placement still ends on the right GPU.

On a GPU the backward's MPI calls may run on autograd's device thread, so the MPI library must give at
least MPI_THREAD_SERIALIZED there (`thread_level_problem`, checked by the topology on every rank).
Standard library only at import; torch is imported by `init_mpi` when a GPU may be used.
"""
from __future__ import annotations

import contextlib
import io
import os
from typing import Mapping, Optional, Tuple

LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
THREAD_LEVEL_NAMES = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE")

# What init_mpi did in this process (None: it did not run, e.g. under pytest-mpi, which imports MPI).
started: Optional[dict] = None


def local_rank(environ: Mapping[str, str] = os.environ) -> Tuple[int, str]:
    """(this rank's index on its node, the variable it came from); (0, "") when no launcher says (a
    single process started by hand)."""
    for name in LOCAL_RANK_VARS:
        text = environ.get(name, "").strip()
        if text.isdigit():
            return int(text), name
    return 0, ""


def early_gpu(local: int, visible: int) -> Optional[int]:
    """The GPU to set before MPI starts: the local rank modulo the GPUs this rank sees (None: none)."""
    return local % visible if visible > 0 else None


def thread_level_name(level: int) -> str:
    return THREAD_LEVEL_NAMES[level] if 0 <= level < len(THREAD_LEVEL_NAMES) else f"level {level}"


def thread_level_problem(provided: int, serialized: int, library: str) -> str:
    """"" when `provided` (the MPI library's thread level) is enough for GPU training, else the error."""
    if provided >= serialized:
        return ""
    return (f"the MPI library gives {thread_level_name(provided)} but GPU training needs MPI_THREAD_SERIALIZED "
            f"or better (the backward calls MPI from autograd's device thread); this MPI is "
            f"{library.strip().splitlines()[0] if library.strip() else 'of unknown version'}: use an MPI built "
            f"with thread support (Open MPI: the default build; MPICH: --enable-threads=multiple), or --device cpu")


def _cuda_module():
    import torch
    return torch.cuda


def init_mpi(device: str = "auto", environ: Mapping[str, str] = os.environ, cuda=None, mpi4py_module=None) -> dict:
    """Set this rank's GPU (unless `device` is "cpu"), then initialise MPI with thread support.

    Returns (and keeps in `started`) what was done: {"gpu": index or None, "local_rank", "source",
    "thread_level", "already": MPI was initialised before (nothing is changed then)}.  `cuda` and
    `mpi4py_module` stand in for torch.cuda and mpi4py in tests."""
    global started
    if mpi4py_module is None:
        import mpi4py as mpi4py_module
    mpi = getattr(mpi4py_module, "MPI", None)  # set once mpi4py.MPI has been imported
    if mpi is not None and mpi.Is_initialized():
        started = {"gpu": None, "local_rank": None, "source": "", "thread_level": mpi.Query_thread(), "already": True}
        return started
    mpi4py_module.rc.initialize = False  # the import below must not start MPI
    mpi4py_module.rc.finalize = True     # MPI_Finalize at exit, as when mpi4py starts it
    local, source = local_rank(environ)
    gpu = None
    if device != "cpu":
        cuda = _cuda_module() if cuda is None else cuda
        visible = cuda.device_count() if cuda.is_available() else 0
        gpu = early_gpu(local, visible)
        if gpu is not None:
            cuda.set_device(gpu)
    if mpi is None:
        from importlib import import_module
        mpi = import_module(mpi4py_module.__name__ + ".MPI")
    provided = mpi.Init_thread(mpi.THREAD_MULTIPLE)
    started = {"gpu": gpu, "local_rank": local, "source": source, "thread_level": provided, "already": False}
    return started


def requested_device(argv, options_class=None) -> str:
    """The --device a command line of `options_class` (default TrainConfig) asks for, read without MPI
    (its --config file or --resume run included); "auto" when it cannot tell: the real parse,
    collective, reports any error."""
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        return "cpu"  # only the help is printed
    try:
        from granndis_hpc.options.train import TrainConfig
        from granndis_hpc.rundir.config_file import load_resolved_config
        from granndis_hpc.options import read_options

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            command_line, file_values, _ = read_options(options_class or TrainConfig, argv, "granndis", "")
        given = {**file_values, **command_line}
        if "device" not in given and given.get("resume"):
            given = load_resolved_config(given["resume"])
        return str(given.get("device") or "auto")
    except (Exception, SystemExit):  # noqa: BLE001 -- the collective parse after MPI starts says what is wrong
        return "auto"
