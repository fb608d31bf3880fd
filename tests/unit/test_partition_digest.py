"""Reproducible builds: the partition digest (manifest, verify, info) and byte-identical server files.

The digest is checked against an independent reference (struct-packed bytes hashed with hashlib) and
against the owners read back from the HDF5 files with h5py; builds run on real Cora."""
import hashlib
import json
import struct

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc import shards
from granndis_hpc.preprocess.__main__ import main
from granndis_hpc.preprocess.build.pipeline import build_shards
from granndis_hpc.preprocess.partition.twolevel import partition_digest
from granndis_hpc.preprocess.verify.command import verify_shard_set


@pytest.fixture(scope="module")
def cora():
    from granndis_hpc.preprocess.sources import load
    from tests.conftest import require_planetoid

    return load("planetoid", name="cora", root=str(require_planetoid()))


def reference_digest(server_of, gpu_of, S, G):
    """The documented definition, written out with struct (docs/shard-format.md)."""
    owners = [int(s) * G + int(g) for s, g in zip(server_of, gpu_of)]
    return hashlib.sha256(struct.pack("<2q", S, G) + struct.pack(f"<{len(owners)}i", *owners)).hexdigest()


def owners_from_files(out, S, G, n):
    """Global rank of every vertex as an inner row, read straight from the server files."""
    owner = np.full(n, -1, dtype=np.int64)
    for s in range(S):
        with h5py.File(out / shards.server_file_name(s), "r") as f:
            inner = f["vertices/hop"][:] == 0
            owner[f["vertices/global_id"][:][inner]] = s * G + f["vertices/owner"][:][inner]
    assert np.all(owner >= 0)
    return owner


def file_hashes(out, S):
    return [hashlib.sha256((out / shards.server_file_name(s)).read_bytes()).hexdigest() for s in range(S)]


def test_digest_matches_reference_and_tells_partitions_apart():
    rng = np.random.default_rng(3)
    server_of, gpu_of = rng.integers(0, 3, 500), rng.integers(0, 2, 500)
    d = partition_digest(server_of, gpu_of, 3, 2)
    assert d == reference_digest(server_of, gpu_of, 3, 2) and len(d) == 64
    moved = gpu_of.copy()
    moved[123] ^= 1
    assert partition_digest(server_of, moved, 3, 2) != d
    # the same global ranks split as 2 x 3 instead of 3 x 2 are another partition
    ranks = server_of * 2 + gpu_of
    assert partition_digest(ranks // 3, ranks % 3, 2, 3) != d


@pytest.mark.parametrize("partitioner", ["metis", "random"])
def test_identical_builds_have_identical_digest_and_bytes(tmp_path, cora, partitioner, capsys):
    outs = [tmp_path / f"{partitioner}-{i}" for i in range(2)]
    manifests = [build_shards(cora, out, servers=2, gpus_per_server=2, layers=2, partitioner=partitioner,
                              seed=5, comm=MPI.COMM_SELF) for out in outs]
    owner = owners_from_files(outs[0], 2, 2, cora.num_vertices)
    assert manifests[0]["partition_digest"] == reference_digest(owner // 2, owner % 2, 2, 2)
    assert manifests[1]["partition_digest"] == manifests[0]["partition_digest"]
    assert file_hashes(outs[0], 2) == file_hashes(outs[1], 2)
    assert manifests[0]["files"] == manifests[1]["files"]  # sha256 and size of every file
    # no HDF5 object carries a timestamp (the bytes would then depend on when the build ran)
    with h5py.File(outs[0] / "server-0000.h5", "r") as f:
        names = ["/"]
        f.visit(names.append)
        times = {n: (i.ctime, i.mtime, i.atime, i.btime) for n in names for i in [h5py.h5o.get_info(f[n].id)]}
    assert set(times.values()) == {(0, 0, 0, 0)}, times
    assert main(["info", str(outs[0])]) == 0
    assert f"digest {manifests[0]['partition_digest']}" in capsys.readouterr().out


def test_other_seed_other_digest_and_verify_catches_a_wrong_digest(tmp_path, cora):
    a = build_shards(cora, tmp_path / "a", servers=2, gpus_per_server=2, layers=1, partitioner="random",
                     seed=0, comm=MPI.COMM_SELF)
    b = build_shards(cora, tmp_path / "b", servers=2, gpus_per_server=2, layers=1, partitioner="random",
                     seed=1, comm=MPI.COMM_SELF)
    assert a["partition_digest"] != b["partition_digest"]
    assert verify_shard_set(tmp_path / "a") == []
    # A manifest whose digest (and field digests, so read_manifest accepts it) names another partition:
    # only the comparison with the files' owners can catch it.
    path = tmp_path / "a" / "manifest.json"
    m = json.loads(path.read_text())
    m["partition_digest"] = b["partition_digest"]
    m["digests"] = shards.manifest_digests(m)
    path.write_text(json.dumps(m))
    problems = verify_shard_set(tmp_path / "a")
    assert len(problems) == 1 and "partition_digest" in problems[0] and "rebuild" in problems[0]
