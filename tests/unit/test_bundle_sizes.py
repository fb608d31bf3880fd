"""Sizes declared by a bundle are checked against the file before anything is allocated or inflated:
a crafted .npy header declaring 1.56 TiB made the build try to allocate it, and a
zip bomb was inflated for 129 s and built."""
import io
import zipfile

import h5py
import numpy as np
import pytest

from granndis_hpc.preprocess.sources.canonical import DataError
from granndis_hpc.preprocess.sources import load
from granndis_hpc.preprocess.sources.bundle import MAX_COMPRESSION_RATIO, check_declared_sizes


def _npy(shape, dtype=np.float32, data=b""):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def test_a_header_declaring_more_than_the_file_holds_is_refused_unallocated(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:  # stored: 429496729600 float32 declared, 16 bytes present
        zf.writestr("features.npy", _npy((429496729600, 1), data=b"\0" * 16))
        zf.writestr("labels.npy", _npy((4,), np.int64, b"\0" * 32))
    with pytest.raises(DataError, match=r"array 'features' declares 1,717,986,918,\d{3} bytes but the file stores"):
        load("bundle", path=path)


def test_a_decompression_bomb_is_refused_before_it_is_inflated(tmp_path):
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("features.npy", "w") as f:  # 128 MiB of zeros -> ~130 kB compressed
            f.write(_npy((1 << 15, 1024)))
            block = bytes(1 << 24)
            for _ in range(8):
                f.write(block)
    with pytest.raises(DataError, match="of memory available|more than deflate can produce"):
        check_declared_sizes_of(path, memory=64 << 20)  # a machine with 64 MiB free


def check_declared_sizes_of(path, memory):
    from granndis_hpc.preprocess.sources import bundle

    real = bundle._available_memory
    bundle._available_memory = lambda: memory
    try:
        bundle.read_npz(path)
    finally:
        bundle._available_memory = real


def test_compressed_members_that_claim_impossible_ratios_and_h5(tmp_path):
    with pytest.raises(DataError, match="more than deflate can produce"):
        check_declared_sizes("x.npz", [("features", 10 * MAX_COMPRESSION_RATIO * 1000, 1000, True)])
    check_declared_sizes("x.npz", [("features", MAX_COMPRESSION_RATIO * 1000, 1000, True)])  # possible: fine
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features", shape=(1 << 20, 1 << 10), dtype=np.float32)  # declared, never written
        f["labels"] = np.zeros(4, dtype=np.int64)
    with pytest.raises(DataError, match=r"array 'features' declares 4,294,967,296 bytes but the file stores 0"):
        load("bundle", path=path)
