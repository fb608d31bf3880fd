"""The memory model's estimate against measurement on the real engine, 2 servers x 2 ranks (mpirun -n 4).

For every k in K_VALUES (0 = fb on the world view, L = flx; the k < L engine adds 1..L-1 here) and on
two graphs (real Cora, and a synthetic graph whose features are narrower than the hidden width, so
layer 0 aggregates before projecting):
- the activation bytes each rank's step keeps (SavedBytes, Trainer.activation_bytes; the epoch
  record's activation_memory_bytes is their max) against activation_layers()'s estimate;
- the peak a training step allocates above what it starts with (on CPU: the profiler's allocation
  events, summed in time order) against step_peak();
both within 20 % (the issue's bar); and the ledger's inter-server bytes per epoch against
inter_server_bytes() (halo and gradients) -- in the --no-overlap order, and in the overlapped (default)
order for four cases on Cora (test_the_overlapped_order_is_estimated_within_20_percent).  Activation
bytes are also exact today for k = 0 and k = L without overlap (test_activation_bytes_are_exact)."""

import pytest
from mpi4py import MPI

from granndis_hpc import memory_model as mm
from granndis_hpc.memory_model.profile import measure_step_peak
from tests.mpi.conftest import RANKS_PER_SERVER, build_sets_on_rank0, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS = 3
HIDDEN = 16
# The preloaded depths to check: k = 0 is fb, 1..L-1 flx with k < L, L flx.
K_VALUES = list(range(0, LAYERS + 1))
TOLERANCE = 0.20


_SYNTHETIC = {}


def _graph(request, name):
    """Cora (skips this test only when the real files are absent) or the synthetic graph."""
    if name == "cora":
        return request.getfixturevalue("cora")
    if "g" not in _SYNTHETIC:
        from granndis_hpc.preprocess.sources import load
        _SYNTHETIC["g"] = load("synthetic", vertices=3000, avg_degree=10.0, features=8, classes=5, seed=2)
    return _SYNTHETIC["g"]


@pytest.fixture
def graphs(request):
    return lambda name: _graph(request, name)


_SHARDS = {}


def shards_for(graphs, graph_name, k):
    """(shard dir, mode) serving k preloaded layers of an L-layer model: fb reads the world view of
    the L-hop set; k >= 1 trains flx on a set built with --hops k.  Built once, on rank 0."""
    hops = LAYERS if k == 0 else k
    key = (graph_name, hops)
    if key not in _SHARDS:
        graph = graphs(graph_name)  # on every rank: a missing Cora skips the test on all of them
        name = f"{graph_name}-h{hops}"
        _SHARDS[key] = build_sets_on_rank0(graph, {name: {"layers": LAYERS, "hops": hops, "preload": "full"}},
                                           prefix="granndis-mm-")[name]
    return _SHARDS[key], ("fb" if k == 0 else "flx")


def _measure(path, mode, model, k, dropout=0.5, ckpt=False, overlap=()):
    # overlap: the exchange groups whose halos overlap (() = --no-overlap), in the run and the estimate.
    halos = "all" if "server" in overlap else "world"
    t = make_trainer(path, mode, model, LAYERS, hidden=HIDDEN, dropout=dropout, checkpoint_activations=ckpt,
                     no_overlap=not overlap, overlap_halos=halos)
    try:
        # After two epochs the lazy state exists (gradients, Adam moments, cached CSR transposes),
        # as in every later epoch: the third epoch's step is the steady one the model describes.
        t.train_epoch()
        t.train_epoch()
        rec = {}

        def epoch():
            rec.update(t.train_epoch())
        peak = measure_step_peak(epoch)
        mine = {"rank": t.topo.rank, "saved": int(t.activation_bytes), "peak": peak}
    finally:
        t.close()
    est = None
    if WORLD.rank == 0:
        rows = mm.shard_rows(mm.read_shard_set(path)[1], LAYERS, k,
                             int(t.manifest["dataset"]["num_features"]), int(t.manifest["dataset"]["num_classes"]))
        spec = mm.model_for(t.manifest, model, HIDDEN, LAYERS, dropout=dropout, checkpoint_activations=ckpt,
                            overlap=tuple(overlap))
        est = {"per_rank": [mm.estimate(r, spec, device="cpu") for r in rows],
               "inter": mm.inter_server_bytes(rows, spec, WORLD.size // RANKS_PER_SERVER)}
    return WORLD.gather(mine, root=0), est, rec


@pytest.mark.parametrize("graph_name", ["cora", "synthetic"])
@pytest.mark.parametrize("model", ["sage", "gcn", "ressage"])
@pytest.mark.parametrize("k", K_VALUES)
def test_estimate_within_20_percent_of_measurement(graphs, graph_name, model, k, overlap=()):
    path, mode = shards_for(graphs, graph_name, k)
    measured, est, rec = _measure(path, mode, model, k, overlap=overlap)
    problems = []
    if WORLD.rank == 0:
        by_rank = {e["rank"]: e for e in est["per_rank"]}
        for m in measured:
            e = by_rank[m["rank"]]
            for what, got, want in (("activation bytes", e["activation_saved"], m["saved"]),
                                    ("step peak", e["step_peak"], m["peak"])):
                err = abs(got - want) / want
                if err > TOLERANCE:
                    problems.append(f"{graph_name} {model} k={k} rank {m['rank']}: {what} estimated {got}, "
                                    f"measured {want} ({100 * err:.1f} %)")
        if rec["activation_memory_bytes"] != max(m["saved"] for m in measured):
            problems.append(f"epoch record {rec['activation_memory_bytes']} != max of ranks")
        # The ledger's bytes per epoch: halo rows x width x 4 x 2 per world layer, and the gradients.
        for key, name in (("inter_halo", "halo"), ("inter_grad", "gradient")):
            if rec["bytes"][key] != est["inter"][name]:
                problems.append(f"ledger {key} {rec['bytes'][key]} != estimated {est['inter'][name]}")
    # Every rank asserts rank 0's verdict: a rank leaving early would hang the others' next test.
    problems = WORLD.bcast(problems, root=0)
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("model, k, overlap", [("sage", 0, ("world",)), ("gcn", 0, ("world",)),
                                               ("ressage", 0, ("world",)), ("sage", LAYERS, ("server", "world"))])
def test_the_overlapped_order_is_estimated_within_20_percent(graphs, model, k, overlap):
    """The default order: a layer's halo in flight while its conv aggregates the own rows' edges, the
    rows the next layer sends computed first (SAGE then saves copies of its own rows: 1.8x the
    --no-overlap order's activations on Cora's 1433-wide input).  fb overlaps every layer under the
    default --overlap-halos world; flx k = L only its server layers, with --overlap-halos all."""
    test_estimate_within_20_percent_of_measurement(graphs, "cora", model, k, overlap=overlap)


@pytest.mark.parametrize("graph_name", ["cora", "synthetic"])
@pytest.mark.parametrize("k", [0, LAYERS])
def test_activation_bytes_are_exact(graphs, graph_name, k):
    path, mode = shards_for(graphs, graph_name, k)
    for model, dropout, ckpt in (("sage", 0.5, False), ("ressage", 0.0, False), ("ressage", 0.5, True)):
        measured, est, _ = _measure(path, mode, model, k, dropout=dropout, ckpt=ckpt)
        diff = None
        if WORLD.rank == 0:
            by_rank = {e["rank"]: e["activation_saved"] for e in est["per_rank"]}
            got = {m["rank"]: m["saved"] for m in measured}
            diff = None if got == by_rank else f"{model} ckpt={ckpt}: measured {got}, estimated {by_rank}"
        diff = WORLD.bcast(diff, root=0)
        assert diff is None, diff


@pytest.mark.parametrize("batches", [2, 4])
def test_cobatch_estimate_is_the_sampled_cobatch(graphs, batches):
    """cob: the model counts the co-batches the run's own sampler draws (same seed), so the saved
    activations of the epoch's largest co-batch step (what the trainer reports) are estimated exactly."""
    path, _ = shards_for(graphs, "cora", LAYERS)
    t = make_trainer(path, "cob", "sage", LAYERS, hidden=HIDDEN, dropout=0.5, batches_per_epoch=batches, fanout=-1,
                     no_overlap=True)  # exact in both orders: cob's server layers do not overlap by default
    try:
        t.train_epoch()
        epoch = t.epoch
        rec = t.train_epoch()
        mine = {"rank": t.topo.rank, "saved": int(t.activation_bytes)}
    finally:
        t.close()
    measured = WORLD.gather(mine, root=0)
    problems = []
    if WORLD.rank == 0:
        from granndis_hpc import shards
        manifest, servers = mm.read_shard_set(path)
        spec = mm.model_for(manifest, "sage", HIDDEN, LAYERS, dropout=0.5)
        base = mm.shard_rows(servers, LAYERS, 0, spec.features, spec.num_classes)
        graphs_s = [shards.read_server_graph(path, manifest, s) for s in range(len(servers))]
        est = {}
        for it in range(batches):
            cob = [mm.cobatch_server_arrays(g, s, LAYERS, batches, -1, "sage", 0, epoch=epoch, iteration=it)
                   for s, g in enumerate(graphs_s)]
            for r in mm.with_cobatch(base, cob):
                saved = mm.activation_layers(r, spec, device="cpu")["saved"]
                est[r.rank] = max(est.get(r.rank, 0), saved)
        for m in measured:
            if m["saved"] != est[m["rank"]]:
                problems.append(f"rank {m['rank']}: estimated {est[m['rank']]}, measured {m['saved']}")
        inter = mm.inter_server_bytes(mm.with_cobatch(base, cob), spec, len(servers), steps=batches)
        if (rec["bytes"]["inter_halo"], rec["bytes"]["inter_grad"]) != (inter["halo"], inter["gradient"]):
            problems.append(f"ledger inter-server bytes {rec['bytes']}, estimated {inter}")
    problems = WORLD.bcast(problems, root=0)
    assert not problems, "; ".join(problems)
