"""Session fixtures for the MPI suite: real Cora and shard sets built once, on rank 0, with METIS."""
import os
import tempfile

import pytest
from mpi4py import MPI

from tests.conftest import RANKS_PER_SERVER, require_planetoid

WORLD = MPI.COMM_WORLD
# Locality blocks of 64 rows (Cora's parts hold 600-700): every set of the suite has its rows in a block
# order, not by global id, as production sets of realistic size do.  Plans of these sets take the same.
TEST_ROW_BLOCK_ROWS = 64
# GRANNDIS_TEST_HOST_STAGING=1 runs the cluster primitives' tests with the GPU path's host staging
# emulated on the CPU (the trainer's --host-staging).
TEST_HOST_STAGING = os.environ.get("GRANNDIS_TEST_HOST_STAGING", "") not in ("", "0")
# GRANNDIS_TEST_PROGRESS_DIR (set by `make test`): each rank keeps there the test it is in, so a lane whose
# rank crashed says where every rank was (a crashed rank's buffered output is lost, and its fault
# handler's stack can be cut from a long log).
TEST_PROGRESS_DIR = os.environ.get("GRANNDIS_TEST_PROGRESS_DIR", "")


def _progress(state, nodeid):
    if TEST_PROGRESS_DIR:
        with open(os.path.join(TEST_PROGRESS_DIR, f"mpi-rank-{WORLD.rank}"), "w") as f:
            f.write(f"MPI lane, rank {WORLD.rank}: {state} {nodeid}\n")


def pytest_runtest_logstart(nodeid, location):
    _progress("in", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _progress("done with", nodeid)


@pytest.fixture(scope="session")
def cora():
    from granndis_hpc.preprocess.sources import load
    return load("planetoid", name="cora", root=str(require_planetoid()))


def cluster_fixture(shapes):
    """A module-scoped fixture over (GPUs per server, intra transport) shapes: (topology, Communicator,
    its Ledger) on the CPU, closed after the module's tests of that shape."""
    P = WORLD.Get_size()

    @pytest.fixture(scope="module", params=shapes, ids=[f"{P // g}x{g}-{t}" for g, t in shapes])
    def cluster(request):
        from granndis_hpc.cluster import Communicator, Ledger, init_topology

        group, transport = request.param
        topo = init_topology(ranks_per_server=group, device="cpu", intra_transport=transport)
        ledger = Ledger()
        comm = Communicator(topo, ledger, host_staging=TEST_HOST_STAGING)
        yield topo, comm, ledger
        comm.close()
        topo.close()

    return cluster


_run_tmpdir = None  # every shared_tmpdir of this run is inside it; removed when the run ends


def shared_tmpdir(prefix="granndis-test-"):
    """A new temporary directory made by rank 0, its path on every rank (collective over the world).  It is
    inside the run's own directory, which pytest_sessionfinish removes: a run leaves nothing in /tmp."""
    global _run_tmpdir
    if _run_tmpdir is None:
        _run_tmpdir = WORLD.bcast(tempfile.mkdtemp(prefix="granndis-mpi-tests-") if WORLD.rank == 0 else None)
    return WORLD.bcast(tempfile.mkdtemp(prefix=prefix, dir=_run_tmpdir) if WORLD.rank == 0 else None)


def pytest_sessionfinish(session, exitstatus):
    """Rank 0 removes the run's temporary directories once every rank is done with them."""
    if _run_tmpdir is not None:
        import shutil

        WORLD.barrier()
        if WORLD.rank == 0:
            shutil.rmtree(_run_tmpdir, ignore_errors=True)


def scratch(prefix):
    """Generator of a module fixture: shared_tmpdir(prefix), removed by rank 0 once every rank is done."""
    import shutil

    path = shared_tmpdir(prefix)
    yield path
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def on_first_ranks(P, fn):
    """fn(comm) on a communicator of world ranks 0..P-1 (its result there; None on the other ranks)."""
    comm = WORLD.Split(0 if WORLD.rank < P else MPI.UNDEFINED, WORLD.rank)
    if comm == MPI.COMM_NULL:
        return None
    try:
        return fn(comm)
    finally:
        comm.Free()


def on_every_rank(fn, label=""):
    """Run fn() on every rank and return its result.  An exception on any rank (a failed assertion
    included) fails the test on every rank, each saying which ranks failed, instead of leaving the
    others waiting in the next collective."""
    result, error = None, None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 -- gathered so every rank fails, none hangs
        error = f"{label}rank {WORLD.rank}: {exc!r}"
    errors = [e for e in WORLD.allgather(error) if e]
    assert not errors, errors
    return result


def on_rank0(fn, comm=None):
    """Run fn() on rank 0 of `comm` (default: the world) only and return its result on every rank of
    it.  An exception there (a failed assertion included) fails the test on every rank instead of
    leaving the others waiting in their next collective."""
    comm = WORLD if comm is None else comm
    result, error = None, None
    if comm.rank == 0:
        try:
            result = fn()
        except Exception as exc:  # report on every rank instead of hanging the others
            error = repr(exc)
    error = comm.bcast(error)
    assert error is None, error
    return comm.bcast(result)


def build_sets_on_rank0(graph_or_loader, specs, prefix="granndis-test-"):
    """Build one shard set per entry of `specs` ({name: build_shards keywords}) on rank 0 with METIS, for
    2 servers x RANKS_PER_SERVER; returns {name: directory} on every rank.  `graph_or_loader` is a Graph,
    or a callable returning one (so only rank 0 generates it).  A failure is raised on every rank instead
    of leaving the others waiting."""
    from granndis_hpc.preprocess.build.pipeline import build_shards

    base = shared_tmpdir(prefix)
    dirs = {name: os.path.join(base, str(name)) for name in specs}

    def build():
        graph = graph_or_loader() if callable(graph_or_loader) else graph_or_loader
        for name, kwargs in specs.items():
            kwargs = {"servers": WORLD.size // RANKS_PER_SERVER, "gpus_per_server": RANKS_PER_SERVER,
                      "partitioner": "metis", "comm": MPI.COMM_SELF, "seed": 0, "row_block_rows": TEST_ROW_BLOCK_ROWS,
                      **kwargs}
            build_shards(graph, dirs[name], **kwargs)

    on_rank0(build)
    return dirs


@pytest.fixture(scope="session")
def cora_shards(cora):
    """Shard sets keyed by (preload, layers): full 3- and 8-hop, EAS h=1 f=15 for 3 layers."""
    specs = {("full", 3): {}, ("full", 8): {}, ("eas", 3): {"hops": 1, "fanout": 15}}
    dirs = build_sets_on_rank0(cora, {f"cora-{preload}-{layers}": {"preload": preload, "layers": layers, **extra}
                                      for (preload, layers), extra in specs.items()})
    return {(preload, layers): dirs[f"cora-{preload}-{layers}"] for preload, layers in specs}


@pytest.fixture(scope="session")
def cora_shapes(cora, cora_shards):
    """Full 3-hop shard sets of Cora for 2x2 (the session's), 1x4 and 4x1, keyed by ranks per server
    (the other shapes run inside the 4-rank world with --ranks-per-server 4 and 1)."""
    built = build_sets_on_rank0(cora, {f"{WORLD.size // rps}x{rps}": {
        "servers": WORLD.size // rps, "gpus_per_server": rps, "layers": 3, "preload": "full"} for rps in (4, 1)},
        prefix="granndis-shapes-")
    return {2: cora_shards[("full", 3)], 4: built[f"{WORLD.size // 4}x4"], 1: built[f"{WORLD.size}x1"]}


def make_trainer(shards, mode, model="sage", layers=3, **overrides):
    from granndis_hpc.options.train import TrainConfig
    from granndis_hpc.engine.trainer import Trainer
    cfg = dict(shards=shards, mode=mode, model=model, layers=layers, hidden=16, epochs=1, lr=0.01,
               dropout=0.0, eval_every=0, ranks_per_server=RANKS_PER_SERVER, quiet=True)
    cfg.update(overrides)
    return Trainer(TrainConfig(**cfg))


def counted_steps(trainer, **counter_options):
    """Each step of one more epoch under its own SyncCounter(**counter_options): the counters, in step order."""
    from granndis_hpc.cluster.hostsync import SyncCounter

    counters, step = [], trainer.train_step

    def counted(s):
        with SyncCounter(**counter_options) as counter:
            out = step(s)
        counters.append(counter)
        return out
    trainer.train_step = counted
    try:
        trainer.train_epoch()
    finally:
        trainer.train_step = step
    return counters


def view_logits(trainer):
    """Rank 0: the eval-mode logits of every inner vertex by global id, from the training view and from the
    evaluation (world) view, (training, evaluation); (None, None) elsewhere.  Collective."""
    import torch

    trainer.model.eval()
    with torch.no_grad():
        return tuple(gather_by_global_id(trainer, trainer.logits(view, phase))
                     for view, phase in ((trainer.train_view, "halo"), (trainer.world_view, "evaluation")))


def assert_views_close(views, want, label, tolerance=1e-5):
    """Both of view_logits' arrays within `tolerance` of `want`, relative to its largest magnitude."""
    for name, rows in zip(("training view", "evaluation"), views):
        err = abs(rows - want).max() / abs(want).max()
        assert err < tolerance, f"{label} {name}: max relative error {err:.3e}"


def logits_then_training(trainer):
    """(logits before training gathered by global id, parameters after trainer.run(), the evaluation's
    scores): what the exchange tests compare between two ways of running the same model."""
    import torch

    trainer.model.eval()
    with torch.no_grad():
        logits = gather_by_global_id(trainer, trainer.logits(trainer.train_view, "halo"))
    trainer.model.train()
    trainer.run()
    scores = trainer.evaluate()
    return logits, {k: v.detach().clone() for k, v in trainer.model.named_parameters()}, scores


def gather_by_global_id(trainer, values):
    """Rank 0 gets the rows of every rank's inner vertices (e.g. logits), placed by global id; None elsewhere."""
    import numpy as np

    gid = trainer.slice.global_id[: trainer.slice.n_inner]
    parts = WORLD.gather((gid, values.detach().double().cpu().numpy()), root=0)
    if WORLD.rank != 0:
        return None
    out = np.zeros((sum(g.size for g, _ in parts), parts[0][1].shape[1]))
    for g, v in parts:
        out[g] = v
    return out
