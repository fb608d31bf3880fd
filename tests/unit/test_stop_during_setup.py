"""Stop requests caught before the trainer exists: the early signal handlers are handed to the trainer,
late warnings during shutdown are ignored, and a stop file asks like a signal."""
import os
import signal
import time


def test_early_handlers_are_handed_to_the_trainer_and_late_warnings_ignored():
    """install_early records a signal that comes before the Trainer exists; take_early hands it over.
    After the run, a SIGUSR1 while the ranks shut down is ignored (under Slurm a job that had finished
    its last epoch got the time-limit warning during shutdown and was killed by it: FAILED)."""
    from granndis_hpc.engine import signals

    before = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    try:
        early = signals.install_early()
        assert signals.install_early() is early  # idempotent
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        handed = signals.take_early()
        assert handed is early and handed.received == signal.SIGUSR1
        assert signals.take_early() is not early  # taken once; a new one afterwards
        handed.install()  # the Trainer installs again after set-up: uninstall must still restore the originals
        handed.ignore_warnings_after()
        handed.uninstall()
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_stop_file_asks_like_a_signal(tmp_path, monkeypatch):
    """slurm/lib.sh also creates GRANNDIS_STOP_FILE: srun drops a signal that comes before it started
    the tasks (measured under Slurm 22.05: the job then ran on past its warning)."""
    from granndis_hpc.engine import signals

    stop = tmp_path / "stop"
    monkeypatch.setenv(signals.ENV_STOP_FILE, str(stop))
    s = signals.StopSignals()
    assert not s.requested
    stop.write_text("")
    assert s.requested and s.received is None
    monkeypatch.delenv(signals.ENV_STOP_FILE)
    assert not signals.StopSignals().requested
