"""Typed sliced sources under `mpirun -n 4` (P = 1, 2, 4 sub-communicators): DistDGL's chunked format
with several node and edge types (derived features included) and IGBH give the whole-graph load's
content digest and types record for any number of build ranks, and the DistDGL directory's 2x2
distributed build verifies."""
import os
import pathlib

import numpy as np
import pytest
from mpi4py import MPI
from tests.mpi.conftest import on_every_rank, on_first_ranks, scratch

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def base():
    for path in scratch("granndis-typed-"):
        yield pathlib.Path(path)


def _digests(source, options, expected_types):
    from granndis_hpc.preprocess.build.sliced import load_slice, slice_digest
    from granndis_hpc.preprocess.sources import sliced_source

    def run(comm):
        part = load_slice(comm, sliced_source(source, **options))
        assert part.types == expected_types
        return slice_digest(comm, part)
    return {WORLD.bcast(on_every_rank(lambda: on_first_ranks(P, run), f"P={P} ")) for P in (1, 2, 4)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("field_width", [8, 5])  # 5: types of different widths (flat features)
def test_distdgl_typed_directory_any_ranks_and_its_2x2_build(base, field_width):
    from granndis_hpc.preprocess.build.distributed import run_build_sliced
    from granndis_hpc.preprocess.build.pipeline import BuildConfig, dataset_digest
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.sources import sliced_source
    from granndis_hpc.preprocess.verify.command import verify_shard_set
    from tests.distdgl_hetero_files import reference, write_distdgl_hetero

    d = base / f"distdgl-{field_width}"
    if WORLD.rank == 0:
        g = write_distdgl_hetero(d, field_width=field_width)
    g = WORLD.bcast(g if WORLD.rank == 0 else None)
    whole = reference(g)
    assert _digests("chunked", dict(path=str(d)), whole.types) == {dataset_digest(whole)}

    def build():
        out = str(base / f"distdgl-{field_width}-2x2")
        part = load_slice(WORLD, sliced_source("chunked", path=str(d)))
        cfg = BuildConfig(out=out, servers=2, gpus_per_server=2, layers=2, preload="full", partitioner="parmetis",
                          seed=1, command="test")
        manifest = run_build_sliced(WORLD, part, cfg)
        assert manifest["dataset"]["content_sha256"] == dataset_digest(whole)
        assert manifest["dataset"]["types"] == whole.types.to_record()
        if WORLD.rank == 0:
            assert verify_shard_set(out) == []
            if field_width != 8:  # each row at its own width, the rank slices the whole graph's rows
                from granndis_hpc.shards import read_manifest, read_rank_slice
                assert whole.types.widths == (8, 8, 5, 8)
                manifest = read_manifest(out)
                for s in range(2):
                    for gpu in range(2):
                        sl = read_rank_slice(out, manifest, s, gpu)  # held at the rows' own widths
                        own = np.take((8, 8, 5, 8), whole.types.vertex_type(sl.global_id))
                        assert sl.features.nbytes == 4 * int(own.sum())
                        assert (sl.features.padded() == whole.features[sl.global_id]).all()
    on_every_rank(build)


@pytest.mark.timeout(240)
def test_igbh_sliced_any_ranks_equals_the_whole_graph_load(base):
    from granndis_hpc.preprocess.build.pipeline import dataset_digest
    from granndis_hpc.preprocess.sources import load
    from tests.unit.test_sources_igbh import write_igbh

    if WORLD.rank == 0:
        write_igbh(base / "igbh", ("paper",))
    WORLD.barrier()
    options = dict(root=str(base / "igbh"), name="tiny")
    whole = load("igbh", **options)
    assert _digests("igbh", options, whole.types) == {dataset_digest(whole)}
    assert os.path.isdir(base / "igbh" / "tiny" / "processed")
