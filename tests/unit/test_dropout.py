"""Counter-based dropout (granndis_hpc/nn/dropout.py): a mask element is a function of (seed, epoch,
layer, global row id, column) only, so any split of the rows over ranks draws the same masks, and the
models draw them in training (also under activation checkpointing)."""
import numpy as np
import pytest
import torch

from granndis_hpc.nn import LayerGraph, PassSettings, RowDropout, build_model, keep_mask
from granndis_hpc.nn.dropout import keep_elements
from tests.dense_reference import random_in_csr


def test_mask_is_deterministic_and_independent_of_the_row_split():
    ids = torch.randperm(5000, generator=torch.Generator().manual_seed(0))[:3000]
    whole = keep_mask(7, 3, 2, ids, 33, 0.5)
    assert torch.equal(whole, keep_mask(7, 3, 2, ids.clone(), 33, 0.5))
    # Rows drawn in any order and any pieces (as ranks hold them) get the rows' own masks.
    perm = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(1))
    pieces = torch.cat([keep_mask(7, 3, 2, part, 33, 0.5) for part in torch.tensor_split(ids[perm], 5)])
    assert torch.equal(pieces, whole[perm])
    # A narrower tensor sees the first columns of the same mask (columns are counters too).
    assert torch.equal(keep_mask(7, 3, 2, ids, 10, 0.5), whole[:, :10])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_and_independence(p):
    keep = keep_mask(0, 0, 1, torch.arange(20000), 64, p).double()
    n = keep.numel()
    # Binomial standard error of the mean is sqrt(p(1-p)/n) ~ 0.0014: 6 sigma.
    assert abs(keep.mean().item() - (1 - p)) < 6 * (p * (1 - p) / n) ** 0.5
    # No structure along rows or columns: every column and every block of rows keeps ~1-p.
    assert (keep.mean(dim=0) - (1 - p)).abs().max() < 0.02
    assert (keep.view(100, -1).mean(dim=1) - (1 - p)).abs().max() < 0.03
    # Adjacent columns and adjacent rows are uncorrelated.
    for a, b in ((keep[:, :-1], keep[:, 1:]), (keep[:-1], keep[1:])):
        corr = np.corrcoef(a.reshape(-1).numpy(), b.reshape(-1).numpy())[0, 1]
        assert abs(corr) < 0.01


def test_masks_differ_per_seed_epoch_and_layer():
    ids = torch.arange(4000)
    base = keep_mask(0, 0, 1, ids, 16, 0.5)
    for other in (keep_mask(1, 0, 1, ids, 16, 0.5), keep_mask(0, 1, 1, ids, 16, 0.5),
                  keep_mask(0, 0, 2, ids, 16, 0.5)):
        agree = (other == base).double().mean().item()
        assert abs(agree - 0.5) < 0.02, agree  # independent masks agree on half the elements


def test_row_dropout_scales_kept_values_and_uses_prefix_ids():
    h = torch.rand(50, 8) + 0.5
    ids = torch.arange(1000, 1100)
    out = RowDropout(3, 4, ids)(2, h, 0.25)
    keep = keep_mask(3, 4, 2, ids[:50], 8, 0.25)
    torch.testing.assert_close(out, torch.where(keep, h / 0.75, torch.zeros(())))
    # Per-layer ids: layer 1 reads the second tensor; a layer past the last reads the last.
    per_layer = [torch.arange(50), ids]
    assert torch.equal(RowDropout(3, 4, per_layer)(1, h, 0.25), RowDropout(3, 4, ids)(1, h, 0.25))
    assert torch.equal(RowDropout(3, 4, per_layer)(5, h, 0.25), RowDropout(3, 4, ids)(5, h, 0.25))
    # No ids: the rows are vertices 0..n-1 (single process on the whole graph).
    assert torch.equal(RowDropout(3, 4)(2, h, 0.25), RowDropout(3, 4, torch.arange(50))(2, h, 0.25))
    with pytest.raises(ValueError, match="prefix"):
        RowDropout(3, 4, torch.arange(10))(0, h, 0.5)
    assert RowDropout(3, 4)(0, h, 0.0) is h


def _graph(n=120, features=6):
    rng = np.random.default_rng(3)
    indptr, indices = random_in_csr(n, 500, rng, isolated=4)
    return LayerGraph.from_csr(indptr, indices, n), torch.from_numpy(rng.standard_normal((n,
                                                                                          features)).astype(np.float32))


@pytest.mark.parametrize("name", ["sage", "gcn", "ressage"])
def test_models_draw_the_keyed_masks(name):
    """Training with a RowDropout is a function of its key: the same key gives the same logits whatever
    torch's generator, another epoch gives others; eval ignores it."""
    graph, x = _graph()
    torch.manual_seed(0)
    model = build_model(name, 6, 16, 3, 3, dropout=0.5).train()
    graphs = [graph] * 3
    torch.manual_seed(1)
    a = model(x, graphs, dropout=RowDropout(5, 2))
    torch.manual_seed(2)
    b = model(x, graphs, dropout=RowDropout(5, 2))
    c = model(x, graphs, dropout=RowDropout(5, 3))
    assert torch.equal(a, b) and not torch.allclose(a, c)
    model.eval()
    assert torch.equal(model(x, graphs, dropout=RowDropout(5, 2)), model(x, graphs))


def test_checkpointed_ressage_recomputes_the_same_masks():
    """torch.utils.checkpoint recomputes each block in backward: the gradients equal the plain run's."""
    graph, x = _graph()
    torch.manual_seed(0)
    model = build_model("ressage", 6, 16, 3, 4, dropout=0.5).train()
    grads = []
    for ckpt in (False, True):
        model.zero_grad()
        model(x, [graph] * 4, dropout=RowDropout(1, 7),
              settings=PassSettings(checkpoint_activations=ckpt)).square().sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-6, atol=1e-7)


def _reference_mask(seed, epoch, layer, ids, width, p):
    """keep_mask recomputed in NumPy uint64 arithmetic from its definition: splitmix64 keys and row
    starts, word j of a row = finaliser(start + (j + 1) * golden), column c = 16-bit lane c % 4 of word
    c // 4 (bits 16(c % 4)..+15) read as a signed int16, kept iff >= round(p 2^16) - 2^15."""
    golden = np.uint64(0x9E3779B97F4A7C15)

    def fin(z):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        key = fin(np.uint64(seed) * golden + np.uint64(1))
        key = fin(key ^ (np.uint64(epoch) * golden + np.uint64(2)))
        key = fin(key ^ (np.uint64(layer % 2 ** 64) * golden + np.uint64(3)))
        start = fin(ids.numpy().astype(np.int64).view(np.uint64) * golden + key)
        cols = np.arange(width)
        words = fin(start[:, None] + (cols // 4 + 1).astype(np.uint64) * golden)
    lanes = ((words >> (np.uint64(16) * (cols % 4).astype(np.uint64))) & np.uint64(0xFFFF)).astype(np.int64)
    signed = np.where(lanes >= 2 ** 15, lanes - 2 ** 16, lanes)
    return torch.from_numpy(signed >= round(p * 65536) - 2 ** 15)


@pytest.mark.parametrize("width,p", [(1, 0.5), (7, 0.1), (64, 0.37)])
def test_mask_equals_its_definition_in_numpy(width, p):
    """Row ids of every sign and size (edge dropout keys edges by products of ids: negative int64s)
    and a layer key below 0 (attention dropout's), widths that do and do not fill their last word."""
    ids = torch.cat([torch.arange(300), torch.randint(-2 ** 62, 2 ** 62, (200,),
                                                      generator=torch.Generator().manual_seed(4))])
    for layer in (2, -3):
        expected = _reference_mask(11, 5, layer, ids, width, p)
        assert torch.equal(keep_mask(11, 5, layer, ids, width, p), expected)
        rows, cols = torch.nonzero(torch.ones(ids.shape[0], width), as_tuple=True)
        assert torch.equal(keep_elements(11, 5, layer, ids, rows, cols, p), expected[rows, cols])


def test_lanes_of_one_hash_and_successive_epochs_are_independent():
    """Four columns share a 64-bit hash: every pair of them (lags 1-3) and the same element in
    consecutive epochs (the training steps) agree as often as independent masks do."""
    keep = keep_mask(0, 0, 1, torch.arange(20000), 64, 0.5).double()
    for lag in (1, 2, 3, 4):
        corr = np.corrcoef(keep[:, :-lag].reshape(-1).numpy(), keep[:, lag:].reshape(-1).numpy())[0, 1]
        assert abs(corr) < 0.01, (lag, corr)
    steps = torch.stack([keep_mask(0, epoch, 1, torch.arange(2000), 64, 0.5) for epoch in range(8)]).double()
    corr = np.corrcoef(steps[:-1].reshape(-1).numpy(), steps[1:].reshape(-1).numpy())[0, 1]
    assert abs(corr) < 0.01, corr


def test_keep_rate_is_one_minus_p_rounded_to_2_pow_minus_16():
    """p within 2^-17 of 1 keeps nothing (no lane reaches the threshold); p = 0 keeps everything."""
    ids = torch.arange(1000)
    assert not keep_mask(0, 0, 1, ids, 8, 1 - 2 ** -18).any()
    assert keep_mask(0, 0, 1, ids, 8, 0.0).all()
    assert not keep_elements(0, 0, 1, ids, ids, ids % 8, 1 - 2 ** -18).any()
