"""The GPU branches of host staging (cluster/staging.py), the deferred sends (cluster/pending.MPIProgress)
and the co-batch loader's stream (engine/cobstream.py) run through the CUDA test double
(tests/cuda_double.py), and the double's own rules: an event completes only after the work queued before
it on its stream, a copy writes only after its delay, and a read that no wait orders after a copy is an
error, not a lucky pass."""
import threading

import numpy as np
import pytest
import torch

from granndis_hpc.cluster import deviceops
from granndis_hpc.cluster.pending import MPIProgress
from granndis_hpc.cluster.staging import HostStaging, wait_event
from granndis_hpc.engine.cobstream import LoaderStream
from tests.cuda_double import CudaDouble, DoubleRaceError

CPU = torch.device("cpu")


def test_the_production_seam_is_torch_cuda():
    ops = deviceops.current()
    assert isinstance(ops, deviceops.CudaOps)
    assert ops.streams_on(torch.device("cuda", 0)) and not ops.streams_on(CPU)
    double = CudaDouble()
    with double.installed(check=False):
        assert deviceops.current() is double
    assert deviceops.current() is ops


def test_an_event_completes_only_after_the_copies_queued_before_it():
    double = CudaDouble(delay=0.5)
    with double.installed():
        side = double.new_stream(CPU)
        src, dst = torch.arange(6.0), torch.zeros(6)
        with double.use_stream(side):
            double.copy_(dst, src)
            done = side.record_event()
        assert not done.query()  # the copy sleeps first
        with pytest.raises(DoubleRaceError, match="still writing"):
            dst.sum()  # the host stream reads it with no wait: an error, whatever the timing
        double.current_stream(CPU).wait_event(done)  # the host stream is the host: it waits
        assert done.query() and torch.equal(dst, src)
        assert double.counts["copies"] == 1 and double.counts["query_pending"] == 1


def test_a_racing_read_sees_poison_and_a_late_source_change_is_copied():
    double = CudaDouble(delay=1.0)
    with double.installed(check=False):
        side = double.new_stream(CPU)
        src, dst = torch.ones(4), torch.zeros(4)
        with double.use_stream(side):
            double.copy_(dst, src)
            done = side.record_event()
        for _ in range(1000):  # the copy starts by poisoning the destination
            if torch.isnan(dst).all():
                break
            threading.Event().wait(0.005)
        assert torch.isnan(dst).all() and not done.query()
        src.fill_(7.0)  # changed before the copy read it: the copy takes the new values
        done.synchronize()
        assert torch.equal(dst, torch.full((4,), 7.0))


def test_work_on_a_worker_stream_is_ordered_after_its_copies():
    double = CudaDouble(delay=0.05)
    with double.installed():
        side = double.new_stream(CPU)
        out = {}

        def loader():  # a thread with the stream entered: its operations run in the stream's order
            with double.use_stream(side):
                t = double.upload(torch.arange(5), CPU)
                out["sum"] = int((t * 2).sum())
        thread = threading.Thread(target=loader)
        thread.start()
        thread.join()
        assert out["sum"] == 20 and double.counts["stream_ordered"] >= 1


def test_staging_copies_on_the_side_stream_and_waits_for_them():
    double = CudaDouble(delay=0.3)
    with double.installed():
        staging = HostStaging(CPU)
        assert staging.cuda and staging.copies and not staging.pool.pin
        src = torch.arange(12, dtype=torch.float32).view(3, 4)
        lease, rows, ready = staging.to_host(src)
        assert not ready.query()  # the send must be deferred
        wait_event(ready)
        assert torch.equal(rows, src)
        back = staging.to_device(rows * 1)  # the current stream waits for the copy back: the host does
        assert torch.equal(back, src)
        staging.release(lease)
        c = double.counts
        assert (c["copies"], c["record_stream"], c["side_wait_event"], c["host_wait_event"]) == (2, 2, 2, 1)


def test_deferred_sends_are_posted_after_their_copy_and_see_its_rows():
    double = CudaDouble(delay=0.3)
    with double.installed():
        staging = HostStaging(CPU)
        src = torch.arange(8, dtype=torch.float64)
        lease, rows, ready = staging.to_host(src)
        seen = []
        waiter = MPIProgress([], progress=False, deferred=(ready, lambda: seen.append(rows.clone()) or []))
        assert not seen and not waiter.test()  # the copy is still running: nothing posted
        waiter.wait()
        assert len(seen) == 1 and torch.equal(seen[0], src)
        staging.release(lease)


def test_the_loader_stream_through_the_double():
    double = CudaDouble(delay=0.5)
    with double.installed():
        loader = LoaderStream(CPU)
        assert loader.cuda and loader.active
        made = {}

        def build():
            with loader.building():
                made["labels"] = loader.put(np.arange(10), dtype=torch.int64)
                made["ready"] = loader.ready()
        thread = threading.Thread(target=build, name="cobatch-loader-test")
        thread.start()
        thread.join()
        with pytest.raises(DoubleRaceError):
            made["labels"].sum()  # used before the step's stream waited for the loader: caught
        loader.wait(made["ready"])
        assert made["labels"].tolist() == list(range(10))
        loader.retire(made)
        assert loader.collect() == 0  # the host stream's event: complete once recorded
        assert double.counts["uploads"] == 1 and double.counts["host_wait_event"] == 1


def test_events_and_stream_waits_follow_the_queue():
    double = CudaDouble(delay=0.3)
    with double.installed():
        first, second = double.new_stream(CPU), double.new_stream(CPU)
        dst = torch.zeros(3)
        with double.use_stream(first):
            double.copy_(dst, torch.ones(3))
        second.wait_stream(first)  # second's later work waits for first's copy
        mark = second.record_event()
        assert not mark.query() and not first.query()
        mark.synchronize()
        assert first.query() and torch.equal(dst, torch.ones(3))
        event = double.current_stream(CPU).record_event()
        assert event.query()  # the host stream: complete once recorded
        assert double.counts["side_wait_event"] == 1 and double.counts["event_synchronize"] == 1
