"""The Python API under mpirun -n 4 (2 servers x 2 ranks): every rank raises the same one-line error when
one rank's option is bad, when the ranks hold different graphs, or when the engine refuses the set; the
set it builds has the job's shape; and predict()'s gathers hand out every row once."""
import numpy as np
import pytest
from mpi4py import MPI

import granndis_hpc as gd
from tests.mpi.conftest import on_every_rank, shared_tmpdir
from tests.unit.test_api_options import tiny_graph

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def base():
    return shared_tmpdir("granndis-api-")


def _error_on_every_rank(fn):
    """The GranndisError fn() raises, checked to be raised on every rank with one message."""
    try:
        fn()
    except gd.GranndisError as exc:
        error = exc
    else:
        error = None
    messages = WORLD.allgather(None if error is None else (type(error).__name__, str(error)))
    assert all(m is not None for m in messages), messages
    assert len(set(messages)) == 1, messages
    return messages[0]


def test_one_ranks_bad_option_is_every_ranks_error(base):
    extra = {"hiden": 4} if WORLD.rank == 2 else {}
    kind, message = _error_on_every_rank(lambda: gd.build(tiny_graph(), cache_dir=f"{base}/c", layers=1, **extra))
    assert (kind, message) == ("OptionError", "rank 2: build(): unknown option 'hiden' (did you mean 'hidden'?)")


def test_ranks_holding_different_graphs_are_refused(base):
    graph = tiny_graph(seed=WORLD.rank % 2)  # an unseeded split would do the same
    kind, message = _error_on_every_rank(lambda: gd.build(graph, cache_dir=f"{base}/c", layers=1))
    assert kind == "GranndisError" and message.startswith("the ranks hold different graphs (content digests ranks 0,2:")


def test_the_engines_refusal_is_every_ranks_error(base):
    one = gd.build(tiny_graph(), out=f"{base}/one", servers=1, gpus_per_server=1, layers=2, quiet=True)
    kind, message = _error_on_every_rank(lambda: gd.train(one, out=f"{base}/run-refused", layers=2, quiet=True))
    assert kind == "GranndisError"
    assert "built for 1 servers x 1 GPUs per server but this job runs 2 servers x 2 GPUs" in message


@pytest.fixture(scope="module")
def trained(base):
    return gd.train(tiny_graph(), out=f"{base}/run", mode="flx", layers=2, hidden=4, epochs=2, quiet=True)


def test_train_builds_for_the_jobs_shape(trained):
    shape = gd.world()
    assert (shape.size, shape.servers, shape.ranks_per_server) == (4, 2, 2)
    assert (trained.shards.shape, trained.shards.preload, trained.shards.hops) == ("2x2", "full", 2)
    assert trained.rank == WORLD.rank and trained.completed
    assert WORLD.allgather(trained.summary["accuracy"]) == [trained.summary["accuracy"]] * 4


def test_the_gathers_hand_out_every_row_once(trained):
    every = gd.predict(trained, tiny_graph(), quiet=True)
    root = gd.predict(trained, trained.shards, gather="root", quiet=True)
    block = gd.predict(trained, trained.shards, gather="block", quiet=True)

    def check():
        assert every.provenance["shards"] == trained.shards.path  # train()'s set, found in the cache
        np.testing.assert_array_equal(every.global_id, np.arange(60))
        assert len(root) == (60 if WORLD.rank == 0 else 0)
        lo, hi = 60 * WORLD.rank // 4, 60 * (WORLD.rank + 1) // 4
        np.testing.assert_array_equal(block.global_id, np.arange(lo, hi))
        np.testing.assert_array_equal(block.logits, every.logits[lo:hi])
        if WORLD.rank == 0:
            np.testing.assert_array_equal(root.logits, every.logits)

    on_every_rank(check)
