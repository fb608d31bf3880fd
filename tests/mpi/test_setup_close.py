"""A Trainer whose set-up fails closes what it had opened: before, an error raised before the
checkpoint set-up (a shard set that cannot serve the mode, a plan error) left the topology's
communicators, the Communicator's private duplicate and the stop handlers behind; an error after a batched
mode's set-up left its loader thread running.  Every rank raises the error together, so every rank
closes together."""
import signal
import threading

import pytest
from mpi4py import MPI

from granndis_hpc.cluster.comm import Communicator
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.cluster.topology import Topology
from granndis_hpc.rundir.lock import RunLock
from tests.mpi.conftest import make_trainer, shared_tmpdir

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


def _loaders():
    return [t for t in threading.enumerate() if t.name.startswith("cobatch-loader") and t.is_alive()]


@pytest.fixture
def closes(monkeypatch):
    """Records every Topology.close and Communicator.close (then does it)."""
    calls = []
    for cls in (Topology, Communicator):
        original = cls.close

        def recording(self, _original=original, _name=cls.__name__):
            calls.append(_name)
            return _original(self)
        monkeypatch.setattr(cls, "close", recording)
    return calls


@pytest.mark.timeout(120)
def test_a_shard_set_the_mode_cannot_use_closes_everything(cora_shards, closes):
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(ClusterError, match="mode eas needs shards built with --preload eas"):
        make_trainer(cora_shards[("full", 3)], "eas")  # raised in the shard checks, before any view
    assert sorted(closes) == ["Communicator", "Topology"]
    assert signal.getsignal(signal.SIGUSR1) == before  # no handler left behind
    WORLD.Barrier()  # the world still works: nothing was left half-closed


@pytest.mark.timeout(120)
def test_a_refused_run_directory_stops_the_batched_modes_loader(cora_shards, closes):
    out = shared_tmpdir("granndis-setup-close-")
    if WORLD.rank == 0:
        open(f"{out}/metrics.jsonl", "w").close()  # a run is there: a new one is refused
    WORLD.Barrier()
    assert not _loaders()
    with pytest.raises(ClusterError, match="already holds a run"):
        make_trainer(cora_shards[("full", 3)], "cob", out=out, batches_per_epoch=2)
    assert not _loaders() and sorted(closes) == ["Communicator", "Topology"]
    if WORLD.rank == 0:  # the run lock was released: another job may take the directory now
        RunLock(out, "check").release()
