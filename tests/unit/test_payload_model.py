"""fb's partial payloads in the byte model (memory_model/payload.py): the counts per rank pair, the bytes of
--halo-payload partial and smaller, and the options --mode auto and `preprocess plan` offer, against
counts computed here with NumPy from the graph and the shard set's partition."""
import numpy as np
import pytest

from granndis_hpc import memory_model as mm

HIDDEN, CLASSES, FEATURES = 16, 4, 12


@pytest.fixture(scope="module")
def graph():
    from granndis_hpc.preprocess.sources import load

    return load("synthetic", vertices=1500, avg_degree=8.0, features=FEATURES, classes=CLASSES, seed=1)


@pytest.fixture(scope="module")
def shard_set(graph, tmp_path_factory):
    from mpi4py import MPI

    from granndis_hpc.preprocess.build.pipeline import build_shards

    out = tmp_path_factory.mktemp("payload") / "full3"
    build_shards(graph, out, servers=2, gpus_per_server=2, layers=3, partitioner="metis", comm=MPI.COMM_SELF)
    return out


def _owner(path):
    """The owner rank of every vertex (from the set's inner rows' global ids)."""
    from granndis_hpc import shards

    manifest = shards.read_manifest(path)
    parts = []
    for s in range(2):
        for g in range(2):
            sl = shards.read_rank_slice(path, manifest, s, g)
            parts.append(np.asarray(sl.global_id[: sl.n_inner], dtype=np.int64))
    owner = np.full(sum(p.size for p in parts), -1, dtype=np.int64)
    for rank, ids in enumerate(parts):
        owner[ids] = rank
    assert (owner >= 0).all()
    return owner


def _expected(graph, owner, servers=2):
    """[reader, source]: distinct rows the source sends the reader, distinct rows of the reader with an
    in-edge from the source, in-edges of the reader's rows from the source; [reading server, source]:
    distinct rows the source sends a server (the per-server route)."""
    P = int(owner.max()) + 1
    server = np.arange(P) // (P // servers)
    dst = np.repeat(np.arange(owner.size), np.diff(graph.indptr))
    src = np.asarray(graph.indices, dtype=np.int64)
    reader, source = owner[dst], owner[src]
    remote = reader != source
    rows, partials, edges = (np.zeros((P, P), np.int64) for _ in range(3))
    for counts, vertex in ((rows, src), (partials, dst)):
        pairs = np.unique(np.stack([reader[remote], source[remote], vertex[remote]], 1), axis=0)
        np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    np.add.at(edges, (reader[remote], source[remote]), 1)
    once = np.zeros((servers, P), np.int64)
    pairs = np.unique(np.stack([server[reader[remote]], source[remote], src[remote]], 1), axis=0)
    np.add.at(once, (pairs[:, 0], pairs[:, 1]), 1)
    return rows, partials, edges, once, server


def _want(graph, owner, widths, route):
    """payload -> inter-server halo bytes of one epoch: per ordered server pair and exchanging layer
    (w_in, w_msg), rows x w_in (once per reading server on the per-server route) or partials x w_msg,
    'smaller' the fewer; forward and backward, float32."""
    rows, partials, _, once, server = _expected(graph, owner)
    pairs = []
    for a in range(2):
        for b in range(2):
            if a != b:
                reading = (server[:, None] == b) & (server[None, :] == a)
                crossing = once[b, server == a].sum() if route == "per-server" else rows[reading].sum()
                pairs.append((int(crossing), int(partials[reading].sum())))
    return {payload: 2 * 4 * sum(pick(r * w_in, p * w_msg) for w_in, w_msg in widths for r, p in pairs)
            for payload, pick in (("rows", lambda r, p: r), ("partial", lambda r, p: p), ("smaller", min))}


def _model(route="direct", **kw):
    return mm.with_payloads(mm.ModelSpec("sage", FEATURES, HIDDEN, CLASSES, 3, halo_route=route, **kw))


def test_peer_counts_equal_the_graphs(graph, shard_set):
    _, servers = mm.read_shard_set(shard_set)
    rows = {r.rank: r for r in mm.shard_rows(servers, 3, 0, FEATURES, CLASSES)}
    want_rows, want_partials, want_edges, want_once, server = _expected(graph, _owner(shard_set))
    got = {k: np.array([getattr(rows[b].world.peers, k) for b in range(4)])
           for k in ("rows_from", "partials_from", "edges_from", "once_from")}
    assert (got["rows_from"] == want_rows).all() and (got["partials_from"] == want_partials).all()
    assert (got["edges_from"] == want_edges).all()
    across = server[:, None] != server[None, :]  # [reader, source]
    # A row a server reads crosses once, relayed by one of its readers; within a server nothing is relayed.
    relayed = np.where(across, got["once_from"], 0)
    for t in range(2):
        assert (relayed[server == t].sum(axis=0) == np.where(server == t, 0, want_once[t])).all()
    assert (got["once_from"] <= got["rows_from"]).all() and relayed.sum() < want_rows[across].sum()


@pytest.mark.parametrize("route", ["direct", "per-server"])
def test_inter_server_bytes_of_each_payload(graph, shard_set, route):
    """The fb options' inter-server halo bytes per epoch: per ordered server pair and exchanging layer
    (1: 16 -> 16, messages 16; 2: 16 -> 4, messages 4; layer 0 reads the static features), rows x the
    input width or partials x the message width, forward and backward, float32; 'smaller' the fewer."""
    m = _model(route)
    assert m.message_widths == (min(FEATURES, HIDDEN), HIDDEN, CLASSES)
    _, servers = mm.read_shard_set(shard_set)
    s = mm.SetArrays(servers, "full", 3, 3, ks=[0], sample_cobatches=False)
    got = {o.payload: o for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, 2) if o.mode == "fb"}
    assert set(got) == {"rows", "partial", "smaller"}
    widths = [(HIDDEN, HIDDEN), (HIDDEN, CLASSES)]
    owner = _owner(shard_set)
    want = _want(graph, owner, widths, route)
    rows, _, _, once, server = _expected(graph, owner)
    for payload, o in got.items():
        assert o.inter_server_bytes["halo"] == want[payload], (payload, route)
        assert o.inter_server_bytes["gradient"] == got["rows"].inter_server_bytes["gradient"]
        assert o.work.inter_bytes.sum() == want[payload] + o.inter_server_bytes["gradient"]
    assert want["smaller"] < min(want["rows"], want["partial"])  # this graph: partials pay at layer 2 only
    # Intra-server: the same-server rows, plus on the per-server route the rows a relay forwards.
    across = server[:, None] != server[None, :]
    intra = 2 * 4 * sum(w_in for w_in, _ in widths) * int(rows[~across].sum())
    assert got["partial"].work.intra_bytes.sum() == intra
    if route == "direct":
        assert got["rows"].work.intra_bytes.sum() == got["smaller"].work.intra_bytes.sum() == intra
    else:
        relayed = int(rows[across].sum() - sum(once[t, server != t].sum() for t in range(2)))
        assert got["rows"].work.intra_bytes.sum() == intra + 2 * 4 * sum(w for w, _ in widths) * relayed
    assert got["partial"].label == "fb payload=partial"
    assert got["smaller"].train_options() == {"halo_payload": "smaller"} and got["rows"].train_options() == {}
    assert got["partial"].to_dict()["payload"] == "partial"


def test_a_partial_payload_computes_its_rows_part(graph, shard_set):
    """At a layer that receives partials, a rank projects and aggregates its own rows and the halo rows that
    still come as rows (its own server's), over the rows part's edges plus the product of its own rows'
    messages into the partials it sends; the layer below computes its rows unsplit (the partials are sent
    from the layer's own messages): counted here with NumPy from the graph and the partition."""
    m = _model()
    _, servers = mm.read_shard_set(shard_set)
    rows = sorted(mm.shard_rows(servers, 3, 0, FEATURES, CLASSES), key=lambda r: r.rank)
    want_rows, _, edges, _, server = _expected(graph, _owner(shard_set))
    across = server[:, None] != server[None, :]  # [reader, source]
    kept, cut, sent = (np.where(~across, want_rows, 0).sum(axis=1), np.where(across, edges, 0).sum(axis=1),
                       np.where(across, edges, 0).sum(axis=0))
    got = mm.payload.computed_rows(rows, m, 2, "partial")
    for r, g in zip(rows, got):
        assert g.world.layers[0] == r.world.layers[0]  # layer 0 reads the static features: rows
        for l in (1, 2):
            lr = r.world.layers[l]
            want = mm.LayerRows(**{**lr.__dict__, "n_halo": int(kept[r.rank]),
                                   "nnz": int(lr.nnz - cut[r.rank] + sent[r.rank])})
            assert g.world.layers[l] == want, (r.rank, l)
    s = mm.SetArrays(servers, "full", 3, 3, ks=[0], sample_cobatches=False)
    fb = {o.payload: o for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, 2) if o.mode == "fb"}
    # fewer rows projected (layer 1 projects its sources first with its halo in flight, layer 2 narrows),
    # and no layer split boundary-first: the whole step off the overlapped path's split
    assert (fb["partial"].work.row_units < fb["rows"].work.row_units).all()
    assert fb["partial"].work.overlap_shape[1] == 0 < fb["rows"].work.overlap_shape[1]


@pytest.mark.parametrize("change", [dict(name="gat"), dict(name="sage-max"), dict(precision="bf16"),
                                    dict(input_dropout=0.2)])
def test_no_partial_payload_where_the_engine_refuses_it(change):
    kw = dict(change)
    dropout = kw.pop("input_dropout", 0.0)
    m = mm.ModelSpec(kw.pop("name", "sage"), FEATURES, HIDDEN, CLASSES, 3, **kw)
    assert mm.payload_widths(m, dropout) == ()
    for name, widths in (("gcn", (FEATURES, HIDDEN, CLASSES)), ("gin", (FEATURES, HIDDEN, CLASSES)),
                         ("sage-sum", (FEATURES, HIDDEN, CLASSES))):
        assert mm.payload_widths(mm.ModelSpec(name, FEATURES, HIDDEN, CLASSES, 3)) == widths, name


def test_auto_keeps_fb_with_rows_as_the_baseline(shard_set):
    """The time rule prices every payload; a partial payload must beat fb with rows by the margin, and
    fb with rows is never dropped as dominated by one."""
    rates = mm.Rates(inter_Bps=1e3, intra_Bps=1e9, row_s=1e-12, edge_s=1e-12)
    d = mm.choose_shard_sets([str(shard_set)], "sage", HIDDEN, 3, 1 << 40, rates_for=lambda m, degree: rates,
                             exact_only=True)
    labels = {o.label for o in d.options}
    assert {"fb", "fb payload=partial", "fb payload=smaller"} <= labels
    best_fb = min((o for o in d.options if o.mode == "fb"), key=lambda o: o.predicted["total_s"])
    assert best_fb.payload == "smaller"  # the fewest bytes on a slow link
    assert d.choice.predicted["total_s"] <= best_fb.predicted["total_s"]
    slow_dropout = mm.choose_shard_sets([str(shard_set)], "sage", HIDDEN, 3, 1 << 40,
                                        rates_for=lambda m, degree: rates, input_dropout=0.1)
    assert not any(o.payload != "rows" for o in slow_dropout.options)


def test_plan_offers_the_payloads_with_the_shard_sets_bytes(graph, shard_set):
    """`preprocess plan` (the build's arrays, not written) gives the fb payload options the bytes the
    written set gives."""
    from mpi4py import MPI

    from granndis_hpc.preprocess.plan import command as plan

    cfg = plan.PlanConfig(servers=2, gpus_per_server=2, layers=3, hidden=HIDDEN, partitioner="metis", eas=False,
                          device="cpu", ks=[0], halo_route="direct")
    got = {o.label: o for o in plan.plan_options(MPI.COMM_SELF, graph, cfg)["options"]}
    m = _model("direct")
    _, servers = mm.read_shard_set(shard_set)
    s = mm.SetArrays(servers, "full", 3, 3, ks=[0], sample_cobatches=False)
    for o in mm.options(mm.row_groups(s, 3, m, mm.Sampling()), m, 2):
        assert got[o.label].inter_server_bytes == o.inter_server_bytes, o.label
    table = plan.format_table(list(got.values()), cfg, None)
    assert "fb payload=smaller" in table
    assert "--halo-payload smaller" in plan.describe_build(got["fb payload=smaller"], cfg)
