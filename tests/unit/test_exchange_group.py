"""The exchange group is one object (cluster/exchange_group.py) that every view takes: its peers, its
count exchange, its ledger links and its wire dtype.  A wire dtype is a property of the group: the same
shard rows planned over the same peers carry their training halo in the group's dtype, while evaluation
and the set-up exchanges stay exact.

The peer is emulated in one process by symmetry: rank 1 holds the same rows as rank 0 and asks for the
same keys, so what rank 0 receives from it is what rank 0 sends it (a mirror transport).  The reference
is the rows themselves: the halo must be h's rows at the requested keys, rounded to the wire dtype and
back in the training phase only."""
import numpy as np
import pytest
import torch

from granndis_hpc.cluster.exchange_group import ExchangeGroup, immediate_start, local_group
from granndis_hpc.engine import views
from granndis_hpc.engine.views import RowSource
from granndis_hpc.nn.dropout import RowDropout

N, WIDTH = 6, 5


def _rows() -> RowSource:
    # Row i reads itself and key (i + 1) % N of the peer (rank 1, emulated): one own and one halo edge.
    rng = np.random.default_rng(3)
    i = np.arange(N)
    return RowSource(
        hop=np.zeros(N, dtype=np.int64), indptr=np.arange(0, 2 * N + 1, 2, dtype=np.int64),
        is_own=np.tile([True, False], N), own_pos=np.repeat(i, 2), peer=np.tile([0, 1], N),
        key=np.stack([i, (i + 1) % N], axis=1).reshape(-1), src_hop=np.zeros(2 * N, dtype=np.int64),
        degree=np.full(N, 2.0, dtype=np.float32), features=rng.standard_normal((N, WIDTH)).astype(np.float32),
        global_id=i.astype(np.int64))


def _mirror_group(wire, sent, name="world"):
    def mirror(send, send_counts, recv_counts, phase="halo"):
        assert list(send_counts) == list(recv_counts)  # symmetric peers
        sent.append((phase, send.dtype))
        return send.clone()
    group = ExchangeGroup(name, 2, mirror, immediate_start(mirror), lambda counts: [int(c) for c in counts],
                          ("intra", "inter"))
    return group.with_wire(wire)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_wire_dtype_is_the_groups(overlap):
    sent_exact, sent_narrow = [], []
    exact = views.build_view(_rows(), _mirror_group(None, sent_exact), 2, all_active=True,
                             resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    narrow = views.build_view(_rows(), _mirror_group(torch.bfloat16, sent_narrow), 2, all_active=True,
                              resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    assert exact.exchange_group.exact and not narrow.exchange_group.exact
    # Set-up (keys, degrees, features) is exact in both: the same exchanges, none narrowed.
    assert sent_exact == sent_narrow and all(dtype != torch.bfloat16 for _, dtype in sent_narrow)
    assert torch.equal(exact.halo_features, narrow.halo_features)

    h = torch.randn(N, WIDTH) * 3 + 0.1  # values bfloat16 cannot hold
    expected = h[(torch.arange(N) + 1) % N]  # row i's halo source: the peer's key (i + 1) % N
    for view, wire in ((exact, None), (narrow, torch.bfloat16)):
        for phase in ("halo", "evaluation"):
            out = view.gather_fn(phase, overlap={"world"} if overlap else ())(1, h)
            if overlap:
                out = torch.cat([out.own, out.halo()])
            halo = out[N:]
            # The plan orders halo rows by key; row i's in-edge reaches key (i + 1) % N among them.
            g = view.graphs[1]
            src = g.indices[g.indptr[:-1] + 1] - N  # each row's halo edge, as a halo-row index
            got = halo[src]
            if phase == "halo" and wire is not None:
                assert torch.equal(got, expected.to(wire).to(torch.float32))
                assert not torch.equal(got, expected)
            else:
                assert torch.equal(got, expected)
    assert ("halo", torch.bfloat16) in sent_narrow and ("evaluation", torch.float32) in sent_narrow
    assert ("halo", torch.bfloat16) not in sent_exact


@pytest.mark.parametrize("name", ["world", "server"])
def test_a_view_overlaps_when_its_group_is_named_in_overlap_halos(name):
    """--overlap-halos: given the set of group names that overlap (config.OVERLAP_HALOS), a view posts
    its halo and hands back PendingRows only when its own group is in it; the rows are the same."""
    from granndis_hpc.options.train_groups import OVERLAP_HALOS
    from granndis_hpc.nn.rows import PendingRows

    view = views.build_view(_rows(), _mirror_group(None, [], name), 2, all_active=True,
                            resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    h = torch.randn(N, WIDTH)
    blocking = view.gather_fn("halo", overlap=())(1, h)
    for setting, groups in OVERLAP_HALOS.items():
        out = view.gather_fn("halo", overlap=groups)(1, h)
        assert isinstance(out, PendingRows) == (name in groups), (setting, name)
        if isinstance(out, PendingRows):
            out = torch.cat([out.own, out.halo()])
        assert torch.equal(out, blocking)
    assert OVERLAP_HALOS["world"] == {"world"}  # the default: only the exchanges that cross servers


def test_float32_is_the_exact_wire_and_the_local_group_moves_nothing():
    group = _mirror_group(torch.float32, [])
    assert group.wire_dtype is None and group.exact and group.halo_wire("halo") is None
    narrow = group.with_wire(torch.float16)
    assert narrow.halo_wire("halo") == torch.float16 and narrow.halo_wire("evaluation") is None
    none = local_group()
    rows = torch.ones(0, 3)
    assert none.exchange(rows, [0], [0]).shape == (0, 3) and none.start(rows, [0], [0]).wait().shape == (0, 3)
    with pytest.raises(ValueError, match="exchange group must be one of"):
        ExchangeGroup("servers", 1, None, None, None, ())


def test_both_view_kinds_hand_dropout_row_ids_per_layer():
    """Step.view is a View or a LayeredView; both give dropout one type (a tuple per layer)."""
    view = views.build_view(_rows(), _mirror_group(None, []), 2, all_active=True,
                            resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    plan = views.LayeredView([view, view])
    assert isinstance(view.layer_row_ids, tuple) and isinstance(plan.layer_row_ids, tuple)
    h = torch.randn(N, 8)
    for layer in (0, 1, 3):
        assert torch.equal(RowDropout(1, 2, view.layer_row_ids)(layer, h, 0.5),
                           RowDropout(1, 2, plan.layer_row_ids)(layer, h, 0.5))


def test_a_layered_plan_pipelines_the_layers_whose_view_overlaps():
    """flx k < L under the default --overlap-halos world: layer 0 on the server view (blocking), layer 1
    on the world view (overlapped).  The plan's gather offers layer 1's boundary rows (so layer 0
    computes and posts them first) and none for a layer whose view does not overlap; with no view
    overlapping there is no boundary at all (the model then runs every conv whole)."""
    server = views.build_view(_rows(), _mirror_group(None, [], "server"), 2, all_active=True,
                              resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    world = views.build_view(_rows(), _mirror_group(None, [], "world"), 2, all_active=True,
                             resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    gather = views.LayeredView([server, world]).gather_fn("halo", overlap={"world"})
    assert torch.equal(gather.boundary(1).first, world.gather_fn("halo", overlap={"world"}).boundary(1).first)
    assert views.LayeredView([world, server]).gather_fn("halo", overlap={"world"}).boundary(1) is None
    assert views.LayeredView([server, world]).gather_fn("halo", overlap=()).boundary is None
    # Posting from the boundary rows hands layer 1 the same rows as the blocking exchange.
    h = torch.randn(N, WIDTH)
    first = gather.boundary(1).first
    gather.post(1, h[first])
    out = gather(1, h)
    assert torch.equal(torch.cat([out.own, out.halo()]), world.gather_fn("halo", overlap=())(1, h))


def test_layer_counts_are_the_plans_rows_and_edges():
    """What the epoch record keeps for the overlap cost model (engine/steps.rows_accounting), by hand:
    each of the N rows has one own edge and one halo edge (key (i + 1) % N of the peer), so every layer
    sends all N rows (the peer asks for every key), receives N halo rows, and has 2N edges, N of them
    from halo rows; a LayeredView takes layer l's counts from layer l's view (its group)."""
    server = views.build_view(_rows(), _mirror_group(None, [], "server"), 2, all_active=True,
                              resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    world = views.build_view(_rows(), _mirror_group(None, [], "world"), 2, all_active=True,
                             resolve_keys=views.key_resolver_server(N), device=torch.device("cpu"))
    per_layer = {"send_rows": N, "halo_rows": N, "edges": 2 * N, "halo_edges": N}
    assert server.layer_counts() == [dict(per_layer, group="server")] * 2
    assert views.LayeredView([server, world]).layer_counts() == [dict(per_layer, group="server"),
                                                                dict(per_layer, group="world")]
