"""Refusals of bad input under `mpirun -n 2` (docs/reliability.md, "declared counts, full disks, damaged run
files"): one statement of each, by rank 0, exit non-zero, nothing written."""
from tests.conftest import run_mpi
from tests.unit.test_input_counts_and_paths import _distdgl


def test_a_cut_edge_file_fails_a_two_rank_build_once_and_writes_nothing(tmp_path):
    d = tmp_path / "dgl"
    _distdgl(d)
    (d / "edges/e2.txt").write_text("0 1\n")
    out = tmp_path / "shards"
    r = run_mpi(["-m", "granndis_hpc.preprocess", "build", "--source", "chunked", "--path", d, "--servers", "2",
                 "--gpus-per-server", "1", "--layers", "1", "--partitioner", "metis", "--out", out], n=2, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "declares 120 edges but the edge files hold 81" in r.stderr, r.stderr
    assert "error (rank 1)" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


def test_option_errors_warnings_and_nothing_fits_are_said_once_under_mpirun():
    """Under `mpirun -n 2` every rank printed them (the deprecation warnings ran together on one line)."""
    r = run_mpi(["-m", "granndis_hpc.preprocess", "build", "--fanout", "5", "--no-such-option"], n=2, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("warning: --fanout is deprecated") == 1, r.stderr
    assert r.stderr.count("unrecognized arguments: --no-such-option") == 1, r.stderr
    r = run_mpi(["-m", "granndis_hpc.preprocess", "plan", "--source", "synthetic", "--vertices", "300", "--servers",
                 "2", "--gpus-per-server", "1", "--layers", "1", "--partitioner", "random", "--memory-per-gpu", "1KiB"],
                n=2, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("nothing fits") == 1 and "(rank 1)" not in r.stderr, r.stderr


def test_predict_overwrite_of_a_foreign_directory_fails_every_rank_and_keeps_it(tmp_path):
    """`predict --out DIR --overwrite` deleted DIR, whatever it held, and exited 0 (granndis_hpc/outputs.py)."""
    import os
    import shutil

    import torch

    from granndis_hpc import shards
    from granndis_hpc.engine.model_source import model_provenance
    from granndis_hpc.nn.models import build_model
    from tests.unit.test_predict_files import ARCH
    from tests.unit.test_shards import build, make_graph

    build(make_graph(n=200, m=800), tmp_path / "shards", servers=1, gpus_per_server=2)
    manifest = shards.read_manifest(str(tmp_path / "shards"))
    (tmp_path / "run").mkdir()
    torch.save({"epoch": 1, "model": build_model("sage", 7, 8, 5, 2, dropout=0.0, norm=False).state_dict(),
                "provenance": model_provenance(dict(ARCH, shards=str(tmp_path / "shards")), manifest)},
               tmp_path / "run" / "best-model.pt")
    mine = tmp_path / "mine"
    shutil.copytree(tmp_path / "run", mine)  # a directory of the user's: here, a copy of the model
    r = run_mpi(["-m", "granndis_hpc.cli", "predict", "--model", tmp_path / "run", "--shards", tmp_path / "shards",
                 "--ranks-per-server", "2", "--out", mine, "--overwrite"], n=2, timeout=180)
    assert r.returncode == 1, r.stderr
    assert f"refusing --out {mine}: it holds best-model.pt, not predictions written by granndis predict" in r.stderr
    assert r.stderr.count("refusing --out") == 1 and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(mine) == ["best-model.pt"]


def test_device_auto_refuses_the_cpu_when_the_scheduler_gave_gpus_torch_cannot_see(tmp_path):
    """A CPU wheel of torch on a GPU node: `--device auto` trained on the CPU without a word."""
    import torch

    from tests.unit.test_shards import build, make_graph

    if torch.cuda.is_available():
        import pytest
        pytest.skip("this torch sees CUDA: the refusal is for one that does not")
    build(make_graph(n=200, m=800), tmp_path / "shards", servers=2, gpus_per_server=1)
    r = run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", tmp_path / "shards", "--epochs", "1", "--layers", "2",
                 "--device", "auto", "--out", tmp_path / "run"], n=2, timeout=180,
                env={"SLURM_JOB_GPUS": "0"})
    assert r.returncode != 0, r.stderr
    assert r.stderr.count("the scheduler gave rank 0 on") == 1, r.stderr
    assert "(SLURM_JOB_GPUS=0; 2 of 2 ranks have GPUs)" in r.stderr and "--device cpu" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
