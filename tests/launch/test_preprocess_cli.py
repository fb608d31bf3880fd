"""`granndis preprocess build/verify/info` end to end, under mpirun (subprocess) and in-process."""
import os

import numpy as np
import pytest

from granndis_hpc import shards
from granndis_hpc.preprocess.__main__ import main
from tests.conftest import run_mpi


def _build_args(out, *extra, source=("--source", "synthetic", "--vertices", "1500", "--seed", "0")):
    return ["-m", "granndis_hpc.preprocess", "build", *source, "--servers", "2", "--gpus-per-server", "2",
            "--layers", "2", "--out", str(out), *extra]


def test_cora_build_under_mpirun_then_verify_and_info(tmp_path, planetoid_root, capsys):
    out = tmp_path / "cora-full"
    res = run_mpi(_build_args(out, "--preload", "full", "--partitioner", "parmetis",
                              source=("--source", "planetoid", "--name", "cora", "--root", str(planetoid_root))), n=2)
    assert res.returncode == 0, res.stderr
    for phase in ("load", "partition", "halos+write", "commit"):  # one progress line per phase, rank 0 only
        assert res.stdout.count(f"[preprocess] {phase} ") == 1
    assert main(["verify", str(out)]) == 0
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"OK: {out}" in text and "cora: 2708 vertices" in text and "edge cut" in text
    m = shards.read_manifest(out)
    assert m["command"].startswith("mpirun -n 2 granndis preprocess build --source planetoid")
    assert m["partitioner"]["name"] == "parmetis" and m["partitioner"]["edge_cut_fraction"] < 0.2
    sl = shards.read_rank_slice(out, m, 1, 1)
    assert sl.n_inner > 0 and sl.features.shape[1] == 1433


def test_eas_build_single_rank_in_process(tmp_path, capsys):
    out = tmp_path / "syn-eas"
    assert main(_build_args(out, "--preload", "eas", "--hops", "2", "--eas-fanout", "3", "--partitioner",
                            "metis")[2:]) == 0
    m = shards.read_manifest(out)
    assert m["preload"] == {"kind": "eas", "hops": 2, "fanout": 3, "select": "degree"}
    assert main(["verify", str(out)]) == 0
    hop_counts = [s["hop_counts"] for s in m["stats"]["servers"]]
    for counts in hop_counts:
        assert len(counts) == 3 and counts[1] <= 3 * counts[0] and counts[2] <= 3 * counts[1]


@pytest.mark.parametrize("extra,message", [
    (("--hops", "0"), "--hops must be >= 1"),
    (("--hops", "4"), "--hops 4 > --layers"),
    (("--servers", "40", "--gpus-per-server", "40"), "1600 GPUs but the graph has only 1500 vertices"),
])
def test_bad_input_fails_on_every_rank(tmp_path, extra, message):
    res = run_mpi(_build_args(tmp_path / "x", *extra), n=2, timeout=120)
    assert res.returncode != 0
    # Said once, by rank 0, for both ranks.
    assert "error (rank 0)" in res.stderr and "error (rank 1)" not in res.stderr and message in res.stderr
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_existing_output_refused_on_every_rank_and_left_alone(tmp_path):
    out = tmp_path / "set"
    assert main(_build_args(out, "--partitioner", "random")[2:]) == 0
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    res = run_mpi(_build_args(out, "--partitioner", "random"), n=2, timeout=120)
    assert res.returncode != 0
    assert "already exists" in res.stderr and "--overwrite" in res.stderr
    assert "error (rank 0)" in res.stderr and "error (rank 1)" not in res.stderr  # said once
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


def test_missing_parmetis_library_is_a_clear_error(tmp_path):
    res = run_mpi(_build_args(tmp_path / "x"), n=2, timeout=120,
                  env={"GRANNDIS_PARMETIS_LIB": "/nonexistent/libparmetis.so"})
    assert res.returncode != 0
    assert "cannot load a ParMETIS library" in res.stderr and "--partitioner metis" in res.stderr


def test_verify_cli_reports_corrupted_file(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(_build_args(out, "--partitioner", "random", "--preload", "eas")[2:]) == 0
    path = out / "server-0000.h5"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert "PROBLEM" in text and "server-0000.h5" in text
    os.unlink(out / "manifest.json")
    assert main(["verify", str(out)]) == 1
    assert main(["info", str(out)]) == 1
    assert "no manifest.json" in capsys.readouterr().err


def test_features_match_the_loaded_graph(tmp_path):
    from granndis_hpc.preprocess.sources import load

    out = tmp_path / "set"
    assert main(_build_args(out, "--partitioner", "metis")[2:]) == 0
    g = load("synthetic", vertices=1500, seed=0)
    m = shards.read_manifest(out)
    assert m["dataset"]["num_edges"] == g.num_edges
    for s in range(2):
        for q in range(2):
            sl = shards.read_rank_slice(out, m, s, q)
            np.testing.assert_array_equal(sl.features, g.features[sl.global_id])
            np.testing.assert_array_equal(sl.in_degree, g.in_degree()[sl.global_id])
