"""Atomic file writes: a reader never sees a half-written file, and an interrupted writer leaves
the previous version in place.  Used by shard writing, checkpoints and run-directory outputs."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile


def fsync_dir(path: str) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_mode() -> int:
    """The mode an ordinary new file gets under this process's umask.  mkstemp's files are 0600, which
    would hide shard sets and run files from the group they are shared with."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): read it by setting it, then restore it at once
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(final_path: str):
    """Yield a temporary path in the same directory; on success fsync it and rename it to final_path.

    On an exception the temporary file is removed and final_path is untouched.
    """
    directory = os.path.dirname(os.path.abspath(final_path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(final_path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), file_mode())  # as open() would have created it: honour the umask
            os.fsync(f.fileno())
        os.replace(tmp, final_path)
        fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_temporaries(directory: str, names) -> list:
    """Delete atomic_path's temporaries of the given file names in `directory` (".NAME.*.tmp", left by
    a writer that was killed before its rename); returns what was deleted.  Only safe while no other
    process writes those files (the trainer holds the run directory's lock)."""
    removed = []
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.endswith(".tmp") and any(entry.startswith("." + name + ".") for name in names):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))
                removed.append(entry)
    return sorted(removed)


def atomic_write_bytes(final_path: str, data: bytes) -> None:
    with atomic_path(final_path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_json(final_path: str, obj) -> None:
    atomic_write_bytes(final_path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json_object(path: str, error=ValueError, where: str = "", not_found_hint: str = "") -> dict:
    """Load a JSON object from `path`; otherwise raise `error` with a message that names the file
    (`where`, default the path): missing, unreadable, or not an object."""
    where = where or path
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise error(f"{where} not found{not_found_hint}") from None
    except (OSError, ValueError) as exc:
        raise error(f"{where} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{where} must hold a JSON object, found {type(data).__name__}")
    return data
