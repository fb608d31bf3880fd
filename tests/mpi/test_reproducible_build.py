"""Reproducible ParMETIS builds under `mpirun -n 4` (pytest-mpi), on real Cora.

PT-Scotch (threads, and a random state that carries over between calls in one process) gave a
different partition at every call before the fix; now repeated calls and builds in the same processes
give the same partition, the same partition digest and byte-identical server files.  The digest is
checked against one recomputed with hashlib from the owners read back from the files with h5py."""
import hashlib
import os
import shutil

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc.preprocess.build.pipeline import build_shards
from granndis_hpc.preprocess.partition.twolevel import partition_servers
from tests.mpi.conftest import shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


def _digest_from_files(out, S, G, n):
    owner = np.full(n, -1, dtype=np.int64)
    for s in range(S):
        with h5py.File(os.path.join(out, f"server-{s:04d}.h5"), "r") as f:
            inner = f["vertices/hop"][:] == 0
            owner[f["vertices/global_id"][:][inner]] = s * G + f["vertices/owner"][:][inner]
    assert np.all(owner >= 0)
    return hashlib.sha256(np.array([S, G], "<i8").tobytes() + owner.astype("<i4").tobytes()).hexdigest()


@pytest.mark.timeout(120)
def test_repeated_parmetis_partitions_are_identical(cora):
    env_before = os.environ.get("SCOTCH_PTHREAD_NUMBER")
    runs = [partition_servers(WORLD, cora, 4, "parmetis", seed=2).parts for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:]), [np.bincount(r).tolist() for r in runs]
    assert os.environ.get("SCOTCH_PTHREAD_NUMBER") == env_before  # set for the call only
    assert WORLD.allreduce(hashlib.sha256(runs[0].tobytes()).hexdigest(), op=MPI.MAX) == \
        hashlib.sha256(runs[0].tobytes()).hexdigest()  # and equal on every rank


@pytest.mark.timeout(120)
def test_two_parmetis_builds_have_identical_digest_and_files(cora):
    base = shared_tmpdir("granndis-repro-")
    outs = [os.path.join(base, f"build-{i}") for i in range(2)]
    manifests = [build_shards(cora, out, servers=2, gpus_per_server=2, layers=2, partitioner="parmetis",
                              seed=4, comm=WORLD) for out in outs]
    # every rank checks (the manifest is broadcast; the files are read-only here), so every rank fails
    assert manifests[0]["partition_digest"] == manifests[1]["partition_digest"] == \
        _digest_from_files(outs[0], 2, 2, cora.num_vertices)
    assert manifests[0]["files"] == manifests[1]["files"]  # sha256 and size of every server file
    inner = [s["inner_per_gpu"] for m in manifests for s in m["stats"]["servers"]]
    assert inner[:2] == inner[2:]
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(base)
