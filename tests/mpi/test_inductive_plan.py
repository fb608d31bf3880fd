"""`preprocess plan --inductive` counts the rows an inductive run builds (mpirun -n 4, 2 servers x 2 ranks).

On Cora and CiteSeer, the distributed planner's rows of every rank (plan_options under the 4 ranks, the
induced graphs counted from their slices) against:
- a real inductive run on the set built with the same partition: the train-induced world view fb trains
  on, the co-batch cob samples first, and the two evaluation views (the full and the
  train+validation-induced world views), layer by layer (own, halo, computed rows, edges, sent rows);
- flx (k = 1, 2, 3) and eas: the train-induced graph's own preload of each server, computed here by a
  NumPy BFS over the raw graph restricted to training vertices (and to the EAS file's rows), with the
  rows of each layer by the planner's rule (layer l of a k-layer view computes hop <= k-1-l and reads
  hop <= k-l);
and the estimate of an inductive fb run against measurement: the saved activations and the step peak
(within 20 %, as tests/mpi/test_memory_model_mpi.py), and evaluation's peak (the largest no_grad forward
over the three graphs) within 20 %."""
import numpy as np
import pytest
from mpi4py import MPI

from granndis_hpc import memory_model as mm
from tests.conftest import require_planetoid
from tests.mpi.conftest import RANKS_PER_SERVER, TEST_ROW_BLOCK_ROWS, build_sets_on_rank0, make_trainer

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
L, HIDDEN, TOLERANCE = 3, 16, 0.20


@pytest.fixture(scope="module")
def datasets(cora):
    from granndis_hpc.preprocess.sources import load
    return {"cora": cora, "citeseer": load("planetoid", name="citeseer", root=str(require_planetoid()))}


_CACHE = {}


def planned(datasets, name):
    """(graph, {full, eas}: set dirs, {(mode, knob): every rank's RankRows}) of one dataset, built and
    planned once: the 3-hop set (fb, flx k <= 3, cob) and the EAS set (eas), as plan --hops 3 sees them."""
    if name not in _CACHE:
        from granndis_hpc.preprocess.plan import command as plan

        graph = datasets[name]
        dirs = build_sets_on_rank0(graph, {
            f"{name}-full": {"layers": L, "inductive": True},
            f"{name}-eas": {"layers": L, "inductive": True, "preload": "eas", "hops": 1, "fanout": 15}},
            prefix="granndis-indplan-")
        cfg = plan.PlanConfig(servers=WORLD.size // RANKS_PER_SERVER, gpus_per_server=RANKS_PER_SERVER, layers=L,
                              hidden=HIDDEN, dropout=0.5, partitioner="metis", seed=0, device="cpu", hops=L,
                              eas_hops=1, fanout=15, cob_batches=(2,), cob_fanout=-1, inductive=True,
                              row_block_rows=TEST_ROW_BLOCK_ROWS)
        res = plan.plan_options(WORLD, graph, cfg)
        groups = {(g.mode, g.k if g.mode != "cob" else g.batches, g.source): g.rows for g in res["groups"]}
        _CACHE[name] = (graph, {"full": dirs[f"{name}-full"], "eas": dirs[f"{name}-eas"]}, groups, res["model"],
                        [o.to_dict() for o in res["options"]], cfg)
    return _CACHE[name]


def counts(lp):
    """(own source rows, halo rows, computed rows, edges, rows sent) of a planner LayerPlan."""
    return (int(lp.n_own_in), int(lp.recv_counts.sum()), int(lp.n_dst), int(lp.indptr[-1]), int(lp.send_counts.sum()))


def view_layer(view, l):
    return view.per_layer[l].plan.layers[l] if hasattr(view, "per_layer") else view.plan.layers[l]


def rows_of(lr):
    return (lr.n_own_in, lr.n_halo, lr.n_dst, lr.nnz, lr.n_send)


def agreed(problems):
    """Every rank asserts the union of the ranks' problems (none leaves the others waiting)."""
    problems = [p for part in WORLD.allgather(problems) for p in part]
    assert not problems, "; ".join(problems[:6])


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_plan_counts_the_views_an_inductive_run_builds(datasets, name):
    graph, dirs, groups, *_ = planned(datasets, name)
    source = f"--hops {L}"
    problems = []
    for mode, extra in (("fb", {}), ("cob", {"batches_per_epoch": 2, "fanout": -1})):
        t = make_trainer(dirs["full"], mode, inductive=True, **extra)
        try:
            rank = t.topo.rank
            r = groups[(mode, 2 if mode == "cob" else 0, source)][rank]
            view = t.train_view if mode == "fb" else next(iter(t.mode.steps(0))).view
            for l, (_, lr) in enumerate(r.training_layers()):
                if counts(view_layer(view, l)) != rows_of(lr):
                    problems.append(f"{name} {mode} rank {rank} layer {l}: run {counts(view_layer(view, l))}, "
                                    f"plan {rows_of(lr)}")
            if mode == "fb":
                for what, v, planned_view in (("full", t.world_view, r.evaluation[0]),
                                              ("train+val", t.induced.views["val"], r.evaluation[1]),
                                              ("train", t.induced.views["train"], r.world)):
                    if counts(v.plan.layers[1]) != rows_of(planned_view.layers[1]):
                        problems.append(f"{name} {what} world view rank {rank}: run {counts(v.plan.layers[1])}, "
                                        f"plan {rows_of(planned_view.layers[1])}")
                n = int(t.slice.n_inner)
                if r.n_train != int(np.count_nonzero(t.slice.train_mask[:n])):
                    problems.append(f"{name} rank {rank}: {r.n_train} targets planned")
        finally:
            t.close()
    agreed(problems)


def induced_preload(graph, rows, owner, inner_train, depth):
    """hop (-1: not in it) of every vertex in the train-induced preload of `depth` hops, over the raw
    graph's edges between training vertices among `rows` (a server file's rows)."""
    usable = np.zeros(graph.num_vertices, bool)
    usable[rows] = True
    usable &= graph.train_mask
    hop = np.full(graph.num_vertices, -1)
    hop[inner_train] = 0
    for t in range(1, depth + 1):
        front = np.flatnonzero(hop == t - 1)
        src = np.concatenate([graph.indices[graph.indptr[v]:graph.indptr[v + 1]] for v in front]) if front.size else \
            np.zeros(0, np.int64)
        new = src[usable[src] & (hop[src] < 0)]
        hop[new] = t
    return hop


def reference_layers(graph, hop, owner_of, g, depth):
    """Per layer (own in, halo, computed, edges, sent) of GPU g's view planned for `depth` layers."""
    kept = hop >= 0
    dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
    e = kept[dst] & kept[graph.indices]
    dst, src = dst[e], graph.indices[e]
    mine = owner_of[dst] == g
    halo = np.unique(src[mine & (owner_of[src] != g)])
    sent = [np.unique(src[(owner_of[dst] == p) & (owner_of[src] == g)]) for p in np.unique(owner_of[kept]) if p != g]
    sent = np.concatenate(sent) if sent else np.zeros(0, np.int64)
    own = np.flatnonzero(kept & (owner_of == g))
    out = []
    for l in range(depth):
        lim_in, lim_out = depth - l, depth - 1 - l
        out.append((int(np.count_nonzero(hop[own] <= lim_in)), int(np.count_nonzero(hop[halo] <= lim_in)),
                    int(np.count_nonzero(hop[own] <= lim_out)), int(np.count_nonzero(mine & (hop[dst] <= lim_out))),
                    int(np.count_nonzero(hop[sent] <= lim_in))))
    return out


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_flx_and_eas_rows_are_the_train_induced_preload(datasets, name):
    from granndis_hpc import shards

    graph, dirs, groups, *_ = planned(datasets, name)
    problems = []
    if WORLD.rank == 0:
        for set_name, options in (("full", [("flx", k, f"--hops {L}") for k in (1, 2, 3)]),
                                  ("eas", [("eas", L, "--preload eas")])):
            manifest = shards.read_manifest(dirs[set_name])
            for s in range(int(manifest["servers"])):
                a = shards.read_server_arrays(dirs[set_name], manifest, s)
                rows, offsets, file_hop = a["vertices/global_id"], a["vertices/offsets"], a["vertices/hop"]
                owner_of = np.full(graph.num_vertices, -1)
                owner_of[rows] = np.searchsorted(offsets, np.arange(rows.size), side="right") - 1
                inner = rows[(file_hop == 0) & graph.train_mask[rows]]
                for mode, k, source in options:
                    hop = induced_preload(graph, rows, owner_of, inner, k)
                    if set_name == "full":  # a full preload holds every train-induced path of its depth
                        assert (owner_of[hop >= 0] >= 0).all()
                    for g in range(RANKS_PER_SERVER):
                        r = groups[(mode, k, source)][s * RANKS_PER_SERVER + g]
                        want = reference_layers(graph, hop, owner_of, g, k)
                        got = [rows_of(lr) for _, lr in r.training_layers()[:k]]
                        if got != want:
                            problems.append(f"{name} {mode} k={k} server {s} GPU {g}: plan {got}, BFS {want}")
    agreed(problems)


def test_one_process_plans_what_the_four_ranks_plan(datasets):
    """The serial plan (one process holding the graph) and the distributed one give the same options."""
    from granndis_hpc.preprocess.plan import command as plan

    *_, options, cfg = planned(datasets, "cora")
    serial = [o.to_dict() for o in plan.plan_options(MPI.COMM_SELF, datasets["cora"], cfg)["options"]] \
        if WORLD.rank == 0 else options
    agreed([] if serial == options else ["the serial plan differs from the 4-rank plan"])


def test_the_inductive_estimate_is_within_20_percent_of_measurement(datasets):
    """fb on Cora: saved activations and the step's peak against the plan's estimate of that rank (as the
    transductive estimate is checked), and evaluation's peak (three no_grad forwards) against the largest
    forward the estimate counts."""
    from granndis_hpc.memory_model.induced import forward_peak
    from granndis_hpc.memory_model.profile import measure_step_peak

    graph, dirs, groups, *_ = planned(datasets, "cora")
    t = make_trainer(dirs["full"], "fb", inductive=True, dropout=0.5, no_overlap=True)
    try:
        t.train_epoch()
        t.train_epoch()
        step = measure_step_peak(t.train_epoch)
        evaluation = measure_step_peak(t.evaluate)
        saved, rank = int(t.activation_bytes), t.topo.rank
    finally:
        t.close()
    r = groups[("fb", 0, f"--hops {L}")][rank]
    spec = mm.ModelSpec("sage", graph.num_features, HIDDEN, graph.num_classes, L, dropout=0.5, overlap=(),
                        inductive=True)
    e = mm.estimate(r, spec, device="cpu")
    problems = []
    for what, got, want in (("activation bytes", e["activation_saved"], saved), ("step peak", e["step_peak"], step),
                            ("evaluation peak", max(forward_peak(v, r, spec) for v in (r.world, *r.evaluation)),
                             evaluation)):
        if abs(got - want) > TOLERANCE * want:
            problems.append(f"rank {rank}: {what} estimated {got}, measured {want}")
    agreed(problems)


def test_mode_auto_counts_the_inductive_views_plan_counts(datasets):
    """--mode auto on the two inductive sets on disk counts every rank's views from the sets' own arrays
    (memory_model/induced_sets.py) as `plan --hops 3` counts them from the build ranks' slices: the same
    RankRows (training views, the two evaluation views, the shard slice and server file sizes) for fb,
    flx k = 1..3 and cob (sampled on the train-induced edges), and the eas rows a real run builds; so the
    same estimates, each with its evaluation views counted."""
    graph, dirs, groups, m, options, _ = planned(datasets, "cora")
    t = make_trainer(dirs["eas"], "eas", inductive=True)
    try:
        run_eas = [counts(view_layer(t.train_view, l)) for l in range(L)]
        rank = t.topo.rank
    finally:
        t.close()
    every_eas = WORLD.gather((rank, run_eas))
    problems = []
    if WORLD.rank == 0:
        sampling = mm.Sampling((2,), -1, "sage", 0)
        auto = {}
        for name, source in (("full", f"--hops {L}"), ("eas", "--preload eas")):
            manifest, servers = mm.read_shard_set(dirs[name])
            for g in mm.row_groups(mm.set_arrays(dirs[name], manifest, servers, inductive=True), L, m, sampling):
                auto[(g.mode, g.k if g.mode != "cob" else g.batches, source)] = g.rows
        for key in [("fb", 0, f"--hops {L}"), *[("flx", k, f"--hops {L}") for k in (1, 2, 3)], ("cob", 2,
                                                                                                f"--hops {L}")]:
            if auto.get(key) != groups[key]:
                problems.append(f"auto's {key} rows differ from plan's")
        for r, want in every_eas:
            got = [rows_of(lr) for _, lr in auto[("eas", L, "--preload eas")][r].training_layers()]
            if got != want:
                problems.append(f"eas rank {r}: auto {got}, run {want}")
        decision = mm.choose_shard_sets([dirs["full"], dirs["eas"]], "sage", HIDDEN, L, 1, batches=(2,),
                                        dropout=0.5, inductive=True, job=(2, RANKS_PER_SERVER))
        if not all("evaluation_views" in o.breakdown for o in decision.rejected):
            problems.append("an option of auto lacks its evaluation views")
        planned_full = {o["label"]: o["peak_bytes"] for o in options if o["source"] == f"--hops {L}"}
        auto_full = {o.label: o.peak for o in decision.rejected if o.source == dirs["full"]}
        if not auto_full or any(planned_full.get(label) != peak for label, peak in auto_full.items()):
            problems.append(f"estimates differ: plan {planned_full}, auto {auto_full}")
    agreed(problems)


def test_auto_calibrates_at_the_train_induced_graph_s_degree(datasets):
    """An inductive run trains on the train-induced graph, so --mode auto measures the compute rate at its
    in-edges per row (ShardSetOptions.degree), counted here with NumPy from the raw graph: fb computes every
    training vertex, from its in-edges out of training vertices.  The dataset's average degree differs."""
    graph, dirs, *_ = planned(datasets, "cora")
    problems = []
    if WORLD.rank == 0:
        found = mm.shard_set_options([dirs["full"]], "sage", HIDDEN, L, 1, dropout=0.5, inductive=True,
                                     job=(WORLD.size // RANKS_PER_SERVER, RANKS_PER_SERVER))
        dst = np.repeat(np.arange(graph.num_vertices), np.diff(graph.indptr))
        train = np.asarray(graph.train_mask, dtype=bool)
        want = np.count_nonzero(train[dst] & train[graph.indices]) / np.count_nonzero(train)
        if found.degree != pytest.approx(want, rel=1e-12):
            problems.append(f"auto's degree {found.degree}, the train-induced graph's {want}")
        if abs(graph.indptr[-1] / graph.num_vertices - want) < 1:
            problems.append("the test needs a dataset whose average degree differs from its train-induced graph's")
    agreed(problems)
