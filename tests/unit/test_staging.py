"""cluster/staging.py's pool: buffers lent once at a time, reused when returned (smallest that fits),
held back while a copy still reads them; the emulated staging copies exactly."""
import torch

from granndis_hpc.cluster.staging import HostStaging, PinnedPool


class _Pending:
    def __init__(self):
        self.done = False

    def query(self):
        return self.done


def test_pool_reuses_returned_buffers_and_never_lends_one_a_copy_still_reads():
    pool = PinnedPool(pin=False)
    a = pool.acquire((3, 1000))
    b = pool.acquire((10,), torch.float32)
    assert a.rows.shape == (3, 1000) and b.rows.dtype == torch.float32 and pool.lent == 2
    assert a.buffer.data_ptr() != b.buffer.data_ptr()
    made = pool.allocated_bytes
    copy = _Pending()
    pool.release(a, copy)
    pool.release(b)
    c = pool.acquire((16,))  # both fit: the smallest free one that no copy reads
    assert c.buffer.data_ptr() == b.buffer.data_ptr()
    d = pool.acquire((16,))  # a's buffer is still read: a new one
    assert d.buffer.data_ptr() != a.buffer.data_ptr() and pool.allocated_bytes > made
    pool.release(d)
    copy.done = True
    e = pool.acquire((2, 1500))
    assert e.buffer.data_ptr() == a.buffer.data_ptr() and pool.lent == 2


def test_emulated_staging_copies_out_and_back_exactly():
    st = HostStaging(torch.device("cpu"), emulate=True)
    src = torch.randn(5, 3)
    lease, host, ready = st.to_host(src)
    assert ready is None and torch.equal(host, src) and host.data_ptr() != src.data_ptr()
    into = torch.zeros(5, 3)
    assert st.to_device(host, into=into) is into and torch.equal(into, src)
    st.release(lease)
    assert st.pool.lent == 0 and not HostStaging(torch.device("cpu"), emulate=False).copies
