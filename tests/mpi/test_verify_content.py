"""--verify-content: the job's ranks recompute the dataset content digest from the rows
they read, combined on rank 0 in global-id order, and it must be the build's `dataset.content_sha256`
(preprocess/build/pipeline.py); a row edited on one rank (a label, or a preloaded copy's feature) must change the
outcome on every rank.  Ranges of a few vertices make the combination cross many range boundaries."""
import copy
import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc import shards
from granndis_hpc.shards.content import check_job_content, job_digest

WORLD = MPI.COMM_WORLD


def _slice(path):
    manifest = shards.read_manifest(path)
    g = int(manifest["gpus_per_server"])
    return manifest, shards.read_rank_slice(path, manifest, WORLD.rank // g, WORLD.rank % g)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("preload", ["full", "eas"])
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 4 * 1433 * 37])  # Cora in one range; in 74 ranges
def test_the_job_digest_is_the_builds(cora_shards, preload, chunk_bytes):
    manifest, sl = _slice(cora_shards[(preload, 3)])
    digest, problems = job_digest(WORLD, sl, manifest, chunk_bytes=chunk_bytes)
    assert problems == [] and digest == manifest["dataset"]["content_sha256"]


@pytest.mark.mpi(min_size=4)
def test_an_edited_row_on_one_rank_is_refused_on_every_rank(cora_shards):
    path = cora_shards[("full", 3)]
    manifest, sl = _slice(path)
    # One training label changed on rank 3 (in range: the load checks pass it).
    labels = sl.labels.copy()
    if WORLD.rank == 3:
        row = int(np.flatnonzero(sl.train_mask[: sl.n_inner])[0])
        labels[row] = (labels[row] + 1) % int(manifest["dataset"]["num_classes"])
    edited = dataclasses.replace(sl, labels=labels)
    with pytest.raises(shards.ShardError, match=r"content_sha256 is [0-9a-f]{16}\.\.\. but the server files'.*"
                                                r"preprocess verify"):
        check_job_content(WORLD, edited, manifest, path, chunk_bytes=4 * 1433 * 100)
    # A preloaded copy's feature changed on rank 1: not in the digest, but flx trains on it.
    features = sl.features.copy()
    if WORLD.rank == 1:
        features[sl.n_inner, 0] += 1.0
    copied = dataclasses.replace(sl, features=features)
    with pytest.raises(shards.ShardError, match=r"1 preloaded rows' features differ from their home"):
        check_job_content(WORLD, copied, manifest, path)
    # A set built before the digest was recorded: said, with the fix.
    old = copy.deepcopy(manifest)
    del old["dataset"]["content_sha256"]
    with pytest.raises(shards.ShardError, match="records no dataset.content_sha256"):
        check_job_content(WORLD, sl, old, path)
    check_job_content(WORLD, sl, manifest, path)  # the set as built passes
