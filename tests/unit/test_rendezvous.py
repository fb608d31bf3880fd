"""cluster/rendezvous.py: the address the ranks reach rank 0's torch.distributed store at."""
from granndis_hpc.cluster.rendezvous import rendezvous_address


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
    from granndis_hpc.startup_options import master_addr

    env = {"MASTER_ADDR": "10.9.9.9"}
    assert master_addr("ib0-n1", env) == ("ib0-n1", "--master-addr")
    assert master_addr(None, env) == ("10.9.9.9", "MASTER_ADDR")
    assert master_addr(None, {}) == ("", "")
    override, source = master_addr("ib0-n1", env)
    assert rendezvous_address(override, True, "n1", _no_route, _no_route, source=source) == ("ib0-n1", "--master-addr")
