"""`preprocess plan` with EAS and `--hops H` from the build ranks' slices under `mpirun -n 4`,
P = 1, 2, 4 (sub-communicators).

plan_sets.plan_options_sliced counts the EAS build and the one build of --hops H with the sliced
build's own steps (dist_server.select_halo's EAS selection and k-hop BFS, assign_owners_sliced), and
samples the co-batches on each server's graph assembled on its writer rank (dist_server.server_graph).
The reference is the whole-graph plan (plan_sets.plan_options on the assembled graph: halo.eas /
halo.full_khop and build.build_server in one process per server): for the same inputs and P the
options (rows, edges, bytes, estimates), the decision, the partition entry, the server loads and the
printed table and build-memory lines must be equal.  Cases: real Cora and a synthetic graph, both read
from chunked directories (tests/mpi/test_hops_auto_sliced.py's fixture).
"""
import dataclasses

import pytest
from mpi4py import MPI

from tests.mpi import test_hops_auto_sliced as _hops
from tests.mpi.conftest import on_rank0
from tests.mpi.test_hops_auto_sliced import G, L, S

pytestmark = pytest.mark.mpi(min_size=4)
WORLD = MPI.COMM_WORLD
chunk_dirs = _hops.chunk_dirs  # Cora and the synthetic graph as chunked directories (a fixture)

# The default set (full k = 0..L one build each, EAS with co-batches), the 2-hop build (no co-batches
# on it: 2 < L) with the EAS build of 2 hops and a fanout of 3, the L-hop build (co-batches on both)
# with a random co-batch sample (fanout 4) and a co-batch count no server can make (skipped).
CASES = {"default": {}, "hops2": dict(hops=2, eas_hops=2, fanout=3),
         "hops3": dict(hops=3, cob_fanout=4, cob_batches=(2, 8, 1 << 20))}


def _config(partitioner, **kw):
    from granndis_hpc.preprocess.plan.command import PlanConfig

    return PlanConfig(servers=S, gpus_per_server=G, layers=L, hidden=16, device="cpu", partitioner=partitioner,
                      seed=1, **kw)


def _printed(graph, result, cfg, P):
    """What `preprocess plan` prints of a result (rank 0's table and build-memory lines)."""
    from granndis_hpc import memory_model as mm
    from granndis_hpc.preprocess.plan.command import build_memory_lines, format_table

    decision = mm.choose(result["options"], cfg.budget)
    lines, record = build_memory_lines(graph, result, graph.num_edges, P, cfg.partitioner, 1 << 30)
    return format_table(result["options"], cfg, decision) + "\n" + "\n".join(lines), decision.to_dict(), record


def _check_plan(case):
    def check(comm, part, whole):
        from granndis_hpc.preprocess.plan.sets import plan_options

        P = comm.size
        for name, kw in CASES.items():
            cfg = _config("parmetis" if case == "cora" else "metis", **kw)
            got, ref = plan_options(comm, part, cfg), plan_options(comm, whole, cfg)
            labels = [o.label for o in ref["options"]]
            assert "eas" in labels and any(x.startswith("cob") for x in labels), (name, labels)
            assert [o.to_dict() for o in got["options"]] == [o.to_dict() for o in ref["options"]], name
            assert got["partition"] == ref["partition"], name
            # plan_options gathers the loads on rank 0; the counts have them on every rank
            same_loads = comm.bcast(got["server_loads"] == ref["server_loads"] if comm.rank == 0 else None)
            assert same_loads, name

            def same_printed():  # on rank 0, told to every rank: none goes on to the next case alone
                for budget in sorted({o.peak for o in ref["options"]})[::2] + [1]:  # fits some, fits none
                    b = dataclasses.replace(cfg, budget=budget)
                    mine, theirs = _printed(part, got, b, P), _printed(whole, ref, b, P)
                    assert mine == theirs, f"{name}, budget {budget}:\n{mine}\n-- whole graph --\n{theirs}"

            on_rank0(same_printed, comm)
    return check


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["cora", "synthetic"])
def test_plan_eas_and_hops_from_slices_equal_whole_graph(case, chunk_dirs, monkeypatch):
    _hops.on_slices(case, chunk_dirs, monkeypatch, _check_plan(case))
