"""The C sparse product (nn/csr_spmm.c through nn/csr_kernel.py) against a NumPy reference."""
import warnings

import numpy as np
import pytest
import scipy.sparse
import torch

from granndis_hpc.nn import csr_kernel
from granndis_hpc.nn.sparse import _csr


def _matrix(n_rows, n_cols, density, dtype, index_dtype, seed):
    rng = np.random.default_rng(seed)
    m = scipy.sparse.random(n_rows, n_cols, density=density, format="csr", random_state=rng,
                            dtype=np.float64)
    m.data = rng.standard_normal(m.nnz)
    m.data[: m.nnz // 10] = 0.0  # explicit zeros stay entries
    if n_rows > 3:
        # An empty row and a row with every column.
        m = m.tolil()
        m[1, :] = 0
        m[2, :] = rng.standard_normal(n_cols)
        m = m.tocsr()
    with warnings.catch_warnings():  # (torch's "beta" and "invariant checks" notes)
        warnings.simplefilter("ignore", UserWarning)
        a = torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)).to(index_dtype),
                                    torch.from_numpy(m.indices.astype(np.int64)).to(index_dtype),
                                    torch.from_numpy(m.data).to(dtype), size=(n_rows, n_cols))
    return a, m.toarray()


@pytest.fixture
def native(monkeypatch):
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "native")
    return csr_kernel.library()


@pytest.mark.parametrize("width", [1, 7, 8, 16, 47, 64, 100, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_numpy(native, width, dtype, index_dtype):
    a, dense = _matrix(300, 200, 0.05, dtype, index_dtype, seed=width)
    h = torch.randn(200, width, dtype=torch.float64, generator=torch.Generator().manual_seed(width)).to(dtype)
    out = csr_kernel.csr_matmul(a, h)
    assert out.dtype == dtype and out.shape == (300, width)
    reference = dense @ h.double().numpy()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(out.double().numpy(), reference, rtol=tol, atol=tol)
    assert torch.equal(out[1], torch.zeros(width, dtype=dtype))


def test_thread_count_does_not_change_the_result(native):
    a, _ = _matrix(5000, 3000, 0.01, torch.float32, torch.int32, seed=1)
    h = torch.randn(3000, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = csr_kernel.csr_matmul(a, h)
        torch.set_num_threads(3)
        three = csr_kernel.csr_matmul(a, h)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)


def test_empty_shapes(native):
    a = _csr(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), (0, 5))
    assert csr_kernel.csr_matmul(a, torch.randn(5, 8)).shape == (0, 8)
    a = _csr(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), (3, 5))
    assert torch.equal(csr_kernel.csr_matmul(a, torch.randn(5, 8)), torch.zeros(3, 8))
    assert csr_kernel.csr_matmul(a, torch.randn(5, 0)).shape == (3, 0)


def test_non_contiguous_operand(native):
    a, dense = _matrix(50, 40, 0.2, torch.float32, torch.int32, seed=3)
    h = torch.randn(64, 40).t()  # [40, 64], column-major
    np.testing.assert_allclose(csr_kernel.csr_matmul(a, h).numpy(), dense @ h.numpy(), rtol=1e-5, atol=1e-5)


def test_torch_choice_and_bad_value(monkeypatch):
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "torch")
    assert csr_kernel.library() is None and csr_kernel.kernel_name() == "torch"
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "fast")
    with pytest.raises(csr_kernel.KernelError, match="GRANNDIS_CSR_KERNEL='fast': choose one of auto, native, torch"):
        csr_kernel.library()


def _untried(monkeypatch, tmp_path):
    monkeypatch.setattr(csr_kernel, "_tried", False)
    monkeypatch.setattr(csr_kernel, "_library", None)
    monkeypatch.setattr(csr_kernel, "_warned", False)
    monkeypatch.setenv("GRANNDIS_KERNEL_CACHE", str(tmp_path))


def test_without_a_compiler(monkeypatch, tmp_path):
    _untried(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "native")
    with pytest.raises(csr_kernel.KernelError, match="no C compiler 'no-such-compiler'.*GRANNDIS_CSR_KERNEL=auto"):
        csr_kernel.library()
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "auto")
    a, dense = _matrix(20, 10, 0.3, torch.float32, torch.int32, seed=4)
    h = torch.randn(10, 4)
    with pytest.warns(UserWarning, match="C sparse product is not available"):
        out = csr_kernel.csr_matmul(a, h)
    np.testing.assert_allclose(out.numpy(), dense @ h.numpy(), rtol=1e-5, atol=1e-5)


def test_builds_into_the_cache_once(monkeypatch, tmp_path):
    _untried(monkeypatch, tmp_path)
    monkeypatch.setenv("GRANNDIS_CSR_KERNEL", "native")
    assert csr_kernel.library() is not None
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(built) == 1 and built[0].startswith("csr_spmm-") and built[0].endswith(".so")
    monkeypatch.setattr(csr_kernel, "_tried", False)
    monkeypatch.setattr(csr_kernel, "_library", None)
    assert csr_kernel.library() is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == built  # loaded, not rebuilt
