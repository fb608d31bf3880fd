"""cluster/devices.py: the device of every rank from what the ranks report, for each binding Slurm
offers (one GPU per task, all of a node's GPUs per task, a socket's GPUs per task), without GPUs."""
import pytest

from granndis_hpc.cluster.devices import device_kind, gpu_positions, scheduler_gpus, select_gpu


def _choose(hosts, visible_sets, visible, share=False):
    return [select_gpu(p, c, visible, share, h) for (p, c), h in zip(gpu_positions(hosts, visible_sets), hosts)]


def test_one_gpu_per_task_each_rank_takes_its_only_gpu():  # --gpus-per-task=1 / --gpu-bind=single:1
    hosts = ["n1"] * 4 + ["n2"] * 4
    sets = [(f"GPU-{h}-{i}",) for h in ("n1", "n2") for i in range(4)]
    assert _choose(hosts, sets, 1) == [(0, "")] * 8


def test_all_node_gpus_visible_rank_i_of_the_host_takes_gpu_i():  # --gpus-per-node=4, no binding
    hosts = ["n1"] * 4 + ["n2"] * 4
    sets = [("n1-all",)] * 4 + [("n2-all",)] * 4
    assert [i for i, _ in _choose(hosts, sets, 4)] == [0, 1, 2, 3] * 2


def test_closest_binding_two_gpus_per_socket_ranks_take_the_socket_gpus_in_order():  # --gpu-bind=closest
    hosts = ["n1"] * 4
    sets = [("g0", "g1"), ("g0", "g1"), ("g2", "g3"), ("g2", "g3")]  # the ranks >= 2 failed before
    assert [i for i, _ in _choose(hosts, sets, 2)] == [0, 1, 0, 1]


def test_more_ranks_than_gpus_is_an_error_unless_sharing_is_asked_for():
    hosts, sets = ["n1", "n1"], [("g0",), ("g0",)]
    (idx, problem), _ = _choose(hosts, sets, 1)
    assert idx is None and "2 ranks on n1 see the same 1 GPU(s)" in problem and "--share-gpus" in problem
    assert _choose(hosts, sets, 1, share=True) == [(0, ""), (0, "")]
    assert select_gpu(0, 1, 0, False, "n3") == (None, "no GPU is visible to this rank on n3")


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_auto_never_falls_back_to_the_cpu_when_some_ranks_see_no_gpu(requested):
    kind, problem = device_kind(requested, [True, False, True], ["a", "b", "c"])
    assert kind == "cuda" and "CUDA is not available on host b (1 of 3 ranks see no GPU: rank 1 on b)" in problem
    assert device_kind(requested, [True, True], ["a", "b"]) == ("cuda", "")
    assert device_kind("cpu", [True, False], ["a", "b"]) == ("cpu", "")
    assert device_kind("auto", [False, False], ["a", "b"]) == ("cpu", "")
    assert device_kind("cuda", [False, False], ["a", "b"])[1]


@pytest.mark.parametrize("environ, given", [
    ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES=0"),
    ({"SLURM_JOB_GPUS": "0,1"}, "SLURM_JOB_GPUS=0,1"),
    ({"SLURM_GPUS_ON_NODE": "4"}, "SLURM_GPUS_ON_NODE=4"),
    ({"SLURM_GPUS_PER_NODE": "a100:2"}, "SLURM_GPUS_PER_NODE=a100:2"),
    ({}, ""),
    ({"CUDA_VISIBLE_DEVICES": ""}, ""),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, ""),
    ({"CUDA_VISIBLE_DEVICES": "-1", "SLURM_GPUS_PER_NODE": "0", "SLURM_GPUS_ON_NODE": "0"}, ""),
])
def test_the_gpus_the_scheduler_gave_are_read_from_its_variables(environ, given):
    assert scheduler_gpus(environ) == given


def test_auto_refuses_the_cpu_when_the_scheduler_gave_gpus_that_torch_cannot_see():
    kind, problem = device_kind("auto", [False, False], ["n1", "n1"], ["", "CUDA_VISIBLE_DEVICES=0"],
                                "torch 2.13.0+cpu (a CPU-only build)")
    assert problem.startswith("--device auto: the scheduler gave rank 1 on n1 GPUs (CUDA_VISIBLE_DEVICES=0; 1 of 2")
    assert "torch 2.13.0+cpu (a CPU-only build) sees no CUDA" in problem
    assert "install a CUDA build of torch" in problem and "--device cpu" in problem
    # no GPUs given: the CPU, as before; --device cpu: the CPU deliberately, whatever the scheduler gave
    assert device_kind("auto", [False, False], ["n1", "n1"], ["", ""]) == ("cpu", "")
    assert device_kind("cpu", [False], ["n1"], ["CUDA_VISIBLE_DEVICES=0"]) == ("cpu", "")
