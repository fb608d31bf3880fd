"""End-to-end: `granndis preprocess build` then `granndis train` under `mpirun -n 4` (2 servers x 2 ranks).

Accuracy on real Cora (standard split), the run-directory outputs, the ledger's byte counts against
volumes computed independently from the shard files, and bad input failing on every rank, fast."""
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import REPO, mpi_env, require_planetoid, run_mpi

LAYERS = 2


def _build(out, *extra):
    cmd = [sys.executable, "-m", "granndis_hpc.preprocess", "build", "--source", "planetoid", "--name", "cora",
           "--root", str(require_planetoid()), "--servers", "2", "--gpus-per-server", "2", "--layers", str(LAYERS),
           "--partitioner", "metis", "--out", str(out), *extra]
    res = subprocess.run(cmd, cwd=REPO, env=mpi_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@pytest.fixture(scope="module")
def cora_shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("cora")
    return {"full": _build(base / "full", "--preload", "full"),
            "eas": _build(base / "eas", "--preload", "eas", "--hops", "1", "--eas-fanout", "15")}


def _train(shards, mode, run_dir, *extra, timeout=300):
    return run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", shards, "--ranks-per-server", "2",
                    "--mode", mode, "--layers", str(LAYERS), "--out", run_dir, *extra], timeout=timeout)


def _summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


FLX_ACCURACY = {}  # filled by the test above, reused below to save a 200-epoch run
ACCURACY_ARGS = ["--hidden", "64", "--lr", "0.01", "--dropout", "0", "--weight-decay", "5e-4", "--eval-every", "0",
                 "--quiet"]


# SAGE only: GCN's flx accuracy on Cora is tests/mpi/test_published_accuracy.py's (CiteSeer's: bench/bench_accuracy.py).
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("model", ["sage"])
def test_cora_accuracy_of_flx_and_eas(cora_shards, tmp_path, model):
    """200 epochs through the command line.  fb is not run here: it computes exactly what flx computes
    (logits and parameters equal on real Cora: tests/mpi/test_engine_exact.py)."""
    args = ["--model", model, "--epochs", "200", *ACCURACY_ARGS]
    acc = {}
    for mode in ("flx", "eas"):
        shards = cora_shards["eas" if mode == "eas" else "full"]
        res = _train(shards, mode, tmp_path / mode, *args)
        assert res.returncode == 0, res.stdout + res.stderr
        summary = _summary(tmp_path / mode)
        acc[mode] = summary["accuracy"]["test"]
        records = [json.loads(l) for l in open(tmp_path / mode / "metrics.jsonl")]
        assert len(records) == summary["epochs"] == 200
        assert records[-1]["loss"] < records[0]["loss"]
    print(f"\nCora {model} test accuracy: {acc}")
    FLX_ACCURACY[model] = acc["flx"]
    assert acc["flx"] >= 0.78
    assert acc["eas"] >= 0.70


@pytest.mark.timeout(1200)
def test_cora_cobatch_accuracy_near_flx(cora_shards, tmp_path):
    """CoB-SAGE (fanout 10, 4 co-batches per epoch) and CoB-EAS within 2 points of flx."""
    if "sage" not in FLX_ACCURACY:
        res = _train(cora_shards["full"], "flx", tmp_path / "flx", "--model", "sage", "--epochs", "200",
                     *ACCURACY_ARGS)
        assert res.returncode == 0, res.stdout + res.stderr
        FLX_ACCURACY["sage"] = _summary(tmp_path / "flx")["accuracy"]["test"]
    acc = {}
    for name, shards, extra in (("cob-sage", "full", ["--fanout", "10"]), ("cob-eas", "eas", ["--fanout", "-1"])):
        res = _train(cora_shards[shards], "cob", tmp_path / name, "--model", "sage", "--epochs", "50",
                     "--batches-per-epoch", "4", *extra, *ACCURACY_ARGS)
        assert res.returncode == 0, res.stdout + res.stderr
        acc[name] = _summary(tmp_path / name)["accuracy"]["test"]
    print(f"\nCora sage test accuracy: flx {FLX_ACCURACY['sage']}, {acc}")
    for name, a in acc.items():
        assert a >= FLX_ACCURACY["sage"] - 0.02, (name, a)


def _rank_gpu_rows(shards):
    """Per server: owner GPU and hop of each row, and the world view — read straight from the files."""
    out = []
    for s in range(2):
        with h5py.File(os.path.join(shards, f"server-{s:04d}.h5"), "r") as f:
            out.append({k: f[k][...] for k in ("vertices/offsets", "vertices/hop", "graph/indptr",
                                               "graph/indices", "world/indptr", "world/src_rank",
                                               "world/src_global_id", "world/offsets")})
    return out


def _expected_halo_bytes(shards, hidden, classes_unused, num_features):
    """Independent count of fb's and flx's halo bytes per epoch (forward + backward), float32 rows.

    fb: each layer l>0 exchanges hidden-wide rows: for every rank, the distinct (owner, vertex) pairs it
    reads from other ranks, once forward and once backward (layer 0 reads raw features cached at
    set-up, and has no backward exchange).  Split by whether the owner is on the same server."""
    data = _rank_gpu_rows(shards)
    intra = inter = 0
    for s, d in enumerate(data):
        G = 2
        for g in range(G):
            me = s * G + g
            lo, hi = d["world/offsets"][g], d["world/offsets"][g + 1]
            e0, e1 = d["world/indptr"][lo], d["world/indptr"][hi]
            ranks, gids = d["world/src_rank"][e0:e1], d["world/src_global_id"][e0:e1]
            pairs = np.unique(np.stack([ranks, gids], 1)[ranks != me], axis=0)
            same = (pairs[:, 0] // G) == s
            per_row = 4 * hidden * 2 * (LAYERS - 1)  # float32, forward + backward, layers 1..L-1
            intra += int(same.sum()) * per_row
            inter += int((~same).sum()) * per_row
    return intra, inter


@pytest.mark.timeout(600)
def test_ledger_bytes_match_shard_volumes(cora_shards, tmp_path):
    hidden = 16
    # The shard volumes are per (sending, receiving) rank pair: the direct route's bytes (the per-server
    # route's are counted independently in tests/mpi/test_halo_route.py).
    res = _train(cora_shards["full"], "fb", tmp_path / "fb", "--model", "sage", "--hidden", str(hidden),
                 "--epochs", "2", "--eval-every", "0", "--quiet", "--halo-route", "direct")
    assert res.returncode == 0, res.stdout + res.stderr
    fb = _summary(tmp_path / "fb")["bytes_per_epoch"]
    intra, inter = _expected_halo_bytes(cora_shards["full"], hidden, None, None)
    assert (fb["intra_halo"], fb["inter_halo"]) == (intra, inter)
    assert inter > 0

    res = _train(cora_shards["full"], "flx", tmp_path / "flx", "--model", "sage", "--hidden", str(hidden),
                 "--epochs", "2", "--eval-every", "0", "--quiet")
    assert res.returncode == 0, res.stdout + res.stderr
    flx = _summary(tmp_path / "flx")["bytes_per_epoch"]
    assert flx["inter_halo"] == 0
    # Only gradients cross servers, and fb and flx all-reduce the same parameters.
    assert flx["inter_grad"] == fb["inter_grad"] > 0
    assert fb["inter_grad"] == _analytic_inter_grad(tmp_path / "flx")


def _analytic_inter_grad(run_dir):
    """Parameters of the model from config.json, counted independently of the engine."""
    cfg = json.load(open(os.path.join(run_dir, "config.json")))
    meta = json.load(open(os.path.join(cfg["shards"], "manifest.json")))["dataset"]
    f, h, c = meta["num_features"], cfg["hidden"], meta["num_classes"]
    widths = [f] + [h] * (cfg["layers"] - 1) + [c]
    # SAGE: W_self and W_neigh (in x out) per layer and one bias per layer.
    params = sum(2 * a * b + b for a, b in zip(widths[:-1], widths[1:]))
    # One bucket (< 25 MB); a ring all-reduce among S leaders sends 2 (S-1) times the payload in all.
    return 2 * (2 - 1) * params * 4


def _assert_fails_everywhere(res, *needles):
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.timeout(900)
def test_bad_input_fails_on_every_rank(cora_shards, tmp_path):
    full = str(cora_shards["full"])
    # Shards built for 2 servers x 2 GPUs, job with 4 servers x 1 rank.
    res = run_mpi(["-m", "granndis_hpc.cli", "train", "--shards", full, "--ranks-per-server", "1",
                   "--epochs", "1", "--layers", str(LAYERS)], timeout=120)
    _assert_fails_everywhere(res, "2 servers x 2 GPUs")
    # Layer count the shards were not built for.
    res = _train(full, "flx", tmp_path / "l3", "--layers", "3", timeout=120)
    _assert_fails_everywhere(res, "layer")
    # flx on an EAS shard.
    res = _train(str(cora_shards["eas"]), "flx", tmp_path / "e", "--epochs", "1", timeout=120)
    _assert_fails_everywhere(res, "full preload")
    # A corrupted shard file fails its checksum, naming the file.
    bad = tmp_path / "corrupt"
    shutil.copytree(full, bad)
    with open(bad / "server-0001.h5", "r+b") as f:
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    res = _train(str(bad), "fb", tmp_path / "c", "--epochs", "1", timeout=120)
    _assert_fails_everywhere(res, "server-0001.h5")
    # Unknown model / mode: a usage error on every rank.
    res = _train(full, "fb", tmp_path / "m", "--model", "gatv9", timeout=120)
    _assert_fails_everywhere(res, "gatv9")
    res = _train(full, "warp", tmp_path / "w", timeout=120)
    _assert_fails_everywhere(res, "warp")
    # A diverging run: the loss becomes NaN and every rank stops with a clear message.
    res = _train(full, "fb", tmp_path / "nan", "--lr", "1e30", "--epochs", "20", timeout=120)
    _assert_fails_everywhere(res, "loss became")
    # ... as the trainer's one-line error on every rank, not a traceback and MPI_ABORT.
    assert "Traceback" not in res.stderr and "MPI_ABORT" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert {int(r) for r in re.findall(r"^\[rank (\d+)\] TrainingError: loss became", res.stderr, re.M)} \
        == {0}, res.stderr[-3000:]  # every rank raised it; rank 0 says it once
