"""cluster/rendezvous.py: the address the ranks reach rank 0's torch.distributed store at."""
import socket
import time

import pytest

from granndis_hpc.cluster.rendezvous import CONNECT_S, connect_seconds, rendezvous_address


def _no_route():
    raise AssertionError("the default route is not consulted here")


def test_override_then_loopback_on_one_host_then_the_name_mpi_reports():
    assert rendezvous_address("10.1.2.3", False, "n1", _no_route, _no_route)[0] == "10.1.2.3"
    assert rendezvous_address("", True, "n1", _no_route, _no_route)[0] == "127.0.0.1"
    address, how = rendezvous_address("", False, "n1", lambda h: {"n1": "192.168.7.1"}[h], _no_route)
    assert address == "192.168.7.1" and "n1" in how


def test_a_loopback_or_unresolvable_name_falls_back_to_the_default_route():
    def unknown(host):
        raise OSError("unknown host")
    assert rendezvous_address("", False, "n1", lambda h: "127.0.1.1", lambda: "10.0.0.5")[0] == "10.0.0.5"
    assert rendezvous_address("", False, "n1", unknown, lambda: "10.0.0.5")[0] == "10.0.0.5"


def test_the_master_addr_option_wins_over_the_environment_variable():
    from granndis_hpc.options.startup import master_addr

    env = {"MASTER_ADDR": "10.9.9.9"}
    assert master_addr("ib0-n1", env) == ("ib0-n1", "--master-addr")
    assert master_addr(None, env) == ("10.9.9.9", "MASTER_ADDR")
    assert master_addr(None, {}) == ("", "")
    override, source = master_addr("ib0-n1", env)
    assert rendezvous_address(override, True, "n1", _no_route, _no_route, source=source) == ("ib0-n1", "--master-addr")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wrong_store_address_on_loopback_fails_at_once_naming_it():
    """Nothing listens at the address (a refused connection), which torch's client would retry for the
    whole --dist-timeout (600 s by default): one attempt, the address in the error."""
    from granndis_hpc.cluster.rendezvous import open_store

    port = _free_port()
    started = time.monotonic()
    with pytest.raises(OSError, match=rf"connecting to 127\.0\.0\.1:{port}: Connection refused"):
        open_store("127.0.0.1", port, 2, False, connect_s=5.0, timeout_s=600.0)
    assert time.monotonic() - started < 2
    assert connect_seconds(600.0) == CONNECT_S and connect_seconds(3.0) == 3.0


def test_an_address_that_answers_nothing_fails_within_the_connect_deadline():
    from granndis_hpc.cluster.rendezvous import open_store

    started = time.monotonic()
    with pytest.raises(OSError, match=r"connecting to 192\.0\.2\.1:\d+: "):  # TEST-NET-1: nobody there
        open_store("192.0.2.1", 29500, 2, False, connect_s=1.0, timeout_s=600.0)
    assert time.monotonic() - started < 3


def test_rank_0_refuses_an_address_that_is_not_its_hosts():
    from granndis_hpc.cluster.rendezvous import open_store

    started = time.monotonic()
    with pytest.raises(OSError, match=r"192\.0\.2\.1 is not an address of this host"):
        open_store("192.0.2.1", 0, 2, True, connect_s=5.0, timeout_s=600.0)
    assert time.monotonic() - started < 2


def test_a_right_address_connects_and_keeps_the_full_timeout_for_later_waits():
    import datetime

    from granndis_hpc.cluster.rendezvous import open_store

    master = open_store("127.0.0.1", 0, 2, True, connect_s=1.0, timeout_s=600.0)
    client = open_store("127.0.0.1", master.port, 2, False, connect_s=1.0, timeout_s=600.0)
    client.set("k", "v")
    assert master.get("k") == b"v"
    assert client.timeout == master.timeout == datetime.timedelta(seconds=600)
