"""Deterministic backward scatter of the halo exchange (engine/exchange.scatter_add_rows) and dropout
masks computed in row blocks (nn/dropout.keep_mask): the same bits as before, less memory / no atomics."""
import numpy as np
import torch

from granndis_hpc.engine.exchange import _rounds, scatter_add_rows, send_index_tensor
from granndis_hpc.nn import dropout


def test_scatter_add_rows_equals_index_add_bit_for_bit_and_rounds_hold_no_repeats():
    rng = np.random.default_rng(0)
    index = torch.from_numpy(rng.integers(0, 50, size=400))  # rows sent to several peers: repeats
    rows = torch.from_numpy(rng.standard_normal((400, 7)).astype(np.float32))
    want = torch.zeros(60, 7).index_add_(0, index, rows)
    got = scatter_add_rows(index, rows, 60)
    assert torch.equal(got, want)
    reference = np.zeros((60, 7))
    np.add.at(reference, index.numpy(), rows.double().numpy())
    np.testing.assert_allclose(got.numpy(), reference, rtol=1e-5, atol=1e-5)
    rounds = _rounds(index)
    assert len(rounds) == int(np.bincount(index.numpy()).max())
    for r in rounds:
        assert index[r].unique().numel() == r.numel()
    assert sorted(torch.cat(rounds).tolist()) == list(range(400))
    assert _rounds(index) is rounds  # built once per index
    planned = send_index_tensor(index.numpy(), "cpu")  # the views': rounds from the host array
    assert [r.tolist() for r in _rounds(planned)] == [r.tolist() for r in rounds]
    assert scatter_add_rows(torch.zeros(0, dtype=torch.int64), torch.zeros(0, 3), 4).abs().sum() == 0


def test_keep_mask_in_blocks_is_the_whole_mask(monkeypatch):
    ids = torch.arange(1000, 1300)
    whole = dropout.keep_mask(3, 1, 2, ids, 37, 0.4)
    monkeypatch.setattr(dropout, "MASK_BLOCK_ELEMENTS", 100)  # blocks of 2 rows, and a short last one
    assert torch.equal(dropout.keep_mask(3, 1, 2, ids, 37, 0.4), whole)
    # the same elements as the sparse path hashes one by one
    rows, cols = torch.meshgrid(torch.arange(300), torch.arange(37), indexing="ij")
    assert torch.equal(dropout.keep_elements(3, 1, 2, ids, rows.reshape(-1), cols.reshape(-1), 0.4),
                       whole.reshape(-1))

