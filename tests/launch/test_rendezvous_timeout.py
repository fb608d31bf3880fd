"""A rendezvous address nobody answers at (--master-addr) stops every rank within --dist-timeout with
an error naming the host that waited, the address tried and where that address came from."""
import re

from tests.conftest import run_mpi


def test_an_unreachable_store_address_names_the_host_and_the_address():
    # 192.0.2.1 (TEST-NET-1) is reserved for documentation: no host answers there.
    proc = run_mpi(["-m", "granndis_hpc.cluster.selfcheck", "--ranks-per-server", "2", "--device", "cpu",
                    "--intra-transport", "gloo", "--master-addr", "192.0.2.1", "--dist-timeout", "3"],
                   n=2, timeout=120)
    assert proc.returncode != 0
    found = re.search(r"^\[rank 0\] ClusterError: host (\S+) \(rank 0\) could not open the torch.distributed "
                      r"store at 192\.0\.2\.1 \(--master-addr\) within 3 s: .*--dist-timeout for a longer wait",
                      proc.stderr, re.M)
    assert found, proc.stderr[-3000:]
    assert len(re.findall(r"^\[rank \d+\] ClusterError", proc.stderr, re.M)) == 1  # said once, every rank stopped
