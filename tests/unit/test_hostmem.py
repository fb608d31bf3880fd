"""engine/hostmem.py: after keep_freed_host_memory(), a freed 48 MiB tensor's pages are reused by the
next one of its size instead of being returned to the system and faulted in again (glibc Linux only)."""
import resource
import sys

import pytest
import torch

from granndis_hpc.engine import hostmem

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def _faults_of_one_tensor(nbytes):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(nbytes // 4, dtype=torch.float32)
    t.fill_(1.0)  # touch every page
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_freed_pages_are_reused():
    if not hostmem.keep_freed_host_memory():
        pytest.skip("the C library has no mallopt (not glibc)")
    nbytes = 48 << 20
    _faults_of_one_tensor(nbytes)  # the first one faults its pages in
    pages = nbytes // resource.getpagesize()
    # Returned to the system, every page would fault again (12 k of 4 KiB); kept, (almost) none does.
    assert _faults_of_one_tensor(nbytes) < pages // 20
