"""Writing per-vertex outputs of a distributed job in global-id order, in bounded memory, atomically.

Rows are computed where their vertices live (a rank's inner vertices, in any order of global ids).  They
are first moved, by one all-to-all per array (`Communicator.world_exchange`), so that rank r holds the
contiguous block of output rows [N*r/P, N*(r+1)/P): no rank ever holds more than its block, and every
rank writes one contiguous slab.  Then:

* HDF5 (one file): rank 0 creates the file with its chunked datasets; the ranks write their slabs one
  after another (HDF5 without MPI-IO takes one writer at a time), each opening, writing and closing it.
* .npy (a directory, one file per array): rank 0 creates each file with its header at full size; every
  rank writes its slab through a memory map at the same time (disjoint byte ranges).

Everything is written under a temporary name beside --out (``.NAME.partial-<pid>``); only after every
rank has written its part does rank 0 record the provenance ("complete": true), fsync and rename it to
--out.  A job killed part-way leaves only the hidden partial name, never a file that looks complete.
--overwrite replaces only an earlier output of predict, recognised by its provenance (check_output).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from granndis_hpc.cluster.errors import collective_errors
from granndis_hpc.fsutil import fsync_dir
from granndis_hpc.outputs import OutputKind, check_output_place

PROVENANCE_FILE = "provenance.json"
CHUNK_BYTES = 1 << 20  # HDF5 chunks of about 1 MiB of rows


PREDICT_TOOL = "granndis predict"  # the provenance's "kind": what recognises an output as predict's


class OutputError(ValueError):
    """--out cannot be written (it holds something, its directory is missing, ...)."""


def is_predictions(path: str) -> bool:
    """Whether `path` holds predict's output: its provenance (a directory's provenance.json, an HDF5 file's
    attribute) says it was written by predict."""
    try:
        if os.path.isdir(path):
            with open(os.path.join(path, PROVENANCE_FILE), encoding="utf-8") as fh:
                prov = json.load(fh)
        else:
            import h5py
            if not h5py.is_hdf5(path):
                return False
            with h5py.File(path, "r") as f:
                prov = json.loads(f.attrs["provenance"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(prov, dict) and prov.get("kind") == PREDICT_TOOL


# What --overwrite may replace (granndis_hpc/outputs.py): an earlier output of predict, file or directory.
PREDICTIONS = OutputKind(tool=PREDICT_TOOL, what="predictions", recognise=is_predictions,
                         own=lambda name: name == PROVENANCE_FILE or name.endswith(".npy"))


def block_bounds(n: int, parts: int) -> np.ndarray:
    """Starts of the `parts` contiguous blocks of n rows (and n): block r is [b[r], b[r+1])."""
    return (np.arange(parts + 1, dtype=np.int64) * n) // parts


def to_blocks(comm, topo, keys: np.ndarray, arrays: Dict[str, torch.Tensor], n: int) -> tuple:
    """Collective: move row i of every array to the rank whose block of [0, n) holds keys[i] (keys are
    distinct, in [0, n)).  Returns (this block's keys sorted, {name: its rows in that order}) as NumPy."""
    p = topo.world_size
    bounds = block_bounds(n, p)
    order = np.argsort(keys, kind="stable")  # by key, hence by destination block too
    dest = np.searchsorted(bounds, keys[order], side="right") - 1
    send_counts = np.bincount(dest, minlength=p)
    recv_counts = np.asarray(topo.exchange_counts(send_counts), dtype=np.int64)
    device = topo.device
    idx = torch.as_tensor(order, device=device)
    key_t = torch.as_tensor(keys[order], device=device)
    got_keys = comm.world_exchange(key_t, send_counts, recv_counts, phase="evaluation").cpu().numpy()
    out = {}
    mine = np.argsort(got_keys, kind="stable")
    for name, rows in arrays.items():
        got = comm.world_exchange(rows.index_select(0, idx).contiguous(), send_counts, recv_counts, phase="evaluation")
        out[name] = got.cpu().numpy()[mine]
    return got_keys[mine], out


def partial_name(final: str, pid: int) -> str:
    final = os.path.abspath(final.rstrip("/"))
    return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.partial-{pid}")


def check_output(path: str, overwrite: bool, reads: Sequence = ()) -> None:
    """Refuse an --out that may not be written (granndis_hpc/outputs.py: anything but an earlier output of
    predict, and that only with --overwrite; `reads`: (path, option) of what the job reads) or whose
    directory cannot be written; a missing directory is created (as train's --out is), once the place passes."""
    check_output_place(path.rstrip("/") or "/", PREDICTIONS, overwrite, reads, error=OutputError)
    final = os.path.abspath(path.rstrip("/"))
    parent = os.path.dirname(final)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {path}: directory {parent} cannot be created ({exc.strerror or exc}); create it "
                          f"or choose another --out") from None
    if not os.access(parent, os.W_OK):
        raise OutputError(f"--out {path}: directory {parent} is not writable")


def _replace(tmp: str, final: str) -> None:
    """Rename tmp to final; an old final (--overwrite: predict's own earlier output, check_output) is moved
    aside first and deleted after."""
    old = None
    if os.path.lexists(final):
        old = tmp + ".old"
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))
    if old is not None:
        (shutil.rmtree if os.path.isdir(old) and not os.path.islink(old) else os.unlink)(old)


def _chunk_rows(n: int, row_bytes: int) -> int:
    return int(max(1, min(n, CHUNK_BYTES // max(row_bytes, 1))))


def write_rows(topo, path: str, fmt: str, start: int, total: int, arrays: Dict[str, np.ndarray],
               shapes: Dict[str, tuple], provenance: Dict, overwrite: bool, reads: Sequence = ()) -> None:
    """Collective: write this rank's rows [start, start + len) of every array of `shapes` ({name: (dtype,
    row shape)}) into --out `path` (`fmt` "hdf5" or "npy"), atomically (module docstring); `overwrite` and
    `reads` as check_output's."""
    world = topo.world
    tmp = partial_name(path, topo.bcast_object(os.getpid() if topo.rank == 0 else None))
    final = os.path.abspath(path.rstrip("/"))
    with collective_errors(world, f"creating {tmp}", catch=(OSError, OutputError)):
        if topo.rank == 0:
            check_output(path, overwrite, reads)
            (_create_h5 if fmt == "hdf5" else _create_npy)(tmp, total, shapes)
    try:
        if fmt == "hdf5":
            for r in range(topo.world_size):  # one writer at a time
                with collective_errors(world, f"writing {tmp}", catch=(OSError,)):
                    if topo.rank == r:
                        _write_h5(tmp, start, arrays)
        else:
            with collective_errors(world, f"writing {tmp}", catch=(OSError,)):
                _write_npy(tmp, start, arrays)
        with collective_errors(world, f"finishing {final}", catch=(OSError,)):
            if topo.rank == 0:
                (_finish_h5 if fmt == "hdf5" else _finish_npy)(tmp, provenance)
                _replace(tmp, final)
    except BaseException:
        if topo.rank == 0:  # an error every rank saw: nothing of this job's output is left behind
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp) if os.path.isdir(tmp) else os.unlink(tmp)
        raise


def _create_h5(tmp: str, total: int, shapes: Dict[str, tuple]) -> None:
    import h5py
    with h5py.File(tmp, "w") as f:
        for name, (dtype, row) in shapes.items():
            row_bytes = int(np.prod(row, dtype=np.int64)) * np.dtype(dtype).itemsize
            chunks = (_chunk_rows(total, row_bytes), *row) if total else None
            f.create_dataset(name, shape=(total, *row), dtype=dtype, chunks=chunks)
        f.attrs["complete"] = False


def _write_h5(tmp: str, start: int, arrays: Dict[str, np.ndarray]) -> None:
    import h5py
    with h5py.File(tmp, "r+") as f:
        for name, rows in arrays.items():
            if len(rows):
                f[name][start:start + len(rows)] = rows


def _finish_h5(tmp: str, provenance: Dict) -> None:
    import h5py
    with h5py.File(tmp, "r+") as f:
        f.attrs["provenance"] = json.dumps(provenance, sort_keys=True)
        f.attrs["complete"] = True
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())


def _create_npy(tmp: str, total: int, shapes: Dict[str, tuple]) -> None:
    os.mkdir(tmp)
    for name, (dtype, row) in shapes.items():
        arr = np.lib.format.open_memmap(os.path.join(tmp, name + ".npy"), mode="w+", dtype=dtype, shape=(total, *row))
        del arr  # the header and the file's full size are written; ranks fill their rows


def _write_npy(tmp: str, start: int, arrays: Dict[str, np.ndarray]) -> None:
    for name, rows in arrays.items():
        if not len(rows):
            continue
        arr = np.load(os.path.join(tmp, name + ".npy"), mmap_mode="r+")
        arr[start:start + len(rows)] = rows
        arr.flush()
        del arr


def _finish_npy(tmp: str, provenance: Dict) -> None:
    for name in os.listdir(tmp):
        with open(os.path.join(tmp, name), "rb+") as fh:
            os.fsync(fh.fileno())
    with open(os.path.join(tmp, PROVENANCE_FILE), "w", encoding="utf-8") as fh:
        json.dump(dict(provenance, complete=True), fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(tmp)


def read_output(path: str, names: Optional[Sequence[str]] = None) -> tuple:
    """({name: array}, provenance) of a file or directory written by write_rows (for tests and users)."""
    if os.path.isdir(path):
        with open(os.path.join(path, PROVENANCE_FILE), encoding="utf-8") as fh:
            prov = json.load(fh)
        found = sorted(n[:-4] for n in os.listdir(path) if n.endswith(".npy"))
        return {n: np.load(os.path.join(path, n + ".npy")) for n in (names or found)}, prov
    import h5py
    with h5py.File(path, "r") as f:
        prov = json.loads(f.attrs["provenance"])
        return {n: f[n][()] for n in (names or list(f))}, prov
