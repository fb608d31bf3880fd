"""Build memory in the plan: the per-rank estimate of the distributed build, and the
smallest number of build ranks that fits a budget."""
import json

import pytest

from granndis_hpc.preprocess.plan import build_memory as bm
from granndis_hpc.preprocess.plan.build_memory import ServerLoad, estimate_build_memory, smallest_fitting_ranks
from granndis_hpc.preprocess.build.dist_server import BLOCK_BYTES, block_rows

GRAPH = dict(num_vertices=1_000_000, num_edges=24_000_000, raw_keys=25_000_000, num_features=100)
SERVERS = [ServerLoad(0, 800_000, 19_000_000), ServerLoad(1, 700_000, 17_000_000)]


def test_estimate_by_hand():
    """One rank, METIS: every term of the module docstring written out."""
    est = estimate_build_memory(servers=SERVERS, ranks=1, partitioner="metis", **GRAPH)
    n, e, f = 1_000_000, 24_000_000, 100
    held = 8 * e + (4 * f + 24) * n
    want = {"load": bm.BASE_BYTES + held + bm.LOAD_BYTES_PER_KEY * 25_000_000,
            # partition: features and labels on disk (slices.spilled); with METIS the edges stay
            "partition": bm.BASE_BYTES + bm.PARTITION_VERTEX_BYTES * n + bm.PARTITION_ROW_BYTES * n + 8 * e
            + bm.KEY_BYTES_PER_EDGE * e + max(bm.METIS_BYTES_PER_EDGE * e, bm.GPU_SPLIT_BYTES_PER_INNER_EDGE * e / 2),
            "halos+write": bm.BASE_BYTES + held + (bm.PER_VERTEX_BYTES + bm.HALO_BYTES_PER_VERTEX) * n
            + bm.ROW_BYTES * 800_000
            # the writer's row offsets and its block: the byte bound (BLOCK_BYTES of features) at P = 1
            + max(bm.WRITER_BYTES_PER_ROW * s.rows + (BLOCK_BYTES // (4 * f * 2621)) * 2621
                  * max(bm.BLOCK_BYTES_PER_FEATURE * f, (bm.BLOCK_BYTES_PER_EDGE + bm.BLOCK_PRODUCE_BYTES_PER_EDGE)
                        * s.fetched_edges / s.rows)
                  for s in SERVERS)}
    assert est.phases == [{k: int(v) for k, v in want.items()}]
    assert est.peak == max(int(v) for v in want.values())


def test_every_rank_shrinks_with_ranks_writers_too():
    """Since the servers are built by all ranks (dist_server), the writer's block is at most a 1/P share
    of its server and at most BLOCK_BYTES of features: writers shrink with P as the others do, and stay
    above them by their row offsets and that block."""
    peaks = {P: estimate_build_memory(servers=SERVERS, ranks=P, **GRAPH) for P in (1, 2, 4, 8)}
    others = [max(peaks[P].per_rank[2:]) for P in (4, 8)]
    assert others[1] < others[0] < peaks[1].peak
    writers = [max(peaks[P].phases[r]["halos+write"] for r in range(min(P, 2))) for P in (1, 2, 4, 8)]
    assert writers == sorted(writers, reverse=True) and writers[3] < writers[0] / 2
    assert peaks[8].phases[0]["halos+write"] > peaks[8].phases[5]["halos+write"]  # rank 0 writes server 0
    assert peaks[8].per_rank[0] >= peaks[8].per_rank[5]
    s0 = SERVERS[0]
    # whole chunks of 2621 rows: the byte bound (BLOCK_BYTES of features) below the 1/P share here
    assert block_rows(s0.rows, 100, 8) == (BLOCK_BYTES // (400 * 2621)) * 2621 < -(-(s0.rows // 8) // 2621) * 2621
    assert block_rows(s0.rows, 100, 8, block_bytes=1 << 30) == -(-(s0.rows // 8) // 2621) * 2621  # the 1/P share
    block8 = bm.WRITER_BYTES_PER_ROW * s0.rows + block_rows(s0.rows, 100, 8) * max(
        bm.BLOCK_BYTES_PER_FEATURE * 100, (bm.BLOCK_BYTES_PER_EDGE + bm.BLOCK_PRODUCE_BYTES_PER_EDGE / 8)
        * s0.fetched_edges / s0.rows)
    assert peaks[8].phases[0]["halos+write"] - peaks[8].phases[5]["halos+write"] == pytest.approx(block8, abs=64)


def test_parmetis_partition_terms():
    """ParMETIS: the partition phase peaks building the slice's adjacency keys or inside PT-Scotch,
    whose band term is PT-Scotch's per vertex of the whole graph, bounded by the gather limit (a
    multiple of the slice's arcs) for P >= 2 (module docstring); the GPU split (n/P rows of one server
    on its block of P / S ranks) stays below the server partition, and with METIS the writer holds its
    server's split alone."""
    n, e, f = 1_000_000, 24_000_000, 100
    calls, keyss = {}, {}
    for P in (1, 2, 4, 8):
        pm = estimate_build_memory(servers=SERVERS, ranks=P, partitioner="parmetis", symmetric=False, **GRAPH)
        me = estimate_build_memory(servers=SERVERS, ranks=P, partitioner="metis", **GRAPH)
        rows, edges = n // P, e / P
        ours = bm.PARTITION_VERTEX_BYTES * n + bm.PARTITION_ROW_BYTES * rows
        keyss[P] = keys = bm.BASE_BYTES + bm.KEY_BYTES_PER_EDGE * edges + ours
        band = bm.scotch_vertex_bytes() * n
        if P > 1:
            band = min(band, bm.SCOTCH_GATHERED_BYTES_PER_ARC * 2.0 * edges)
        calls[P] = call = bm.SCOTCH_BASE_BYTES + ours + band + bm.SCOTCH_BYTES_PER_EDGE * edges
        assert pm.phases[0]["partition"] == int(max(keys, call))
        if P > 1:
            assert me.phases[1]["partition"] >= int(keys + 8 * edges + bm.GPU_SPLIT_BYTES_PER_INNER_EDGE * e / 2) - 64
        # The partition phase does not hold the slice's features: below the load phase's slice.
        assert pm.phases[0]["partition"] < max(keys, call) + 8 * edges + (4 * f + 24) * rows
    # The keys set P = 1's peak, the larger of the two P = 8's, and what PT-Scotch keeps per vertex of
    # the graph bounds every rank from below whatever P.
    unsym = dict(GRAPH, symmetric=False)
    assert estimate_build_memory(servers=SERVERS, ranks=1, **unsym).phases[0]["partition"] > int(calls[1])
    assert estimate_build_memory(servers=SERVERS, ranks=8, **unsym).phases[0]["partition"] == int(max(keyss[8],
                                                                                                      calls[8]))
    # A symmetrised graph (the default): the slice's own rows are the adjacency, no keys; PT-Scotch's
    # call sets the phase's peak at every P here.
    for P in (1, 8):
        own = bm.BASE_BYTES + bm.SYMMETRIC_ADJ_BYTES_PER_EDGE * e / P + bm.PARTITION_VERTEX_BYTES * n \
            + bm.PARTITION_ROW_BYTES * (n // P)
        assert own < calls[P]
        assert estimate_build_memory(servers=SERVERS, ranks=P, **GRAPH).phases[0]["partition"] == int(calls[P])
    assert calls[8] - calls[4] < 0 and calls[8] > bm.SCOTCH_BYTES_PER_EDGE * e / 8
    # The band bounded: at P = 8 the limit (2 slices' arcs) is below the whole graph's band term.
    assert bm.SCOTCH_GATHERED_BYTES_PER_ARC * 2.0 * e / 8 < bm.scotch_vertex_bytes() * n


def test_band_term_bounded_by_the_gather_limit(monkeypatch):
    """Every band gathered (GRANNDIS_SCOTCH_BAND_GATHER=always): the whole graph's per-vertex term on
    every rank; the default gathers below SCOTCH_BAND_GATHER x the slice's arcs, whose term replaces it
    where smaller; P = 1 (sequential PT-Scotch) keeps the per-vertex term."""
    from granndis_hpc.preprocess.partition.parmetis import SCOTCH_BAND_GATHER
    n, e = GRAPH["num_vertices"], GRAPH["num_edges"]
    default = {P: estimate_build_memory(servers=SERVERS, ranks=P, **GRAPH).phases[0]["partition"] for P in (1, 8)}
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", "always")
    always = {P: estimate_build_memory(servers=SERVERS, ranks=P, **GRAPH).phases[0]["partition"] for P in (1, 8)}
    assert always[1] == default[1]
    want = bm.scotch_vertex_bytes() * n - bm.SCOTCH_GATHERED_BYTES_PER_ARC * SCOTCH_BAND_GATHER * e / 8
    assert always[8] - default[8] == pytest.approx(want, abs=2)
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", "1000")  # a limit above the whole band: no bound
    assert estimate_build_memory(servers=SERVERS, ranks=8, **GRAPH).phases[0]["partition"] == always[8]


def test_scotch_term_follows_the_band_width(monkeypatch):
    """PT-Scotch's per-vertex term is the band graph's: the build's 1-wide band (default) or 3 (its own),
    every band gathered."""
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_GATHER", "always")
    assert bm.scotch_vertex_bytes() == bm.SCOTCH_VERTEX_BYTES_NARROW_BAND
    sparse = dict(GRAPH, num_edges=4_000_000, raw_keys=4_000_000)  # PT-Scotch's call sets the phase's peak
    narrow = estimate_build_memory(servers=SERVERS, ranks=8, **sparse).phases[0]["partition"]
    monkeypatch.setenv("GRANNDIS_SCOTCH_BAND_WIDTH", "3")
    assert bm.scotch_vertex_bytes() == bm.SCOTCH_VERTEX_BYTES
    wide = estimate_build_memory(servers=SERVERS, ranks=8, **sparse).phases[0]["partition"]
    assert wide - narrow == (bm.SCOTCH_VERTEX_BYTES - bm.SCOTCH_VERTEX_BYTES_NARROW_BAND) * GRAPH["num_vertices"]


def test_smallest_fitting_ranks():
    kwargs = dict(servers=SERVERS, **GRAPH)
    p4 = estimate_build_memory(ranks=4, **kwargs).peak
    fit = smallest_fitting_ranks(p4, **kwargs)
    assert fit is not None and fit <= 4
    assert estimate_build_memory(ranks=fit, **kwargs).peak <= p4
    assert fit == 1 or estimate_build_memory(ranks=fit - 1, **kwargs).peak > p4
    assert smallest_fitting_ranks(10 << 20, max_ranks=64, **kwargs) is None  # below the writer's share


def test_plan_prints_the_build_memory(tmp_path, capsys):
    from granndis_hpc.preprocess.__main__ import main

    out = tmp_path / "plan.json"
    rc = main(["plan", "--source", "synthetic", "--vertices", "3000", "--features", "8", "--avg-degree", "6",
               "--servers", "2", "--gpus-per-server", "2", "--layers", "2", "--partitioner", "metis",
               "--cob-batches", "2", "--build-ranks", "4", "--memory-per-rank", "1GiB", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "[plan] build flx k=2: estimated peak per build rank with P = 4:" in text
    assert "smallest P fitting --memory-per-rank 1 GiB: 1" in text
    rec = json.loads(out.read_text())["build_memory"]
    assert set(rec) == {"flx k=1", "flx k=2", "eas"}
    inputs = dict(rec["flx k=2"]["inputs"])
    servers = [ServerLoad(**s) for s in inputs.pop("servers")]
    assert sum(s.rows for s in servers) >= 3000  # every vertex is inner somewhere, plus the halos
    assert estimate_build_memory(servers=servers, ranks=4, **inputs).to_dict()["per_rank"] == rec["flx k=2"]["per_rank"]


def test_plan_refuses_bad_build_options(capsys):
    from granndis_hpc.preprocess.__main__ import main

    args = ["plan", "--vertices", "500", "--features", "4", "--servers", "2", "--gpus-per-server", "1", "--layers", "1"]
    assert main(args + ["--build-ranks", "0"]) == 1
    assert "--build-ranks must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(args + ["--memory-per-rank"])


def test_block_rows_and_small_ids():
    """The writer's block: whole feature chunks, at most ceil(rows / P) rows and BLOCK_BYTES of features
    (at least one chunk); server, GPU and hop ids in the narrowest signed dtype that holds them."""
    import numpy as np

    from granndis_hpc.shards.schema import feature_chunk_rows
    from granndis_hpc.preprocess.build.dist_server import small_int_dtype

    chunk = feature_chunk_rows(8_000_000, 128)
    assert chunk == 2048
    assert block_rows(8_000_000, 128, 8) == BLOCK_BYTES // (4 * 128)  # the byte bound, not 1M rows
    assert block_rows(8_000_000, 128, 8) * 4 * 128 <= BLOCK_BYTES
    assert block_rows(10_000, 128, 8) == chunk  # ceil(10000 / 8) rows, rounded up to a whole chunk
    assert block_rows(100_000, 128, 8, block_bytes=1) == chunk  # never under one chunk
    assert block_rows(0, 128, 8) == 1
    assert [small_int_dtype(b) for b in (2, 127, 128, 40_000)] == [np.int8, np.int8, np.int16, np.int32]
