"""Reading the files a metadata.json names (our chunked format and DistDGL's), safely.

A metadata file is input like any other: it may name an absolute path, `..`, or a symlink leading out
of the dataset directory (to /etc/shadow, say).  The readers open only regular files whose real path
lies under the directory's real path, check the `.npy` magic before numpy sees the file (so a
non-`.npy` file is never offered to the pickle loader, and numpy's advice to load it unsafely never
reaches the user), and quote at most a short, printable excerpt of what they could not parse.
"""
from __future__ import annotations

import os
import re

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError

NPY_MAGIC = b"\x93NUMPY"
EXCERPT_CHARS = 24


def excerpt(text, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` printable ASCII characters of `text` (others become '?'), '...' when cut."""
    s = "".join(c if " " <= c <= "~" else "?" for c in str(text)[:limit + 1])
    return s if len(s) <= limit else s[:limit] + "..."


def short_error(exc: BaseException, limit: int = 160) -> str:
    """An exception's message with every quoted string cut to a short excerpt (numpy and the csv parser
    quote the offending line whole), the whole at most `limit` characters."""
    msg = re.sub(r"'([^']*)'", lambda m: "'" + excerpt(m.group(1)) + "'", str(exc))
    return excerpt(msg, limit)


def file_under(directory: str, name, meta_path: str) -> str:
    """The path of file `name` listed in `meta_path`, refused unless it resolves (symlinks followed) to
    a location under `directory`."""
    if not isinstance(name, str) or not name:
        raise DataError(f"{meta_path}: file entry {excerpt(repr(name))} is not a file name. Fix: list the "
                        "chunk files by their path relative to the dataset directory")
    path = os.path.join(directory, name)
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    if os.path.isabs(name) or os.path.commonpath([root, real]) != root:
        raise DataError(f"{meta_path}: file {excerpt(name, 80)} lies outside the dataset directory {directory} "
                        f"(it resolves to {excerpt(real, 80)}); only files under the directory are read. Fix: "
                        "move or copy the file into the directory and name it by its relative path")
    return path


def load_npy(path: str, fix: str):
    """Memory-map a `.npy` chunk: a missing file, a file that is not a `.npy`, a truncated one or one
    holding Python objects is a DataError naming the file (pickles are never loaded)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: chunk file not found. Fix: restore it or correct metadata.json")
    try:
        with open(path, "rb") as f:
            magic = f.read(len(NPY_MAGIC))
    except OSError as exc:
        raise DataError(f"{path}: cannot read the chunk ({exc.strerror or exc}). Fix: make it readable "
                        "by this user") from None
    if magic != NPY_MAGIC:
        raise DataError(f"{path}: not a .npy file (no .npy header). Fix: {fix}")
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        why = "it holds Python objects, which are never loaded" if "object" in str(exc).lower() or \
            "pickle" in str(exc).lower() else f"{short_error(exc)}; it is truncated or damaged"
        raise DataError(f"{path}: cannot read the .npy chunk ({why}). Fix: {fix}") from None
    if not isinstance(a, np.ndarray) or a.dtype.hasobject:
        raise DataError(f"{path}: not a plain numeric array. Fix: {fix}")
    return a
