"""The keyed dropout mask as a fixed number of tensor operations (nn/dropout.keep_mask): on a GPU each
operation is a kernel launch, so the mask must not be hashed in many small blocks there.  The masks are
those of the former blocked computation, bit for bit (written below as a plain reference), whatever the
block size, and the operations one call dispatches do not grow with the number of elements up to the
device's block."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from granndis_hpc.nn import dropout
from granndis_hpc.nn.dropout import DEVICE_MASK_BLOCK_ELEMENTS, MASK_BLOCK_ELEMENTS, keep_mask, mask_block_elements

M64 = (1 << 64) - 1


def _signed(v):
    v &= M64
    return v - (1 << 64) if v >> 63 else v


def _mix_int(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _mix(z):
    """splitmix64's finaliser on int64 tensors (wrapping multiplication), logical shifts by masking."""
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = (z ^ ((z >> shift) & ((1 << (64 - shift)) - 1))) * _signed(mul)
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def reference_mask(seed, epoch, layer, ids, width, p):
    """The mask as it was computed before: rows in blocks of 2^16 elements, one splitmix64 word per 4
    columns after a per-row start, each column's 16-bit lane against round(p 2^16) - 2^15."""
    golden = 0x9E3779B97F4A7C15
    key = _mix_int(_mix_int(_mix_int(seed * golden + 1) ^ (epoch * golden + 2)) ^ (layer * golden + 3))
    threshold = int(round(p * 65536.0)) - (1 << 15)
    out = torch.zeros((ids.shape[0], width), dtype=torch.bool)
    if threshold > (1 << 15) - 1:
        return out
    starts = _mix(ids.to(torch.int64) * _signed(golden) + _signed(key))
    words = -(-width // 4)
    steps = torch.arange(1, words + 1, dtype=torch.int64) * _signed(golden)
    rows = max(1, (1 << 16) // (words * 4))
    for a in range(0, ids.shape[0], rows):
        z = _mix(starts[a:a + rows, None] + steps[None, :])
        out[a:a + rows] = z.view(torch.int16)[:, :width] >= threshold
    return out


@pytest.mark.parametrize("rows,width", [(1, 1), (7, 3), (1000, 64), (3001, 257), (20000, 33)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0 - 2.0 ** -18])
def test_masks_are_those_of_the_blocked_reference(rows, width, p):
    gen = torch.Generator().manual_seed(rows * 1000 + width)
    ids = torch.randint(0, 1 << 40, (rows,), generator=gen)
    for seed, epoch, layer in ((0, 0, 1), (12345, 7, 3), (2**31 - 1, 999, 0)):
        want = reference_mask(seed, epoch, layer, ids, width, p)
        for block in (None, 4096, MASK_BLOCK_ELEMENTS, DEVICE_MASK_BLOCK_ELEMENTS):
            got = keep_mask(seed, epoch, layer, ids, width, p, block_elements=block)
            assert torch.equal(got, want), (seed, epoch, layer, block)


class _Dispatched(TorchDispatchMode):
    """Counts the aten operations dispatched (each a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops(rows, width, block):
    ids = torch.arange(rows)
    with _Dispatched() as count:
        keep_mask(3, 1, 2, ids, width, 0.5, block_elements=block)
    return count.ops


def test_operations_per_call_do_not_grow_with_the_elements():
    small = _ops(100, 256, DEVICE_MASK_BLOCK_ELEMENTS)
    # 100 k x 256 (25.6 M elements): the size the blocks of 2^16 hashed in ~390 blocks of ~20 operations.
    assert _ops(100_000, 256, DEVICE_MASK_BLOCK_ELEMENTS) == small
    assert _ops(20_000, 33, DEVICE_MASK_BLOCK_ELEMENTS) == small
    assert small <= 40, small  # the per-row starts, the words, the lanes: about 36
    # The CPU's cache-sized blocks grow with the elements (why the device does not use them).
    assert _ops(100_000, 256, MASK_BLOCK_ELEMENTS) > 100 * small


def test_the_block_is_chosen_by_the_device():
    assert mask_block_elements(torch.device("cpu")) == MASK_BLOCK_ELEMENTS
    assert mask_block_elements(torch.device("cuda", 0)) == DEVICE_MASK_BLOCK_ELEMENTS
    assert mask_block_elements("cuda") == dropout.DEVICE_MASK_BLOCK_ELEMENTS
    # A tensor larger than the device's block is hashed in blocks of it: memory bounded, few operations.
    assert DEVICE_MASK_BLOCK_ELEMENTS >= 100_000 * 256


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_masks_are_the_reference_in_a_constant_number_of_operations():
    ids = torch.randint(0, 1 << 40, (3001,), generator=torch.Generator().manual_seed(5))
    for p in (0.1, 0.5):
        got = keep_mask(12345, 7, 3, ids.cuda(), 257, p)
        assert torch.equal(got.cpu(), reference_mask(12345, 7, 3, ids, 257, p))
    counts = []
    for rows in (100, 100_000):
        with _Dispatched() as count:
            keep_mask(3, 1, 2, torch.arange(rows, device="cuda"), 256, 0.5)
        counts.append(count.ops)
    assert counts[0] == counts[1]
