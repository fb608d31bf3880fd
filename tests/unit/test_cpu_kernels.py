"""The C kernels (nn/cpu_kernels.c through nn/cpu_kernels.py): the sparse product against a NumPy
reference and torch's product, the keyed dropout against nn/dropout.py's torch definition; loading only
from the installed package, and falling back where the extension is missing."""
import os
import shutil
import subprocess
import sys
import sysconfig
import warnings

import numpy as np
import pytest
import scipy.sparse
import torch

from granndis_hpc.nn import cpu_kernels
from granndis_hpc.nn.dropout import apply_mask, drop_rows, keep_mask
from granndis_hpc.nn.sparse import _csr

from tests.conftest import REPO


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


def _in_entry_order(a, h) -> np.ndarray:
    """a @ h with each row's products added in its entries' order, each product rounded to the dtype
    before it is added (no fused multiply-add): one entry position of every row at a time."""
    crow = a.crow_indices().numpy().astype(np.int64)
    col, val, x = a.col_indices().numpy(), a.values().numpy(), h.numpy()
    lengths = np.diff(crow)
    out = np.zeros((lengths.shape[0], x.shape[1]), dtype=x.dtype)
    for k in range(int(lengths.max(initial=0))):
        rows = np.nonzero(lengths > k)[0]
        entries = crow[rows] + k
        out[rows] += val[entries, None] * x[col[entries]]
    return out


@pytest.fixture
def native(monkeypatch):
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "native")
    return cpu_kernels.library()


@pytest.mark.parametrize("width", [1, 7, 8, 16, 47, 64, 100, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_numpy(native, width, dtype, index_dtype):
    a, dense = _matrix(300, 200, 0.05, dtype, index_dtype, seed=width)
    h = torch.randn(200, width, dtype=torch.float64, generator=torch.Generator().manual_seed(width)).to(dtype)
    out = cpu_kernels.csr_matmul(a, h)
    assert out.dtype == dtype and out.shape == (300, width)
    reference = dense @ h.double().numpy()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(out.double().numpy(), reference, rtol=tol, atol=tol)
    assert torch.equal(out[1], torch.zeros(width, dtype=dtype))
    # Products and sums in the entries' order, no fused multiply-add: bit for bit.  (torch's own product
    # is not the reference: its CPU kernel, MKL's where torch has it, orders and fuses by the CPU's ISA.)
    assert torch.equal(out, torch.from_numpy(_in_entry_order(a, h)))


def test_thread_count_does_not_change_the_result(native):
    a, _ = _matrix(5000, 3000, 0.01, torch.float32, torch.int32, seed=1)
    h = torch.randn(3000, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernels.csr_matmul(a, h)
        torch.set_num_threads(3)
        three = cpu_kernels.csr_matmul(a, h)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)


def test_empty_shapes(native):
    a = _csr(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), (0, 5))
    assert cpu_kernels.csr_matmul(a, torch.randn(5, 8)).shape == (0, 8)
    a = _csr(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), (3, 5))
    assert torch.equal(cpu_kernels.csr_matmul(a, torch.randn(5, 8)), torch.zeros(3, 8))
    assert cpu_kernels.csr_matmul(a, torch.randn(5, 0)).shape == (3, 0)


def test_non_contiguous_operand(native):
    a, dense = _matrix(50, 40, 0.2, torch.float32, torch.int32, seed=3)
    h = torch.randn(64, 40).t()  # [40, 64], column-major
    np.testing.assert_allclose(cpu_kernels.csr_matmul(a, h).numpy(), dense @ h.numpy(), rtol=1e-5, atol=1e-5)


def test_torch_choice_and_bad_value(monkeypatch):
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "torch")
    assert cpu_kernels.library() is None and cpu_kernels.kernel_name() == "torch"
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "fast")
    with pytest.raises(cpu_kernels.KernelError, match="GRANNDIS_CPU_KERNELS='fast': choose one of auto, native, torch"):
        cpu_kernels.library()


def _untried(monkeypatch, extension=cpu_kernels.EXTENSION):
    monkeypatch.setattr(cpu_kernels, "_tried", False)
    monkeypatch.setattr(cpu_kernels, "_library", None)
    monkeypatch.setattr(cpu_kernels, "EXTENSION", extension)


def test_loaded_from_the_installed_package(native):
    from granndis_hpc.nn import _cpu_kernels

    package = os.path.dirname(os.path.abspath(cpu_kernels.__file__))
    assert os.path.dirname(os.path.abspath(native._name)) == package
    assert os.path.samefile(native._name, _cpu_kernels.__file__)
    assert cpu_kernels.dispatch() == _cpu_kernels.dispatch and cpu_kernels.dispatch() != "unknown"


@pytest.mark.parametrize("extension, why", [("granndis_hpc.nn._no_such_kernels", "is not installed"),
                                            ("_ctypes", "not a complete build of the C kernels")])
def test_missing_or_foreign_extension(monkeypatch, extension, why):
    """A missing extension, or a library without the kernels' symbols: an error naming it with `native`,
    torch's ops and one reason (no warning from every call) with `auto`."""
    _untried(monkeypatch, extension)
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "native")
    with pytest.raises(cpu_kernels.KernelError, match=f"{why}.*reinstall granndis-hpc.*GRANNDIS_CPU_KERNELS=auto"):
        cpu_kernels.library()
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "auto")
    a, dense = _matrix(20, 10, 0.3, torch.float32, torch.int32, seed=4)
    h = torch.randn(10, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cpu_kernels.csr_matmul(a, h)
    np.testing.assert_allclose(out.numpy(), dense @ h.numpy(), rtol=1e-5, atol=1e-5)
    assert cpu_kernels.kernel_name() == "torch" and cpu_kernels.dispatch() is None
    reason = cpu_kernels.fallback_reason()
    assert why in reason and "\n" not in reason and "GRANNDIS_CPU_KERNELS=torch" in reason
    monkeypatch.setenv("GRANNDIS_CPU_KERNELS", "torch")
    assert cpu_kernels.fallback_reason() is None


PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("PLANTED_MARKER"), "w");
    if (f) fclose(f);
}
void csr_spmm_f32_i32(void) {}
"""


def test_a_planted_library_is_never_loaded(tmp_path):
    """Libraries another user could place where a run looks (the cache directories a run-time build would
    use, the working directory, the library path) under every name the kernels could have: none is loaded;
    the kernels load with no compiler and write nothing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the planted library with")
    planted = tmp_path / "planted.so"
    (tmp_path / "planted.c").write_text(PLANTED)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(planted), str(tmp_path / "planted.c")], check=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    folders = [tmp_path / "cache" / "granndis_hpc", tmp_path / "kernel-cache", tmp_path / "work",
               tmp_path / "work" / "granndis_hpc" / "nn", tmp_path / "lib"]
    for folder in folders:
        folder.mkdir(parents=True)
        for name in ("_cpu_kernels" + suffix, "_cpu_kernels.so", "cpu_kernels.so", "libcpu_kernels.so",
                     "cpu_kernels-0123456789abcdef.so"):
            shutil.copy(planted, folder / name)
    before = {p for p in tmp_path.rglob("*")}
    env = dict(os.environ, GRANNDIS_CPU_KERNELS="native", GRANNDIS_KERNEL_CACHE=str(tmp_path / "kernel-cache"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path), LD_LIBRARY_PATH=str(tmp_path / "lib"),
               PATH="/nonexistent", CC="no-such-compiler", PLANTED_MARKER=str(tmp_path / "ran"),
               PYTHONPATH=str(REPO))
    code = ("from granndis_hpc.nn import cpu_kernels\n"
            "print(cpu_kernels.kernel_name(), cpu_kernels.library()._name)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "work", env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    name, path = res.stdout.split()
    assert name == "native" and os.path.dirname(path) == os.path.dirname(cpu_kernels.__file__)
    assert not (tmp_path / "ran").exists(), "a planted library was loaded"
    assert {p for p in tmp_path.rglob("*")} == before, "loading the kernels wrote files"


@pytest.mark.parametrize("width", [1, 3, 4, 5, 64, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.99999, 1 - 2 ** -18])  # the last: no lane reaches it
def test_dropout_equals_the_torch_definition(native, width, dtype, p):
    ids = torch.tensor([7, 0, 123456789012, 5, 5, 2 ** 40 + 3], dtype=torch.int64)
    h = torch.randn(ids.shape[0], width, dtype=dtype, generator=torch.Generator().manual_seed(width))
    h[4] = h[3]
    h.requires_grad_(True)
    grad = torch.randn(ids.shape[0], width, dtype=dtype)
    y = drop_rows(11, 3, 2, ids, h, p)
    (gh,) = torch.autograd.grad(y, h, grad)
    h_ref = h.detach().clone().requires_grad_(True)
    y_ref = apply_mask(h_ref, keep_mask(11, 3, 2, ids, width, p), p)
    (gh_ref,) = torch.autograd.grad(y_ref, h_ref, grad)
    assert torch.equal(y, y_ref) and torch.equal(gh, gh_ref)
    assert torch.equal(y[3], y[4])  # a row's mask is a function of its id


def test_dropout_saves_one_float_mask(native):
    h = torch.randn(50, 16, requires_grad=True)
    y = drop_rows(0, 0, 1, torch.arange(50), h, 0.5)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 1 and saved[0].dtype == torch.float32 and saved[0].shape == (50, 16)


def test_dropout_thread_count_does_not_change_the_result(native):
    h = torch.randn(3001, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = drop_rows(1, 2, 3, torch.arange(3001), h, 0.3)
        torch.set_num_threads(3)
        three = drop_rows(1, 2, 3, torch.arange(3001), h, 0.3)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)
