"""Writing a shard set atomically.

Protocol (so an interrupted build never leaves a set that `verify` or a reader accepts, and an old set
survives until the new one is complete):

1. `prepare_output_dir`: refuse a non-empty directory unless overwrite; refuse to overwrite a directory
   that holds anything but this tool's files (server files, manifest, temporaries), so a typo cannot
   clobber unrelated files, while a set killed mid-commit (server files, no manifest) can be replaced
   (granndis_hpc/outputs.py: links, devices, the current directory are refused too).  Temporaries left
   by a killed earlier build are removed.
2. `stage_server_file` (any rank, one call per server): check the free space, write the HDF5 file under
   a hidden temporary name in the output directory, fsync it, hash it.  Nothing visible changes yet.
3. `commit_shard_set` (one rank, after every file is staged): remove the old manifest (from here on the
   directory is not a valid set), rename each staged file to its final name, delete server files the
   new set does not have, then write the new manifest atomically, last.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from ..fsutil import file_mode, fsync_dir
from ..outputs import OutputKind, check_output_place
from .manifest import manifest_digests, sha256_file
from .typed_rows import FLAT_CHUNK_ENTRIES
from .schema import (FORMAT_VERSION, MANIFEST_NAME, ShardError, check_server_arrays, datasets_in,
                     feature_chunk_rows, server_file_name)

_TMP_SUFFIX = ".tmp"


class StreamedDataset:
    """A dataset written in blocks instead of held whole (the distributed build, preprocess/build/dist_server.py):
    its shape and dtype up front, then `blocks`, an iterable of (first row, rows) in row order.  The file
    is byte-identical to one written from the whole array (the same dataset, created and filled before
    the next one, chunked alike).  `drain()` runs the rest of the blocks without writing them: the
    blocks may be collective, so a rank that fails mid-file still takes part in the remaining rounds."""

    def __init__(self, shape, dtype, blocks):
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self._blocks = iter(blocks)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def blocks(self):
        return self._blocks

    def drain(self) -> None:
        for _ in self._blocks:
            pass


@dataclass
class StagedFile:
    name: str  # final name, e.g. server-0000.h5
    tmp_path: str
    sha256: str
    bytes: int


# What this tool writes into a shard directory: the set itself, and the temporaries of an unfinished
# build (staged server files; the staged manifest).
_SET_FILE = re.compile(r"^(server-\d{4}\.h5|" + re.escape(MANIFEST_NAME) + r")$")
_TEMPORARY = re.compile(r"^\.(server-\d{4}\.h5|" + re.escape(MANIFEST_NAME) + r")\..+" + re.escape(_TMP_SUFFIX) + "$")


# The build's spill directories (preprocess/build/sliced.py spilled): a rank killed mid-partition leaves one.
_SPILL_DIR = re.compile(r"^\.granndis-spill-[A-Za-z0-9_]+$")


def leftover_temporaries(out_dir: str) -> list:
    """Names of temporaries an interrupted build left in out_dir (sorted): staged files and spill
    directories."""
    try:
        return sorted(e for e in os.listdir(out_dir) if _TEMPORARY.match(e) or _SPILL_DIR.match(e))
    except FileNotFoundError:
        return []


def temporaries_bytes(out_dir: str, names) -> int:
    """Bytes held by the named temporaries (spill directories counted with their files)."""
    total = 0
    for name in names:
        path = os.path.join(out_dir, name)
        for root, _, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(root, f))
    return total


def lower_bound_set_bytes(num_vertices: int, num_edges: int, num_features: int, label_bytes: int = 8) -> int:
    """Bytes every shard set of a graph needs at least, whatever its layout: each vertex is an inner
    row once (features, label, global id) and each edge is in the world view once (source id, rank,
    in-degree).  Preloaded copies and the stored subgraph come on top.  `label_bytes`: a row's labels
    (8: an int64 class id; a multi-label set's C uint8 entries: C)."""
    return int(num_vertices) * (4 * int(num_features) + int(label_bytes) + 8) + int(num_edges) * (8 + 4 + 8)


def estimate_file_bytes(arrays: dict) -> int:
    """An upper bound of the size of a server file holding `arrays`: their bytes, the features rounded up
    to whole HDF5 chunks (HDF5 allocates a chunk whole: a file of 2999 rows in chunks of 2621 stores
    5242 rows), plus HDF5's metadata (measured well under 64 KiB for the 18 datasets, and chunk indexes
    of ~1 %).  It is reserved on disk before HDF5 writes (reserve_space), so it must not fall short (the
    full-disk tests check it at every file they write)."""
    data = 0
    for name, a in arrays.items():
        shape = a.shape if isinstance(a, StreamedDataset) else np.shape(a)
        nbytes = int(a.nbytes if isinstance(a, StreamedDataset) else np.asarray(a).nbytes)
        if name == "features" and shape[0] > 0:
            rows = feature_chunk_rows(shape[0], shape[1]) if len(shape) == 2 else min(shape[0], FLAT_CHUNK_ENTRIES)
            nbytes = -(-int(shape[0]) // rows) * rows * nbytes // int(shape[0])
        data += nbytes
    return data + data // 50 + (256 << 10)


_FALLOC_FL_KEEP_SIZE = 1


def _fallocate_keep_size(fd: int, offset: int, length: int) -> bool:
    """Linux fallocate(FALLOC_FL_KEEP_SIZE): allocate blocks past the end of file without changing its
    size.  False where unsupported (not Linux, a file system without it); OSError(ENOSPC) when the
    space is not there."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if fn(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def reserve_space(path: str, nbytes: int, what: str) -> None:
    """Reserve `nbytes` of disk for the file at `path` before HDF5 writes it, so that HDF5 itself never
    meets a full disk: its error paths after a failed write have crashed the interpreter (segfault
    at file close, "Can't decrement id ref count").  The reservation is atomic, so writers racing for
    the last free space (ranks writing their server files at once, another job) fail here, cleanly.
    Where the file system cannot reserve, the free-space check before it is all there is."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb+") as f:
            _fallocate_keep_size(f.fileno(), 0, int(nbytes))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise no_space(directory, nbytes, what) from None
        raise


def release_reserve(path: str) -> None:
    """Give back the reserved blocks past the end of the written file (a shrinking truncate frees every
    block past the new end, the reserved ones included)."""
    size = os.path.getsize(path)
    os.truncate(path, size + 1)
    os.truncate(path, size)


def check_writable(directory: str) -> None:
    """ShardError when `directory` is on a read-only file system or this user may not write it."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise ShardError(f"{directory!r} is on a read-only file system (Read-only file system): nothing can be "
                         f"written there; remount it read-write or choose another --out (the set there is unchanged)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ShardError(f"{directory!r} is not writable by this user (Permission denied); fix its permissions or "
                         f"choose another --out (the set there is unchanged)")


def check_free_space(directory: str, needed: int, what: str) -> None:
    """Refuse to start a write that cannot fit, with the numbers (ShardError).  Checked up front
    because HDF5 handles a full disk badly: its error paths have crashed the interpreter.  A directory
    that cannot be written at all is said first: a read-only file system also reports little free
    space, and "No space left" would name the wrong cause."""
    check_writable(directory)
    if shutil.disk_usage(directory).free < needed:
        raise no_space(directory, needed, what)


def no_space(directory: str, needed: int, what: str) -> ShardError:
    """The one-line error of a disk without room for `what` (`needed` bytes) in `directory`."""
    free = shutil.disk_usage(directory).free
    return ShardError(f"not enough free space in {directory!r}: {what} needs about {needed / 2**20:.1f} MiB but "
                      f"{free / 2**20:.1f} MiB are free (No space left on device); free some space or choose "
                      f"another --out (an old set there stays intact)")


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_shard_set(path: str) -> bool:
    """Whether the directory holds a shard set this tool wrote: its manifest.json is a shard manifest, or
    (a build killed mid-commit, between removing the old manifest and writing the new one) its server
    files are HDF5 files."""
    manifest = os.path.join(path, MANIFEST_NAME)
    if os.path.lexists(manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                data = json.load(f)
            return isinstance(data, dict) and "format_version" in data
        except (OSError, ValueError):
            return False
    servers = glob.glob(os.path.join(glob.escape(path), "server-[0-9][0-9][0-9][0-9].h5"))
    return bool(servers) and all(_starts_with(s, _HDF5_SIGNATURE) for s in servers)


def _starts_with(path: str, signature: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(signature)) == signature
    except OSError:
        return False


# What `--overwrite` may replace (granndis_hpc/outputs.py): a directory of set files and nothing else.
# Hidden entries are not touched (the build's own temporaries, removed below, are hidden too).
SHARD_SET = OutputKind(tool="granndis preprocess build", what="a shard set", recognise=is_shard_set,
                       own=lambda name: bool(_SET_FILE.match(name)), ignored=lambda name: name.startswith("."))


def _nearest_directory(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def prepare_output_dir(out_dir: str, overwrite: bool, needed: int = 0, what: str = "") -> list:
    """Check the output directory before any work is done (outputs.check_output_place: a shard set there
    is replaced only with overwrite, anything else never), and that its disk has `needed` bytes free for
    `what`; then create it.  Returns the temporaries of an earlier, interrupted build it removed.  A
    refusal leaves nothing behind: the directory is created only once every check has passed."""
    out_dir = os.fspath(out_dir)
    check_output_place(out_dir, SHARD_SET, overwrite, error=ShardError)
    if needed:
        check_free_space(_nearest_directory(out_dir), needed, what)
    os.makedirs(out_dir, exist_ok=True)
    # Temporaries left by a killed earlier build are invisible to readers; remove them now.
    stale = leftover_temporaries(out_dir)
    for name in stale:
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return stale


def _create_h5(path: str, reserve):
    """h5py.File(path, "w") without a chunk cache.  HDF5 writes the file's first bytes at the create, so a
    disk filled since the free-space check fails there, before the reservation, with HDF5's own multi-line
    error text: said instead as the reservation says it (the file, the space it needs, the space free)."""
    import h5py  # here, not at import (reader._open_server)

    try:
        return h5py.File(path, "w", rdcc_nbytes=0)
    except OSError as exc:
        if reserve is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(os.path.dirname(os.path.abspath(path)), *reserve) from None
        raise


def _write_h5(path: str, server: int, servers: int, gpus_per_server: int, arrays: dict, reserve=None) -> None:
    # track_times=False: no object timestamps (h5py's default, made explicit), so that identical builds
    # write byte-identical files (docs/shard-format.md, "Reproducible builds").
    # rdcc_nbytes=0: no chunk cache, so every chunk is written by create_dataset and a full disk raises
    # there.  With the cache, the chunks were written by close() and HDF5 crashed (segfault in
    # H5D_close) while closing a file whose flush had failed (measured, 2 MB tmpfs).
    with _create_h5(path, reserve) as f:
        if reserve is not None:  # after HDF5's create, whose truncation would give the blocks back
            reserve_space(path, *reserve)
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["server"] = int(server)
        f.attrs["servers"] = int(servers)
        f.attrs["gpus_per_server"] = int(gpus_per_server)
        for name in datasets_in(arrays):
            data = arrays[name]
            if not isinstance(data, StreamedDataset):
                data = np.ascontiguousarray(data)
            chunks = None
            if name == "features" and data.shape[0] > 0:
                chunks = ((feature_chunk_rows(data.shape[0], data.shape[1]), max(1, data.shape[1]))
                          if len(data.shape) == 2 else (min(data.shape[0], FLAT_CHUNK_ENTRIES),))
            if isinstance(data, StreamedDataset):
                dset = f.create_dataset(name, shape=data.shape, dtype=data.dtype, chunks=chunks, track_times=False)
                for start, rows in data.blocks():
                    if rows.shape[0]:
                        dset[start:start + rows.shape[0]] = rows
                    del rows  # not alive while the next block is made (one block in memory, not two)
            else:
                f.create_dataset(name, data=data, chunks=chunks, track_times=False)


def stage_server_file(out_dir: str, server: int, servers: int, gpus_per_server: int, arrays: dict) -> StagedFile:
    """Write one server file under a temporary name in out_dir, fsync and hash it."""
    name = server_file_name(server)
    check_server_arrays(arrays, gpus_per_server, where=name)
    need = estimate_file_bytes(arrays)
    check_free_space(out_dir, need, name)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=_TMP_SUFFIX, dir=out_dir)
    os.close(fd)
    try:
        _write_h5(tmp, server, servers, gpus_per_server, arrays, reserve=(need, name))
        release_reserve(tmp)
        os.chmod(tmp, file_mode())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        return StagedFile(name=name, tmp_path=tmp, sha256=sha256_file(tmp), bytes=os.path.getsize(tmp))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def discard_staged(staged) -> None:
    for s in staged:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(s.tmp_path)


def commit_shard_set(out_dir: str, manifest: dict, staged: list) -> dict:
    """Make the staged files the shard set; the manifest (with their checksums) is written last."""
    out_dir = os.fspath(out_dir)
    names = sorted(s.name for s in staged)
    expected = [server_file_name(s) for s in range(int(manifest["servers"]))]
    if names != expected:
        raise ShardError(f"internal error: staged files {names} but the manifest needs {expected}")
    manifest = dict(manifest)
    manifest["files"] = {s.name: {"sha256": s.sha256, "bytes": s.bytes} for s in sorted(staged, key=lambda s: s.name)}
    manifest.pop("digests", None)
    manifest = json.loads(json.dumps(manifest))  # what a reader will load (tuples -> lists, int keys -> str)
    manifest["digests"] = manifest_digests(manifest)
    old_manifest = os.path.join(out_dir, MANIFEST_NAME)
    # The new manifest is written (and fsynced) before the old set is touched: what follows only
    # renames and deletes, which need no space, so a full disk cannot leave the old set half-replaced.
    fd, manifest_tmp = tempfile.mkstemp(prefix="." + MANIFEST_NAME + ".", suffix=_TMP_SUFFIX, dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(manifest_tmp, file_mode())
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(manifest_tmp)
        if isinstance(exc, OSError):
            raise ShardError(f"cannot write {os.path.join(out_dir, MANIFEST_NAME)} ({exc.strerror or exc}); "
                             f"nothing was replaced: an old set there stays intact; free some space or choose "
                             f"another --out") from None
        raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(old_manifest)
    fsync_dir(out_dir)
    for s in staged:
        os.replace(s.tmp_path, os.path.join(out_dir, s.name))
    for old in glob.glob(os.path.join(out_dir, "server-*.h5")):
        if os.path.basename(old) not in manifest["files"]:
            os.unlink(old)
    fsync_dir(out_dir)
    os.replace(manifest_tmp, old_manifest)
    fsync_dir(out_dir)
    return manifest


def write_shards(out_dir, manifest: dict, server_arrays: dict, overwrite: bool = False) -> dict:
    """Serial convenience: prepare, stage every server file, commit.  Returns the final manifest."""
    out_dir = os.fspath(out_dir)
    prepare_output_dir(out_dir, overwrite)
    staged = []
    try:
        for server in sorted(server_arrays):
            staged.append(stage_server_file(out_dir, server, int(manifest["servers"]),
                                            int(manifest["gpus_per_server"]), server_arrays[server]))
        return commit_shard_set(out_dir, manifest, staged)
    except BaseException:
        discard_staged(staged)
        raise
