"""--mode auto on one synthetic graph, 2 servers x 2 ranks (mpirun -n 4): three memory budgets give
GraNNDis' three choices (full-batch FLX with the largest k, FLX on the EAS set, cooperative batching
with the largest co-batch that fits), each run trains, each run's measured peak stays under its
budget, and a budget too small for anything is refused on every rank with the budget needed."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from granndis_hpc import memory_model as mm
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.memory_model import compute_rate
from granndis_hpc.memory_model.profile import measure_step_peak
from tests.mpi.conftest import build_sets_on_rank0, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
LAYERS, HIDDEN = 3, 16


def _graph():
    from granndis_hpc.preprocess.sources import load
    return load("synthetic", vertices=6000, avg_degree=20.0, features=512, classes=4, seed=1)


def _owner(path):
    """The owner rank of every vertex, from the set's inner rows' global ids."""
    from granndis_hpc import shards

    manifest = shards.read_manifest(path)
    owner = np.full(int(manifest["dataset"]["num_vertices"]), -1, dtype=np.int64)
    for rank in range(WORLD.Get_size()):
        sl = shards.read_rank_slice(path, manifest, *divmod(rank, int(manifest["gpus_per_server"])))
        owner[np.asarray(sl.global_id[: sl.n_inner], dtype=np.int64)] = rank
    assert (owner >= 0).all()
    return owner


def _halo_rows(graph, owner):
    """Every rank's distinct in-neighbours it does not own, summed over the ranks."""
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    src = np.asarray(graph.indices, dtype=np.int64)
    remote = owner[src] != owner[dst]
    return int(np.unique(np.stack([owner[dst][remote], src[remote]], axis=1), axis=0).shape[0])


@pytest.fixture(scope="module")
def shard_sets():
    """A full 3-hop set and an EAS set (h=1, f=1) of one graph whose features (512 wide, hidden 16)
    dominate memory: there the sampled EAS halo is cheaper than even the full 1-hop preload, as the
    paper's chain assumes (on narrow features flx k=1 is the cheaper of the two, and auto picks it)."""
    return build_sets_on_rank0(_graph, {"full": {"layers": LAYERS, "preload": "full"},
                                        "eas": {"layers": LAYERS, "preload": "eas", "hops": 1, "fanout": 1}},
                               prefix="granndis-auto-")


@pytest.fixture(scope="module")
def estimates(shard_sets):
    """Every option the two sets offer, with its estimated peak per GPU (rank 0's, shared)."""
    options = None
    if WORLD.rank == 0:
        decision = mm.choose_shard_sets([shard_sets["full"], shard_sets["eas"]], "sage", HIDDEN, LAYERS, 1,
                                        dropout=0.5)
        options = {o.label: o.peak for o in decision.rejected}  # a budget of 1 byte rejects them all
    return WORLD.bcast(options)


def _budgets(estimates):
    """Budgets that must give each of the three choices (the order is GraNNDis': largest k, then EAS,
    then co-batches; fb only when none of those fits), checked to be possible on this graph first."""
    full_batch = [peak for label, peak in estimates.items() if label.startswith("flx")]
    cob = [peak for label, peak in estimates.items() if label.startswith("cob")]
    assert estimates["eas"] < min(full_batch), f"EAS must need less than every full preload here: {estimates}"
    assert min(cob) < estimates["eas"], f"a co-batch must need less than the EAS set: {estimates}"
    return {"flx": estimates[f"flx k={LAYERS}"], "eas": estimates["eas"], "cob": int(estimates["eas"]) - 1}


@pytest.mark.parametrize("expected", ["flx", "eas", "cob"])
def test_three_budgets_three_choices(shard_sets, estimates, expected):
    budget = _budgets(estimates)[expected]
    holder = {}

    def train():
        trainer = make_trainer(f"{shard_sets['full']},{shard_sets['eas']}", "auto", "sage", LAYERS, hidden=HIDDEN,
                               dropout=0.5, memory_per_gpu=str(budget), epochs=2, auto_rule="memory")
        try:
            holder["records"] = [trainer.train_epoch() for _ in range(2)]
            holder["mode"], holder["decision"], holder["cfg"] = trainer.mode.name, trainer.mode.decision, trainer.cfg
        finally:
            trainer.close()

    # Torch's CPU allocations from before set-up to after training (the shard rows read through numpy
    # are not torch allocations: on CPU this undercounts the features, which the estimate includes).
    peak = measure_step_peak(train)
    choice = holder["decision"]["choice"]
    assert holder["mode"] == expected == choice["mode"], holder["decision"]["reason"]
    assert choice["peak_bytes"] <= budget
    assert all(o["peak_bytes"] > budget for o in holder["decision"]["rejected"])
    if expected == "flx":
        assert choice["k"] == LAYERS and holder["cfg"].shards == shard_sets["full"]
    else:
        assert holder["cfg"].shards == shard_sets["eas"]
    if expected == "cob":
        assert holder["cfg"].batches_per_epoch == choice["batches"] > 1
    assert all(np.isfinite(r["loss"]) for r in holder["records"])
    peaks = WORLD.gather(peak, root=0)
    if WORLD.rank == 0:
        print(f"[auto {expected}] budget {budget} measured torch peak {max(peaks)}")
        assert max(peaks) <= budget, f"measured peaks {peaks} exceed the budget {budget}"


def test_time_rule_picks_the_fastest_predicted_option_that_fits(shard_sets, estimates):
    """The default rule: every option priced with the links and compute rate measured at start-up, the
    choice the smallest predicted epoch among those that fit; --auto-modes exact leaves out eas and cob.
    The rounds are timed on the paths the run takes (the second run: --no-overlap, blocking)."""
    budget = _budgets(estimates)["flx"]  # every option fits
    for modes in ("any", "exact"):
        trainer = make_trainer(f"{shard_sets['full']},{shard_sets['eas']}", "auto", "sage", LAYERS, hidden=HIDDEN,
                               dropout=0.5, memory_per_gpu=str(budget), auto_modes=modes,
                               no_overlap=modes == "exact")
        try:
            decision, payload = trainer.mode.decision, trainer.cfg.halo_payload
        finally:
            trainer.close()
        assert payload == decision["choice"]["payload"]  # fb's partial payloads are options too, and run as chosen
        assert decision["rule"] == "time" and decision["rates"]["row_s"] > 0
        # measured on every rank, the slowest rank's median kept, and said so in the reason
        per_rank = decision["compute_rate"]["per_rank"]
        assert len(per_rank) == MPI.COMM_WORLD.Get_size()
        assert (decision["rates"]["row_s"], decision["rates"]["edge_s"]) == tuple(max(c) for c in zip(*per_rank))
        assert decision["compute_rate"]["method"] in decision["reason"]
        # at the degree of the graph fb trains on: every vertex, every in-edge (this graph is transductive)
        graph = _graph()
        assert decision["compute_rate"]["degree"] == pytest.approx(graph.indptr[-1] / graph.num_vertices, rel=1e-12)
        # the overlapped path calibrated at fb's halo rows per computed row: every world layer that exchanges
        # reads the 1-hop halo of the rank's own vertices (counted here from the graph and the partition);
        # --no-overlap computes no layer on that path: the default shape, which nothing prices
        want = (_halo_rows(graph, _owner(shard_sets["full"])) / graph.num_vertices if modes == "any"
                else compute_rate.DEFAULT_SHAPE[0])
        for cal in decision["compute_rate"]["calibration"]:
            assert cal["shape"][0] == pytest.approx(want, rel=1e-12) and 0 < cal["shape"][1] <= 1
        # the rates carry the calibration and the rounds measured at start-up, and the reason says them
        rates, measured, check = decision["rates"], decision["compute_rate"], decision["link_check"]
        assert rates["compute_scale"] == measured["compute_scale"] > 0
        assert rates["overlap_scale"] == measured["overlap_scale"] >= measured["compute_scale"]
        assert rates["overlap_step_s"] == measured["overlap_step_s"] >= 0
        assert rates["step_s"] == pytest.approx(measured["step_s"] + check["rounds"]["allreduce_s"])
        assert rates["world_round_s"] == check["rounds"]["world_round_s"] > 0
        assert rates["server_round_s"] == check["rounds"]["server_round_s"]
        paths = ("blocking", "blocking") if modes == "exact" else ("overlapped", "blocking")
        assert (check["rounds"]["world_path"], check["rounds"]["server_path"]) == paths
        assert f"world {paths[0]}, server {paths[1]}" in decision["reason"]
        assert "link check: inter-server" in decision["reason"] and "a round (mean of" in decision["reason"]
        # the inter-server link also measured both ways at once, priced at no more than one way
        assert (check["inter_both"] != {}) == (check["inter_Bps"] is not None)
        if check["inter_Bps"] is not None:
            assert 0 < rates["inter_both_Bps"] == min(check["inter_both_Bps"], check["inter_Bps"])
            assert "both ways at once" in decision["reason"]
        # cob's co-batch set-up, timed on the full set's server graphs only where cob wins with it at zero
        setup = decision.get("cobatch_setup")
        if modes == "any" and setup.get("timed", True):
            assert setup["rows"] > 0 and setup["cobatch_s"] + setup["rows"] * setup["cobatch_row_s"] > 0
            assert setup["method"] in decision["reason"]
            assert (rates["cobatch_s"], rates["cobatch_row_s"]) == (setup["cobatch_s"], setup["cobatch_row_s"])
            # every co-batch step all-reduces its target count: one round each, at the gradient round's price
            assert rates["targets_round_s"] == check["rounds"]["allreduce_s"] > 0
            cob = [o for o in decision["options"] if o["mode"] == "cob"]
            assert cob and all(o["rounds"]["targets"] == o["batches"] == o["rounds"]["steps"] for o in cob)
        elif modes == "any":  # a lower bound of cob lost: not timed, and said so
            assert decision["choice"]["mode"] != "cob" and setup["method"] in decision["reason"]
            assert "co-batch set-up not timed" in setup["method"] and rates["cobatch_s"] == rates["cobatch_row_s"] == 0
        else:
            assert setup is None and rates["cobatch_s"] == rates["cobatch_row_s"] == 0.0
        # the fastest that fits, or fb where the fastest is predicted no more than the margin faster
        fits = [o for o in decision["options"] if o["peak_bytes"] <= budget]
        fastest = min(o["predicted_s"]["total_s"] for o in fits)
        fb = next(o["predicted_s"]["total_s"] for o in fits if o["mode"] == "fb" and o["payload"] == "rows")
        if fastest < fb * (1 - rates["baseline_margin"]):
            assert decision["choice"]["predicted_s"]["total_s"] == fastest
            assert "shortest predicted epoch" in decision["reason"]
        else:
            assert decision["choice"]["mode"] == "fb"
            assert "fb is kept" in decision["reason"] if fb > fastest else "shortest" in decision["reason"]
        # the per-server route (the default) relays every world round of rows inside the server, where there
        # are several servers (an inter-server link measured) of several ranks (a server round measured); a
        # layer that sends partials adds a world round of them, not relayed
        routed = check["inter_Bps"] is not None and check["rounds"]["server_round_s"] > 0
        for o in decision["options"]:
            r = o["rounds"]
            assert r["targets"] == (o["batches"] if o["mode"] == "cob" else 0)
            if not routed:
                assert r["relay"] == 0
            elif o["payload"] == "rows":
                assert r["relay"] == r["world"]
            else:
                assert 0 <= r["world"] - r["relay"] <= r["relay"]
            p = o["predicted_s"]
            assert p["total_s"] == pytest.approx(p["compute_s"] + p["inter_s"] + p["intra_s"] + p["fixed_s"])
            assert p["fixed_s"] >= o["rounds"]["steps"] * rates["step_s"]
            # the steps whose layers run the overlapped path: fb's and flx k < L's, where the world group overlaps
            overlapped = o["mode"] == "fb" or (o["mode"] == "flx" and o["k"] < LAYERS)
            assert r["overlapped_steps"] == (r["steps"] if overlapped and modes != "exact" else 0)
            if o["mode"] != "cob":  # no co-batch set-up: the steps and the rounds
                assert p["fixed_s"] == pytest.approx(r["steps"] * rates["step_s"] + r["world"] * rates["world_round_s"]
                                                     + (r["server"] + r["relay"]) * rates["server_round_s"]
                                                     + r["overlapped_steps"] * rates["overlap_step_s"])
        if modes == "exact":
            assert all(o["exact"] for o in decision["options"]) and decision["choice"]["mode"] in ("fb", "flx")


def test_nothing_fits_is_refused_with_the_budget_needed(shard_sets):
    with pytest.raises(ClusterError, match=r"nothing fits .* use --memory-per-gpu"):
        make_trainer(f"{shard_sets['full']},{shard_sets['eas']}", "auto", "sage", LAYERS, hidden=HIDDEN,
                     memory_per_gpu="1KiB")


def test_a_cob_choice_samples_from_the_structure_the_set_up_check_read(shard_sets, monkeypatch):
    """Auto's co-batch set-up check reads the server graph without features; where auto then chooses cob on
    that set, the loader samples from what the check read and reads only the features, and trains exactly
    as `--mode cob` with the same co-batches, which reads the graph itself.  (On this graph fb is both the
    smallest and the fastest option: the time rule is handed cob with 2 co-batches only, to choose it, and
    the compute rate, which only ranks the options, is given instead of measured: the test stays short.)"""
    import functools
    import sys

    from granndis_hpc import shards
    from granndis_hpc.memory_model import compute_rate, shardsets

    monkeypatch.setattr(compute_rate, "measure_job", lambda *a, **kw: {
        "row_s": 1e-9, "edge_s": 1e-9, "per_rank": [], "compute_scale": 1.0, "overlap_scale": 1.0, "step_s": 0.0,
        "overlap_step_s": 0.0, "calibration": None,
        "method": "compute rate given"})
    monkeypatch.setattr(mm, "shard_set_options", functools.partial(mm.shard_set_options, batches=(2,)))
    choose = shardsets.choose_by_time
    monkeypatch.setattr(shardsets, "choose_by_time",
                        lambda options, *a, **kw: choose([o for o in options if o.mode == "cob"], *a, **kw))
    calls = []

    def spy(name):
        original = getattr(shards, name)

        def read(path, manifest, server, **kw):
            caller = sys._getframe(1).f_code
            calls.append((name, caller.co_filename.rsplit("/", 1)[-1], caller.co_name, server,
                          kw.get("features", False)))
            return original(path, manifest, server, **kw)
        monkeypatch.setattr(shards, name, read)
    spy("read_server_graph")
    spy("read_server_features")

    def trained(mode, **kw):
        trainer = make_trainer(shard_sets["full"], mode, "sage", LAYERS, hidden=HIDDEN, dropout=0.5, **kw)
        try:
            trainer.train_epoch()
            return trainer.mode, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        finally:
            trainer.close()

    mode, auto_params = trained("auto", memory_per_gpu="1GiB")
    assert mode.name == "cob" and mode.cfg.batches_per_epoch == 2, mode.decision["reason"]
    setup = mode.decision["cobatch_setup"]  # cob won with its set-up at zero: timed, and decided again with it
    assert "timed" not in setup and setup["cobatch_s"] + setup["cobatch_row_s"] > 0
    assert mode.decision["rates"]["cobatch_s"] == setup["cobatch_s"] and setup["method"] in mode.decision["reason"]
    server = WORLD.rank // (WORLD.size // 2)
    engine = [c for c in calls if c[1] in ("cobsetup.py", "modes.py")]  # rank 0 also reads for the estimates
    assert engine == [("read_server_graph", "cobsetup.py", "measure", server, False),
                      ("read_server_features", "modes.py", "setup", server, False)], engine
    calls.clear()
    _, cob_params = trained("cob", batches_per_epoch=mode.cfg.batches_per_epoch)
    assert calls == [("read_server_graph", "modes.py", "setup", server, True)], calls
    assert auto_params.keys() == cob_params.keys()
    for key in auto_params:
        assert torch.equal(auto_params[key], cob_params[key]), key


def test_the_set_up_check_runs_only_where_cob_can_win(shard_sets, monkeypatch):
    """The time rule prices cob's co-batch set-up at zero first (a lower bound); where a non-cob option wins
    even so, the set-up check (collective: it reads every server graph) is not run on any rank, the decision
    says why, and it is the one made with the check run.  (Where cob wins at zero, the check runs:
    test_a_cob_choice_samples_from_the_structure_the_set_up_check_read.)  Links, rounds and the compute rate
    are given, not measured, so the decisions compare exactly; the check itself is real."""
    from granndis_hpc.engine import cobsetup, modes
    from granndis_hpc.memory_model import compute_rate

    monkeypatch.setattr(compute_rate, "measure_job", lambda *a, **kw: {
        "row_s": 1e-9, "edge_s": 1e-9, "per_rank": [], "compute_scale": 1.0, "overlap_scale": 1.0, "step_s": 1e-4,
        "overlap_step_s": 0.0, "calibration": None,
        "method": "compute rate given"})
    monkeypatch.setattr(modes, "measure_links", lambda topo, both_ways=True, piece_bytes=None: {
        "inter_Bps": 1e8, "intra_Bps": 1e9, "inter_both_Bps": 1e8})
    monkeypatch.setattr(modes, "measure_exchange_rounds", lambda comm, **kw: {
        "world_round_s": 1e-4, "server_round_s": 1e-5, "allreduce_s": 1e-4, "repeats": 1})
    checks = []
    measure = cobsetup.measure

    def counted(*a, **kw):
        checks.append(a[1])
        return measure(*a, **kw)
    monkeypatch.setattr(cobsetup, "measure", counted)

    def decided():
        trainer = make_trainer(f"{shard_sets['full']},{shard_sets['eas']}", "auto", "sage", LAYERS, hidden=HIDDEN,
                               memory_per_gpu="1GiB", no_link_check=True)
        try:
            return trainer.mode.decision
        finally:
            trainer.close()

    skipped = decided()
    assert skipped["choice"]["mode"] != "cob" and checks == [], (skipped["reason"], checks)
    assert skipped["cobatch_setup"]["timed"] is False and skipped["cobatch_setup"]["cobatch_s"] == 0.0
    assert "co-batch set-up not timed" in skipped["reason"] and "a lower bound" in skipped["reason"]
    assert WORLD.allgather(len(checks)) == [0] * WORLD.size
    monkeypatch.setattr(mm, "setup_matters", lambda decision: True)  # the check forced: the same choice
    forced = decided()
    assert checks == [shard_sets["full"]] and "timed" not in forced["cobatch_setup"]
    assert forced["cobatch_setup"]["cobatch_s"] + forced["cobatch_setup"]["cobatch_row_s"] > 0
    assert (forced["choice"]["label"], forced["choice"]["source"]) == (skipped["choice"]["label"],
                                                                       skipped["choice"]["source"])
    priced = {(o["label"], o["source"]): o["predicted_s"]["total_s"] for o in forced["options"]}
    for o in skipped["options"]:  # the options that set up no co-batch: priced alike; cob's dearer when timed
        key, total = (o["label"], o["source"]), o["predicted_s"]["total_s"]
        assert priced[key] > total if o["mode"] == "cob" and o["batches"] > 1 else priced[key] == total, key
