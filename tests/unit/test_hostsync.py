"""cluster/hostsync.py: the counter of host synchronisations (what it counts, from which code) and the
GPU timers' arithmetic, with stand-in events (no GPU here): the ledger's event spans and the layer
clock on `cuda=True` give the same seconds as their CPU timers."""
import os
import threading
import time

import pytest
import torch

from granndis_hpc.cluster import hostsync
from granndis_hpc.cluster.hostsync import SyncCounter, Stopwatch
from granndis_hpc.cluster.ledger import Ledger
from granndis_hpc.cluster.pending import np_view
from tests.conftest import FakeCudaEvent

HERE = os.path.dirname(os.path.abspath(__file__))


def test_counter_records_each_syncing_call_of_the_watched_code_with_its_line():
    t, item = torch.arange(4.0), torch.Tensor.item
    with SyncCounter(package=HERE) as counter:
        t[0].item(), float(t[1]), int(t[2]), bool(t[3] > 0), t.tolist(), t.cpu(), t.numpy()
        t.to("meta")                            # a copy to another device, blocking
        t.to("meta", non_blocking=True)         # posted: not a wait
        t.to(torch.float16), t.to("cpu")        # a cast, the same device: not a copy between devices
        np_view(t)                              # host staging buffers: not counted
    names = [name for name, _ in counter.calls]
    assert names == ["item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy", "to"]
    assert all(where.startswith("unit/test_hostsync.py:") for _, where in counter.calls)
    t[0].item()  # after the block: the functions are restored
    assert len(counter) == 8 and torch.Tensor.item is item


def test_counter_ignores_code_outside_the_package_it_watches_and_other_threads():
    with SyncCounter() as counter:  # granndis_hpc's code only
        torch.arange(3.0).sum().item()
    assert counter.calls == []
    with SyncCounter(package=HERE) as counter:  # a helper thread's wait does not hold up the step
        worker = threading.Thread(target=lambda: torch.arange(3.0).sum().item())
        worker.start()
        worker.join()
    assert counter.calls == []


def test_gpu_timers_read_their_event_spans_once_per_epoch(monkeypatch):
    monkeypatch.setattr(hostsync, "_event", FakeCudaEvent)
    ledger = Ledger()
    with ledger.timed_events("inter", "halo"):
        time.sleep(0.05)
    with ledger.timed_events("intra", "gradient"):
        time.sleep(0.02)
    assert ledger.span_cursor() == 2 and ledger.span_seconds(0, 2) == pytest.approx(0.05, abs=0.04)
    assert 0.045 < ledger.seconds("inter", "halo") < 0.5 and 0.015 < ledger.seconds("intra", "gradient") < 0.5
    ledger.reset()
    assert ledger.total_seconds() == 0.0 and ledger.span_cursor() == 0
    watch = Stopwatch("cuda")
    watch.start()
    time.sleep(0.03)
    assert watch.stop() == 0.0 and 0.025 < watch.collect() < 0.5 and watch.collect() == 0.0
