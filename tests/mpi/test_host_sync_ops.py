"""Every operation of a training step that would make the host wait for a GPU, Python- and C++-level,
forward and backward (cluster/hostsync.SyncCounter(ops=True), the rules in cluster/syncops.py), counted
on the CPU for every mode and the step's main options, 2 servers x 2 ranks on real Cora, in the second
epoch's steps (the first builds each graph's matrices once).  Each case's count per step is exact, on
every rank, and every call is one of the listed known ones (docs/gpu.md, "Host synchronisations per
step"); a new one fails with its file and line."""
from collections import Counter

import pytest
from mpi4py import MPI

from granndis_hpc.nn import sparse
from tests.mpi.conftest import counted_steps, make_trainer, on_every_rank

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
BATCHED = {"batches_per_epoch": 2, "fanout": 5}

# --halo-route per-server and --overlap-halos world are the defaults (the cases without the option).
CASES = {
    "fb": ("full", "fb", {}),
    "flx": ("full", "flx", {"preloaded_layers": 1, "dropout": 0.5}),
    "eas": ("eas", "eas", {}),
    "cob": ("full", "cob", BATCHED),
    "mb": ("full", "mb", BATCHED),
    "fb --no-overlap": ("full", "fb", {"no_overlap": True}),
    "flx --overlap-halos all": ("full", "flx", {"preloaded_layers": 1, "overlap_halos": "all"}),
    "cob --overlap-halos all": ("full", "cob", {**BATCHED, "overlap_halos": "all"}),
    "fb --input-dropout": ("full", "fb", {"input_dropout": 0.3}),
    "fb --halo-route direct": ("full", "fb", {"halo_route": "direct"}),
    "flx --halo-route direct": ("full", "flx", {"preloaded_layers": 1, "halo_route": "direct"}),
    "flx --no-overlap": ("full", "flx", {"preloaded_layers": 1, "no_overlap": True}),
    "cob --no-overlap": ("full", "cob", {**BATCHED, "no_overlap": True}),
    "flx --input-dropout": ("full", "flx", {"preloaded_layers": 1, "input_dropout": 0.3}),
    "fb --host-staging": ("full", "fb", {"host_staging": True}),
    "fb --host-staging --no-overlap": ("full", "fb", {"host_staging": True, "no_overlap": True}),
    "fb 4x1": (1, "fb", {"ranks_per_server": 1}),
    "fb 4x1 --halo-route direct": (1, "fb", {"ranks_per_server": 1, "halo_route": "direct"}),
    "flx 4x1": (1, "flx", {"ranks_per_server": 1, "preloaded_layers": 1}),
    "fb 4x1 --host-staging": (1, "fb", {"ranks_per_server": 1, "host_staging": True}),
}


# (call, file) -> why it is there.  docs/gpu.md lists the same.
GRAPH_BUILD = "cob with --overlap-halos all splits each new co-batch's rows and builds its matrices in the step"
KNOWN = {
    ("__float__", "granndis_hpc/engine/trainer.py"): "the step's loss, returned to the epoch",
    ("__int__", "granndis_hpc/nn/dropout.py"): "input dropout counts the input's nonzeros (sparse or dense mask)",
    ("aten.nonzero", "granndis_hpc/nn/dropout.py"): "input dropout hashes only the nonzero inputs",
    ("__int__", "granndis_hpc/nn/rows.py"): GRAPH_BUILD + ": RowSplit checks its rows' range",
    ("__bool__", "granndis_hpc/nn/rows.py"): GRAPH_BUILD + ": RowSplit checks its rows are sorted",
    ("aten.nonzero", "granndis_hpc/nn/rows.py"): GRAPH_BUILD + ": RowSplit's other rows",
    ("aten._unique2", "granndis_hpc/engine/views.py"): GRAPH_BUILD + ": the rows a layer sends",
    ("__int__", "granndis_hpc/engine/exchange.py"): GRAPH_BUILD + ": the send index's rounds",
    ("aten.index", "granndis_hpc/engine/exchange.py"): GRAPH_BUILD + ": each round's positions (a mask)",
    ("aten.index", "granndis_hpc/nn/graph.py"): GRAPH_BUILD + ": a split matrix's entries (a mask)",
    ("aten.repeat_interleave", "granndis_hpc/nn/graph.py"): GRAPH_BUILD + ": a matrix's destination rows",
    ("__bool__", "granndis_hpc/nn/sparse.py"): GRAPH_BUILD + ": CSR conversion checks the entries' order",
    ("aten.unique_consecutive", "granndis_hpc/nn/sparse.py"): GRAPH_BUILD + ": CSR conversion sums duplicates",
    ("aten.bincount", "granndis_hpc/nn/sparse.py"): GRAPH_BUILD + ": CSR conversion's row pointers",
}
# Per steady step, on every rank (the same count on all four here).
PER_STEP = {case: 1 for case in CASES}
PER_STEP.update({"fb --input-dropout": 3, "flx --input-dropout": 3, "cob --overlap-halos all": 99})
# A CSR conversion reads its entries' order only with two entries or more, and sums duplicates only with
# one or more: at most once per conversion (one bincount each), not counted in PER_STEP.
BY_DATA = [("__bool__", "granndis_hpc/nn/sparse.py"), ("aten.unique_consecutive", "granndis_hpc/nn/sparse.py")]
CONVERSION = ("aten.bincount", "granndis_hpc/nn/sparse.py")


@pytest.mark.parametrize("case", list(CASES))
def test_a_step_makes_exactly_its_listed_host_syncs(cora_shards, cora_shapes, monkeypatch, case):
    # The CPU's CSR conversion goes through scipy; the GPU's is torch's: count the GPU's branch.
    monkeypatch.setattr(sparse, "_SCIPY_DTYPES", ())
    preload, mode, extra = CASES[case]
    shards = cora_shapes[preload] if isinstance(preload, int) else cora_shards[(preload, 3)]
    trainer = make_trainer(shards, mode, epochs=2, **extra)
    try:
        trainer.train_epoch()
        per_step = [(counter.calls, counter.backward_ops) for counter in counted_steps(trainer, ops=True)]
    finally:
        trainer.close()

    def check():
        assert per_step, "the epoch ran no step"
        for calls, backward_ops in per_step:
            assert backward_ops > 0, "the counter saw no operator of the backward"
            unlisted = sorted({c for c in calls if (c[0], c[1].rsplit(":", 1)[0]) not in KNOWN})
            assert not unlisted, f"{case}: host syncs not listed in docs/gpu.md (call, file:line): {unlisted}"
            by_file = Counter((name, where.rsplit(":", 1)[0]) for name, where in calls)
            assert all(by_file[k] <= by_file[CONVERSION] for k in BY_DATA), dict(by_file)
            counted = len(calls) - sum(by_file[k] for k in BY_DATA)
            assert counted == PER_STEP[case], \
                f"{case}: {counted} host syncs a step, not {PER_STEP[case]} (call, where: times): " \
                f"{dict(Counter(calls))}"
    on_every_rank(check)
