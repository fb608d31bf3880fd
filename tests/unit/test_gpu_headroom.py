"""The GPU's headroom in `--mode auto`'s budget (memory_model/choice.usable_budget): measured where the
device is there (cluster/topology.device_memory: torch.cuda.mem_get_info of every rank, injected here so
the path runs on the CPU), the budget clipped to what is free; the fixed stand-in where nothing is measured."""
from types import SimpleNamespace

import pytest
import torch

from granndis_hpc import memory_model as mm
from granndis_hpc.cluster.topology import device_memory
from granndis_hpc.memory_model.choice import GPU_CONTEXT_BYTES, GPU_FRAGMENTATION, usable_budget
from tests.unit.test_memory_model import small_graph, small_shards  # noqa: F401 (fixtures)

GIB = 1 << 30


def test_without_a_measurement_the_context_is_the_fixed_stand_in():
    budget = 80 * GIB
    assert usable_budget(budget, "cpu") == budget
    assert usable_budget(budget, "cpu", (GIB, 2 * GIB)) == budget  # the CPU: nothing kept, nothing clipped
    fits = usable_budget(budget, "cuda")
    assert abs(fits * (1 + GPU_FRAGMENTATION) + GPU_CONTEXT_BYTES - budget) < 2
    assert usable_budget(GPU_CONTEXT_BYTES // 2, "cuda") == 0


@pytest.mark.parametrize("budget_gib,free_gib,total_gib,want_gib", [
    (80, 78.5, 80, 78.5),   # the whole device: what it holds now (1.5 GiB) is kept, the rest may be used
    (40, 78.5, 80, 38.5),   # a smaller budget: less what the device holds
    (80, 30, 80, 30),       # another process holds 50 GiB: clipped to the free memory
    (40, 0.5, 80, 0),       # nothing left
])
def test_a_measured_device_keeps_what_it_holds_and_clips_to_what_is_free(budget_gib, free_gib, total_gib, want_gib):
    fits = usable_budget(int(budget_gib * GIB), "cuda", (int(free_gib * GIB), int(total_gib * GIB)))
    assert abs(fits - want_gib * GIB / (1 + GPU_FRAGMENTATION)) < 2


def test_device_memory_takes_the_least_free_and_splits_a_shared_gpu():
    cuda = torch.device("cuda", 0)
    # Rank 0 (this one) and rank 1 share GPU "a" (--share-gpus); rank 2 has GPU "b" to itself.
    others = [("a", 60 * GIB, 80 * GIB), ("b", 50 * GIB, 80 * GIB)]
    world = SimpleNamespace(allgather=lambda mine: [mine, *others])
    topo = SimpleNamespace(device=cuda, world=world)
    got = device_memory(topo, mem_get_info=lambda d: (60 * GIB, 80 * GIB), identity=lambda d: "a")
    assert got == (30 * GIB, 80 * GIB)  # 60 GiB free on "a" split over its 2 ranks, below "b"'s 50
    assert device_memory(SimpleNamespace(device=torch.device("cpu"), world=world)) is None


def test_auto_on_a_gpu_with_little_free_memory_chooses_what_fits_the_free_memory(small_shards):  # noqa: F811
    sets = [str(small_shards)]
    roomy = mm.choose_shard_sets(sets, "sage", 16, 3, 80 * GIB, device="cuda", batches=(2, 4),
                                 device_memory=(79 * GIB, 80 * GIB))
    assert roomy.choice.label == "flx k=3"
    assert "the GPU reported 79 GiB free of 80 GiB at start-up: 1 GiB held" in roomy.reason, roomy.reason
    # The same budget, but the device has only room for less than flx k=3's peak: clipped, another choice.
    peak = roomy.choice.peak
    free = int(peak * (1 + GPU_FRAGMENTATION)) - 1
    tight = mm.choose_shard_sets(sets, "sage", 16, 3, 80 * GIB, device="cuda", batches=(2, 4),
                                 device_memory=(free, 80 * GIB))
    assert tight.choice is None or tight.choice.peak < peak
    assert any(o.label == "flx k=3" for o in tight.rejected)
