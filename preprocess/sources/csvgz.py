"""Chunked reading of headerless numeric CSV files, gzip-compressed or plain (the OGB raw layout).

Why not pandas: it is not a dependency.  numpy's C `loadtxt` parses ~40 MB/s of float text and ~70 MB/s
of integer pairs on this machine; ogbn-products' node-feat.csv.gz (~2.4 GB of text) therefore takes
about a minute, acceptable for an offline stage that runs once per dataset.  The file is decompressed
in fixed-size blocks cut at line ends, so memory holds one block of text plus the parsed result (which
is preallocated when the caller knows the row count).
"""
from __future__ import annotations

import gzip
import io
import os
import zlib

import numpy as np

from granndis_hpc.preprocess.sources.canonical import DataError

BLOCK_BYTES = 16 << 20


def _open(path):
    return gzip.open(path, "rb") if os.fspath(path).endswith(".gz") else open(path, "rb")


def _parse(block: bytes, dtype, path, first_line: int) -> np.ndarray:
    try:
        return np.loadtxt(io.BytesIO(block), delimiter=",", dtype=dtype, ndmin=2, comments=None)
    except ValueError as exc:
        last_line = first_line + block.count(b"\n")
        raise DataError(f"{path}: malformed CSV in lines {first_line}..{last_line} "
                        f"({exc}). Fix: every line must hold the same number of comma-separated numbers "
                        "(no header); re-download or re-export the file") from None


def read_csv(path, dtype=np.float64, expected_rows=None, expected_cols=None) -> np.ndarray:
    """The whole file as a 2-D array [rows, cols] of ``dtype``; any defect is a DataError naming the file.

    ``expected_rows`` preallocates the result (and is checked); ``expected_cols`` is checked.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found. Fix: check --root (it must contain raw/ and split/ "
                        "as downloaded from OGB)")
    parts, out, filled, line_no, cols = [], None, 0, 1, expected_cols
    try:
        with _open(path) as f:
            tail = b""
            while True:
                data = f.read(BLOCK_BYTES)
                block = tail + data
                if not data:
                    tail = b""
                else:
                    cut = block.rfind(b"\n") + 1
                    block, tail = block[:cut], block[cut:]
                if block.strip():
                    arr = _parse(block, dtype, path, line_no)
                    if cols is None:
                        cols = arr.shape[1]
                    if arr.shape[1] != cols:
                        raise DataError(f"{path}: lines near {line_no} have {arr.shape[1]} columns, "
                                        f"expected {cols}. Fix: re-download or re-export the file")
                    if expected_rows is not None:
                        if out is None:
                            out = np.empty((expected_rows, cols), dtype=dtype)
                        if filled + arr.shape[0] > expected_rows:
                            raise DataError(f"{path}: more than the expected {expected_rows} rows. Fix: "
                                            "the file does not belong to this dataset (check num-node-list)")
                        out[filled:filled + arr.shape[0]] = arr
                        filled += arr.shape[0]
                    else:
                        parts.append(arr)
                    line_no += block.count(b"\n")
                if not data:
                    break
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: cannot decompress/read ({type(exc).__name__}: {exc}); the file is "
                        "truncated or corrupted. Fix: download it again") from None
    if expected_rows is not None:
        if filled != expected_rows:
            raise DataError(f"{path}: {filled} rows, expected {expected_rows}. Fix: the file is "
                            "truncated or belongs to another dataset; download it again")
        return out if out is not None else np.empty((0, cols or 0), dtype=dtype)
    if not parts:
        return np.empty((0, cols or 0), dtype=dtype)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
