"""The progress thread's polling knob (cluster/pending.py, GRANNDIS_PROGRESS_POLL): parsed or refused."""
import pytest

from granndis_hpc.cluster.pending import _poll_from_env


def test_poll_knob_parses_a_fixed_interval_and_a_back_off():
    assert _poll_from_env("0.005") == (0.005, 1.0, 0.005)
    assert _poll_from_env("0.001,2,0.016") == (0.001, 2.0, 0.016)


@pytest.mark.parametrize("text", ["x", "0", "0.002,2,0.001", "0.001,0.5,0.01", "0.001,2"])
def test_poll_knob_refuses_bad_values(text):
    with pytest.raises(ValueError, match="GRANNDIS_PROGRESS_POLL"):
        _poll_from_env(text)
