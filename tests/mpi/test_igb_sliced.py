"""IGB's files as the distributed build's input under `mpirun -n 4`: every rank reads its slice of the
memory-mapped files, and the canonical graph the ranks make together (assembled) and its content digest
equal the whole-graph loader's on one rank, for P = 4 and P = 3 (uneven slices); a damaged file fails
every rank with the file's name."""
import shutil
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from tests.mpi.conftest import on_every_rank, on_rank0, shared_tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def igb_root():
    from tests.unit.test_sources_reddit_igb import igb_raw, write_igb

    path = shared_tmpdir("granndis-igb-")
    on_rank0(lambda: write_igb(Path(path), igb_raw(seed=14)) and None)
    yield path
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P", [4, 3])
def test_igb_slices_make_the_whole_graph(igb_root, P):
    from granndis_hpc.preprocess.build.pipeline import dataset_digest
    from granndis_hpc.preprocess.build.sliced import assemble, load_slice, slice_digest
    from granndis_hpc.preprocess.sources import load, sliced_source
    from tests.unit.test_sources_bundle import graphs_equal

    comm = WORLD.Split(0 if WORLD.rank < P else MPI.UNDEFINED, WORLD.rank)

    def check():
        if comm == MPI.COMM_NULL:
            return
        try:
            source = sliced_source("igb", root=igb_root, name="small")
            part = load_slice(comm, source, symmetrize=True, self_loops="add")
            assert part.hi - part.lo in (157 // P, 157 // P + 1)
            whole = load("igb", root=igb_root, name="small", self_loops="add")
            graphs_equal(assemble(comm, part), whole)
            assert slice_digest(comm, part) == dataset_digest(whole)
        finally:
            comm.Free()

    on_every_rank(check, f"P={P} ")


@pytest.mark.timeout(120)
def test_bad_igb_file_fails_every_rank(igb_root):
    from granndis_hpc.cluster import as_group
    from granndis_hpc.preprocess.build.sliced import load_slice
    from granndis_hpc.preprocess.sources import sliced_source

    bad = igb_root + "-bad"
    edges = Path(bad) / "small" / "processed" / "paper__cites__paper" / "edge_index.npy"

    def damage():
        shutil.copytree(igb_root, bad)
        ei = np.load(edges)
        ei[-1, 1] = 157  # one id out of range, read by the last rank only
        np.save(edges, ei)
    on_rank0(damage)
    with pytest.raises(Exception) as err:  # the same ClusterError on every rank, naming the file
        load_slice(as_group(WORLD), sliced_source("igb", root=bad, name="small"))
    assert "edge_index.npy: edge destination ids span [" in str(err.value), str(err.value)
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(bad, ignore_errors=True)
