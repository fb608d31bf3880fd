"""Feature rows held at their own type's width (graph/typed_features.py TypedRows), in one process: the
bytes held are the rows' own widths x 4, the rows read back as the padded matrix, the relational models'
projection of them gives the logits of a plain-torch reference computed from the zero-padded matrix, and
the memory model counts them at their own widths."""
import numpy as np
import pytest
import torch

from granndis_hpc.graph.typed_features import TypedRows
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.models import build_model
from tests.hetero_reference import reference_forward
from tests.hetero_widths import COUNTS, type_rows, widths_graph

TYPE_WIDTHS = (7, 12, 5, 5)  # a, b, c, d (derived from c): the types' own widths, in COUNTS' order
WIDEST = 12


@pytest.fixture(scope="module")
def typed():
    graph, arrays = widths_graph()
    return graph, type_rows(arrays)


def _padded(rows) -> np.ndarray:
    """The zero-padded matrix [vertices, widest] in global-id order, from each type's rows."""
    out = np.zeros((sum(COUNTS.values()), WIDEST), dtype=np.float32)
    lo = 0
    for t, w in zip(COUNTS, TYPE_WIDTHS):
        out[lo:lo + COUNTS[t], :w] = rows[t]
        lo += COUNTS[t]
    return out


def _held(graph, gid) -> TypedRows:
    """The rows of ids gid as the reader holds them: from their flat entries (each row's own columns)."""
    kind = graph.types.vertex_type(gid)
    flat = np.concatenate([graph.features[v, :TYPE_WIDTHS[k]] for v, k in zip(gid, kind)])
    return TypedRows.from_flat(flat, graph.types, gid, WIDEST)


def test_held_bytes_are_the_rows_own_widths_and_read_back_padded(typed):
    graph, _ = typed
    gid = np.random.default_rng(1).permutation(graph.num_vertices)  # rows in any order
    held = _held(graph, gid)
    assert held.nbytes == 4 * sum(COUNTS[t] * w for t, w in zip(COUNTS, TYPE_WIDTHS))  # 4400
    assert held.nbytes == sum(b.nbytes for b in held.blocks)
    assert held.shape == (graph.num_vertices, WIDEST) and held.widths == TYPE_WIDTHS
    np.testing.assert_array_equal(held.padded(), graph.features[gid])
    part = held[37:101]
    np.testing.assert_array_equal(part.padded(), graph.features[gid[37:101]])
    kind = graph.types.vertex_type(gid[37:101])
    assert part.nbytes == 4 * int(np.asarray(TYPE_WIDTHS)[kind].sum())
    pick = np.array([5, 130, 0, 77, 139])
    np.testing.assert_array_equal(held.take(pick).padded(), graph.features[gid[pick]])
    assert held.take(pick).nbytes == 4 * int(np.asarray(TYPE_WIDTHS)[graph.types.vertex_type(gid[pick])].sum())
    on = held.to("cpu")
    assert isinstance(on.row_type, torch.Tensor) and on.nbytes == held.nbytes
    assert on[:50].nbytes == held[:50].nbytes
    with pytest.raises(ValueError, match="entries"):
        TypedRows.from_flat(np.zeros(3, np.float32), graph.types, gid, WIDEST)
    # the readers' finiteness check sees each row's own columns
    assert held.all_finite()
    held.blocks[1][3, 11] = np.nan
    bad = np.flatnonzero(~held.finite_rows())
    assert not held.all_finite() and bad.size == 1 and graph.types.vertex_type(gid[bad])[0] == 1


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_projection_of_held_rows_equals_the_padded_matrix_reference(typed, model):
    """Logits of the model fed the rows at their own widths equal a plain-torch reference whose layer 0
    reads each type's columns of the zero-padded matrix (and the model fed that matrix)."""
    graph, rows = typed
    torch.manual_seed(0)
    options = {"rgat": {"heads": 2}}.get(model, {})
    net = build_model(model, graph.num_features, 8, graph.num_classes, 2, dropout=0.0, types=graph.types, **options)
    n = graph.num_vertices
    g = LayerGraph(n, n, torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices),
                   torch.from_numpy(np.diff(graph.indptr)).float(),
                   torch.bincount(torch.from_numpy(graph.indices), minlength=n).float())
    net.eval()
    got = net(_held(graph, np.arange(n)).to("cpu"), [g, g]).detach().double()
    padded = torch.from_numpy(_padded(rows)).double()
    p = {k: v.detach().double() for k, v in net.state_dict().items()}
    x0, lo = torch.zeros(n, 8, dtype=torch.float64), 0
    for t, w in zip(COUNTS, TYPE_WIDTHS):
        x0[lo:lo + COUNTS[t]] = padded[lo:lo + COUNTS[t], :w] @ p[f"inputs.{t}.weight"].T + p[f"inputs.{t}.bias"]
        lo += COUNTS[t]
    want = reference_forward(p, graph.types, graph.indptr, graph.indices, x0, 2, model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    from_matrix = net(torch.from_numpy(graph.features), [g, g]).detach().double()
    torch.testing.assert_close(got, from_matrix, rtol=1e-5, atol=1e-6)


def test_memory_model_counts_held_rows_at_their_own_widths():
    """The views' feature bytes: own rows at the set's mean width (counts x widths / vertices) for a model
    that projects, every row at the widest width for one that reads the padded rows (and its halo's)."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.memory_model.typed_widths import held_width

    counts = tuple(COUNTS.values())
    n_own, n_halo, n_send, layers = 140, 50, 30, 2
    lr = mm.LayerRows(n_own_in=n_own, n_halo=n_halo, n_dst=n_own, nnz=600, n_send=n_send)
    rows = mm.RankRows(rank=0, features=WIDEST, num_classes=3, n_inner=n_own, n_train=30, layers=layers, k=0,
                       world=mm.ViewRows("world", n_own, n_halo, n_send, (lr,) * layers))
    kw = dict(relations=4, type_widths=TYPE_WIDTHS, type_counts=counts)
    rgcn = mm.ModelSpec("rgcn", WIDEST, 8, 3, layers, **kw)
    sage = mm.ModelSpec("sage", WIDEST, 8, 3, layers, **kw)
    own_floats = sum(c * w for c, w in zip(counts, TYPE_WIDTHS))  # 1100: n_own is the set's 140 vertices
    assert held_width(rgcn) * sum(counts) == own_floats
    static = (n_own + n_halo) * 4 + n_send * 8  # degrees and the send list
    assert mm.estimate(rows, rgcn)["breakdown"]["features"] == own_floats * 4 + static
    assert mm.estimate(rows, sage)["breakdown"]["features"] == (n_own + n_halo) * WIDEST * 4 + static
