"""The Python API's results in one process: the shard-set cache (built once, reused after verification, built
again when a file was edited or anything it depends on changed), TrainResult and Predictions with their
named fields, predict()'s splits, scores, embeddings and gathers, and read_predictions."""
import json

import numpy as np
import pytest

import granndis_hpc as gd
from tests.unit.test_api_options import tiny_graph

pytest.importorskip("mpi4py")

TRAIN = dict(mode="fb", layers=2, hidden=4, epochs=2, eval_every=1, quiet=True)


def test_the_cache_reuses_a_verified_set_and_rebuilds_an_edited_one(tmp_path, capsys):
    first = gd.build(tiny_graph(), cache_dir=tmp_path, layers=2, quiet=True)
    assert (first.shape, first.preload, first.hops, first.layers, first.reused) == ("1x1", "full", 2, 2, False)
    assert first.path.startswith(str(tmp_path / "graph-1x1-full-"))
    again = gd.build(tiny_graph(), cache_dir=tmp_path, layers=2, quiet=True)
    assert (again.path, again.content_sha256, again.reused) == (first.path, first.content_sha256, True)

    # Another option, another graph or another shape: another entry, the first one untouched.
    other = gd.build(tiny_graph(), cache_dir=tmp_path, layers=2, hops=1, quiet=True)
    changed = gd.build(tiny_graph(seed=1), cache_dir=tmp_path, layers=2, quiet=True)
    shaped = gd.build(tiny_graph(), cache_dir=tmp_path, layers=2, servers=2, gpus_per_server=1, quiet=True)
    assert len({first.path, other.path, changed.path, shaped.path}) == 4
    assert not (other.reused or changed.reused or shaped.reused) and shaped.shape == "2x1"
    assert changed.content_sha256 != first.content_sha256 == shaped.content_sha256

    server_file = next(p for p in (tmp_path / first.path).iterdir() if p.suffix == ".h5")
    data = bytearray(server_file.read_bytes())
    data[-100] ^= 0xFF  # one byte of the set edited: its checksum and the manifest disagree
    server_file.write_bytes(bytes(data))
    capsys.readouterr()
    rebuilt = gd.build(tiny_graph(), cache_dir=tmp_path, layers=2)
    assert (rebuilt.path, rebuilt.reused) == (first.path, False)
    assert "does not match the manifest" in capsys.readouterr().out
    assert gd.build(tiny_graph(), cache_dir=tmp_path, layers=2, quiet=True).reused


def test_build_into_out_reuses_only_the_same_set(tmp_path):
    out = tmp_path / "set"
    assert not gd.build(tiny_graph(), out, layers=2, quiet=True).reused
    assert gd.build(tiny_graph(), out, layers=2, quiet=True).reused
    with pytest.raises(gd.GranndisError,
                       match=r"already exists and holds a shard set .*give --overwrite to replace it"):
        gd.build(tiny_graph(), out, layers=1, quiet=True)
    assert not gd.build(tiny_graph(), out, layers=1, overwrite=True, quiet=True).reused


def test_world_of_one_process():
    assert gd.world() == gd.World(rank=0, size=1, servers=1, ranks_per_server=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("api") / "run"
    return gd.train(tiny_graph(), out=run, build={"name": "tiny"}, **TRAIN)


def test_train_result_has_named_fields(trained):
    assert trained.completed and trained.rank == 0 and trained.metric == "accuracy"
    assert set(trained.metrics) == {"train", "val", "test"}
    assert trained.best["epoch"] in (0, 1) and set(trained.best) == {"epoch", "train", "val", "test"}
    assert trained.best_model == f"{trained.run_dir}/best-model.pt"
    assert [r["epoch"] for r in trained.history()] == [0, 1]
    assert trained.config.mode == "fb" and trained.config.shards == trained.shards.path
    assert (trained.shards.dataset, trained.shards.hops, trained.shards.reused) == ("tiny", 1, False)
    assert trained.shards.path.startswith(f"{trained.run_dir}/shard-cache/tiny-1x1-full-")
    with open(f"{trained.run_dir}/summary.json") as f:
        assert json.load(f) == trained.summary


def test_predict_every_vertex_and_one_split(trained, tmp_path):
    graph = tiny_graph()
    everything = gd.predict(trained, graph, quiet=True)
    assert everything.provenance["shards"] == trained.shards.path  # train()'s set, reused
    np.testing.assert_array_equal(everything.global_id, np.arange(60))
    assert everything.logits.shape == (60, 3) and everything.probabilities is None
    np.testing.assert_array_equal(everything.prediction, everything.logits.argmax(1))
    assert everything.scores is everything.logits and everything.embeddings is None

    test = gd.predict(trained.run_dir, trained.shards, split="test", probabilities=True, layer=1, quiet=True,
                      out=tmp_path / "test.h5")
    ids = np.flatnonzero(graph["test_mask"])
    np.testing.assert_array_equal(test.global_id, ids)
    np.testing.assert_allclose(test.probabilities.sum(1), 1, rtol=1e-5)
    assert test.embeddings.shape == (len(ids), 4) and test.out == str(tmp_path / "test.h5")
    np.testing.assert_array_equal(test.prediction, everything.prediction[ids])

    back = gd.read_predictions(tmp_path / "test.h5")
    prov = back.provenance
    assert (prov["split"], prov["output"], prov["layer"]) == ("test", "probabilities", 1)
    for name in ("global_id", "prediction", "probabilities", "embeddings"):
        np.testing.assert_array_equal(getattr(back, name), getattr(test, name))
    with pytest.raises(gd.GranndisError,
                       match=r"already exists and holds predictions .*give --overwrite to replace it"):
        gd.predict(trained, trained.shards, out=tmp_path / "test.h5", quiet=True)


@pytest.mark.parametrize("gather", ["root", "block"])
def test_one_process_holds_every_row_whatever_the_gather(trained, gather):
    rows = gd.predict(trained, trained.shards, gather=gather, quiet=True)
    np.testing.assert_array_equal(rows.global_id, np.arange(60))


def test_predictions_from_arrays_and_their_checks():
    p = gd.Predictions.from_arrays({"global_id": np.arange(3), "prediction": np.zeros(3, np.int64),
                                    "probabilities": np.full((3, 2), 0.5)}, {"split": "all"})
    assert len(p) == 3 and p.scores is p.probabilities and p.logits is None and p.provenance == {"split": "all"}
    with pytest.raises(ValueError, match=r"unexpected arrays \['extra'\]"):
        gd.Predictions.from_arrays({"global_id": np.arange(1), "prediction": np.arange(1), "extra": np.arange(1)}, {})


def test_a_stopped_run_has_no_metrics(tmp_path):
    stopped = gd.TrainResult(run_dir=str(tmp_path), summary=None, config=gd.TrainConfig(shards="s"), shards=None)
    assert not stopped.completed and stopped.metrics == {} and stopped.best is None and stopped.best_model is None


def test_resume_continues_a_run_with_its_own_options(tmp_path):
    run = tmp_path / "run"
    first = gd.train(tiny_graph(), out=run, **dict(TRAIN, checkpoint_every=1))
    resumed = gd.train(tiny_graph(), out=run, resume=run, epochs=3, quiet=True)
    assert resumed.shards.reused and resumed.shards.path == first.shards.path
    assert (resumed.summary["epochs"], len(resumed.history()), resumed.config.hidden) == (3, 3, 4)
    with pytest.raises(gd.OptionError, match=r"these options differ: hidden=8 \(the run has 4\)"):
        gd.train(tiny_graph(), out=run, resume=run, hidden=8)
    written = gd.predict(resumed, tiny_graph(), out=tmp_path / "new" / "dir" / "preds.h5", quiet=True)
    assert gd.read_predictions(written.out).provenance["rows"] == len(written) == 60  # its directory made
