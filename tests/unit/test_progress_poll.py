"""The progress thread's polling knob (cluster/pending.py, GRANNDIS_PROGRESS_POLL): parsed or refused."""
import os

import pytest

from granndis_hpc.cluster.pending import _poll_from_env


def test_poll_knob_parses_a_fixed_interval_and_a_back_off():
    assert _poll_from_env("0.005") == (0.005, 1.0, 0.005)
    assert _poll_from_env("0.001,2,0.016") == (0.001, 2.0, 0.016)


@pytest.mark.parametrize("text", ["x", "0", "0.002,2,0.001", "0.001,0.5,0.01", "0.001,2"])
def test_poll_knob_refuses_bad_values(text):
    with pytest.raises(ValueError, match="GRANNDIS_PROGRESS_POLL"):
        _poll_from_env(text)


def test_wait_wakes_a_sleeping_poller_at_once(monkeypatch):
    """wait() must not sit out the poller's sleep: the thread sleeps on the stop event, so joining it
    takes no longer than its current MPI_Testall (a plain time.sleep made the caller wait for the rest of
    the interval, up to PROGRESS_POLL_MAX_S, at every exchange's wait)."""
    import threading
    import time

    import numpy as np
    from mpi4py import MPI

    from granndis_hpc.cluster import pending

    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("the progress thread needs MPI_THREAD_MULTIPLE")
    monkeypatch.setattr(pending, "PROGRESS_POLL_S", 30.0)  # the poller's first sleep: far past the test
    monkeypatch.setattr(pending, "PROGRESS_POLL_MAX_S", 30.0)
    comm = MPI.COMM_SELF.Dup()
    try:
        got, sent = np.zeros(1000), np.arange(1000, dtype=np.float64)
        waiter = pending.MPIProgress([comm.Irecv(got, source=0, tag=5)], progress=True)
        deadline = time.monotonic() + 5
        while waiter.polls == 0 and time.monotonic() < deadline:  # the poller has polled once, now sleeps
            time.sleep(0.001)
        assert waiter.polls == 1 and any(t.name == "granndis-mpi-progress" for t in threading.enumerate())
        send = comm.Isend(sent, dest=0, tag=5)
        start = time.monotonic()
        waiter.wait()
        took = time.monotonic() - start
        send.Wait()
        assert took < 5.0, f"wait() took {took:.1f} s: it waited for the poller's sleep"
        assert np.array_equal(got, sent)
        assert not any(t.name == "granndis-mpi-progress" for t in threading.enumerate())
    finally:
        comm.Free()


def test_a_bad_poll_setting_is_the_one_line_error_of_the_job_not_an_import_traceback(tmp_path):
    """GRANNDIS_PROGRESS_POLL=abc raised at import: a traceback on every rank before the message."""
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.unit.test_shards import build, make_graph

    build(make_graph(n=120, m=400), tmp_path / "set", servers=1, gpus_per_server=1, layers=3)
    env = dict(os.environ, GRANNDIS_PROGRESS_POLL="abc")
    res = subprocess.run([sys.executable, "-m", "granndis_hpc.cli", "train", "--shards", str(tmp_path / "set"),
                          "--epochs", "1", "--quiet"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr[-3000:]
    assert "GRANNDIS_PROGRESS_POLL='abc': give FIRST_S or FIRST_S,FACTOR,MAX_S" in res.stderr, res.stderr
