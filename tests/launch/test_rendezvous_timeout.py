"""A rendezvous address that is not rank 0's host's (--master-addr) stops every rank within seconds, not
after --dist-timeout's 600 s, with an error naming the host, the address tried and where that address came
from; and a job whose servers have one rank each opens no store, so the same address does not matter."""
import re
import time

from tests.conftest import run_mpi

SELFCHECK = ["-m", "granndis_hpc.cluster.selfcheck", "--device", "cpu", "--intra-transport", "gloo"]


def test_an_unreachable_store_address_names_the_host_and_the_address_within_seconds():
    # 192.0.2.1 (TEST-NET-1) is reserved for documentation: no host answers there.  No --dist-timeout.
    started = time.monotonic()
    proc = run_mpi([*SELFCHECK, "--ranks-per-server", "2", "--master-addr", "192.0.2.1"], n=2, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode != 0
    found = re.search(r"^\[rank 0\] ClusterError: host (\S+) \(rank 0\) could not open the torch.distributed "
                      r"store at 192\.0\.2\.1 \(--master-addr\): 192\.0\.2\.1 is not an address of this host "
                      r"\(.*\); give --master-addr with an address of \1", proc.stderr, re.M)
    assert found, proc.stderr[-3000:]
    assert len(re.findall(r"^\[rank \d+\] ClusterError", proc.stderr, re.M)) == 1  # said once, every rank stopped
    assert took < 60, took  # the start-up, not the 600 s of --dist-timeout


def test_servers_of_one_rank_open_no_store_so_the_address_is_never_used():
    proc = run_mpi([*SELFCHECK, "--ranks-per-server", "1", "--master-addr", "192.0.2.1"], n=2, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "selfcheck OK" in proc.stdout, proc.stdout
