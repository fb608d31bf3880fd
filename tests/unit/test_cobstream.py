"""engine/cobstream.py's rules, with stand-in events: a co-batch reaches its step only with its ready
event, and a retired one is held until the main stream's event has completed."""
import numpy as np
import pytest
import torch

from granndis_hpc.engine import cobstream
from granndis_hpc.engine.cobstream import LoaderStream


def test_a_retired_co_batch_is_held_until_its_event_completes(monkeypatch):
    done = {"value": False}
    monkeypatch.setattr(cobstream.HostEvent, "query", lambda self: done["value"])
    loader = LoaderStream(torch.device("cpu"), emulate=True)
    loader.retire("co-batch 0")
    loader.retire("co-batch 1")
    assert loader.collect() == 2  # the main stream may still read them
    done["value"] = True
    assert loader.collect() == 0 and loader.retired == 2


def test_put_ready_and_wait():
    loader = LoaderStream(torch.device("cpu"), emulate=True)
    with loader.building():
        t = loader.put(np.arange(5), dtype=torch.int64)
        event = loader.ready()
    assert t.tolist() == [0, 1, 2, 3, 4] and loader.puts == 1 and event.query()
    loader.wait(event)
    assert loader.waits == 1
    with pytest.raises(RuntimeError, match="ready event"):
        loader.wait(None)
    plain = LoaderStream(torch.device("cpu"))
    assert not plain.active and plain.ready() is None
    plain.wait(None)
    plain.retire("x")
    assert plain.waits == plain.retired == plain.puts == 0
