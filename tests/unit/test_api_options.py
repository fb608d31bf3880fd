"""The Python API's option checking, in one process: a name that is not an option is refused with its close
matches, a bad value with the declaration's rule, both as OptionError (a GranndisError and a ValueError)
before anything is built; and `import granndis_hpc` loads neither torch nor MPI."""
import subprocess
import sys

import numpy as np
import pytest

import granndis_hpc as gd

pytest.importorskip("mpi4py")


def tiny_graph(n=60, seed=0) -> dict:
    """save_bundle's keywords of a small random graph with 3 classes."""
    rng = np.random.default_rng(seed)
    split = rng.random(n)
    return {"edge_index": rng.integers(0, n, (2, 4 * n)), "features": rng.standard_normal((n, 5)).astype(np.float32),
            "labels": rng.integers(0, 3, n), "train_mask": split < 0.4, "val_mask": (split >= 0.4) & (split < 0.7),
            "test_mask": split >= 0.7}


def test_import_loads_neither_torch_nor_mpi():
    code = ("import sys, granndis_hpc as gd; gd.TrainResult, gd.ShardSet, gd.GranndisError; "
            "print(sorted(m for m in ('torch', 'mpi4py', 'h5py', 'torch_geometric') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_api_names_are_the_top_level():
    assert set(gd.__all__) >= {"build", "train", "predict", "read_predictions", "world", "ShardSet", "TrainResult",
                               "Predictions", "GranndisError", "OptionError", "TrainConfig"}
    assert issubclass(gd.OptionError, gd.GranndisError) and issubclass(gd.OptionError, ValueError)
    with pytest.raises(AttributeError):
        gd.no_such_name


@pytest.mark.parametrize("options, message", [
    ({"epohcs": 3}, r"train\(\): unknown option 'epohcs' \(did you mean 'epochs'\?\)"),
    ({"hiden": 8, "lrr": 0.1}, r"unknown options 'hiden' \(did you mean 'hidden'\?\), 'lrr' \(did you mean 'lr'"),
    ({"lr": -1.0}, r"train\(\): --lr: must be > 0.0, got -1.0"),
    ({"mode": "fastest"}, r"--mode: 'fastest' is not one of the allowed values: 'fb', 'flx'"),
    ({"epochs": "5"}, r"--epochs: expected int, got '5'"),
    ({"weight_decay_on": "first"}, r"--weight-decay-on first says which parameters"),
])
def test_train_refuses_a_bad_option(tmp_path, options, message):
    with pytest.raises(gd.OptionError, match=message) as info:
        gd.train(tiny_graph(), out=tmp_path / "run", **options)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()  # refused before anything was built or written


def test_train_reads_a_config_file_and_refuses_its_unknown_keys(tmp_path):
    toml = tmp_path / "opts.toml"
    toml.write_text("epochs = 2\nhiden = 8\n")
    with pytest.raises(gd.OptionError, match=r"key 'hiden': unknown option. Did you mean 'hidden'"):
        gd.train(tiny_graph(), out=tmp_path / "run", config=toml)
    with pytest.raises(gd.OptionError, match=r"train\(config=...\): unknown option 'epoch' \(did you mean 'epochs'"):
        gd.train(tiny_graph(), out=tmp_path / "run", config={"epoch": 2})


def test_train_needs_a_run_directory_and_build_options_only_with_a_graph(tmp_path):
    with pytest.raises(gd.OptionError, match=r"train\(\): expected a graph .* a ShardSet or a shard directory, got "
                                             r"int"):
        gd.train(42, out=tmp_path / "run")
    with pytest.raises(gd.OptionError, match=r"out= is required"):
        gd.train(tiny_graph(), out=None)
    with pytest.raises(gd.OptionError, match=r"build options apply when train\(\) is given a graph"):
        gd.train(str(tmp_path / "shards"), out=tmp_path / "run", build={"hops": 1})
    with pytest.raises(gd.OptionError, match=r"train\(\): unknown option 'hopz' \(did you mean 'hops'\?\)"):
        gd.train(tiny_graph(), out=tmp_path / "run", build={"hopz": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"cache_dir": "C", "layers": 2, "hopz": 1}, r"build\(\): unknown option 'hopz' \(did you mean 'hops'\?\)"),
    ({"cache_dir": "C", "layers": 2, "preload": "sampled"}, r"--preload: 'sampled' is not one of the allowed values"),
    ({"cache_dir": "C", "layers": 0}, r"--layers: must be >= 1, got 0"),
    ({"cache_dir": "C"}, r"layers is required"),
    ({"layers": 2}, r"give out= \(the set's directory\) or cache_dir="),
    ({"cache_dir": "C", "layers": 2, "servers": 2}, r"give servers= and gpus_per_server= together"),
    ({"cache_dir": "C", "layers": 2, "servers": 1, "gpus_per_server": 1, "self_loops": "drop"},
     r"--self-loops: 'drop' is not one of the allowed values"),
])
def test_build_refuses_a_bad_option(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gd.OptionError, match=message):
        gd.build(tiny_graph(), **kwargs)
    assert not (tmp_path / "C").exists()


def test_build_refuses_a_bad_graph_on_every_rank_alike(tmp_path):
    graph = tiny_graph()
    graph["edge_index"][0, 0] = 60  # a vertex id beyond the 60 vertices
    with pytest.raises(gd.GranndisError, match=r"the graph: DataError: graph: edge source ids span \[0, 60\]"):
        gd.build(graph, cache_dir=tmp_path / "c", layers=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"probabilites": True}, r"predict\(\): unknown option 'probabilites' \(did you mean 'probabilities'\?\)"),
    ({"split": "everything"}, r"--split: 'everything' is not one of the allowed values"),
    ({"gather": "some"}, r"predict\(gather='some'\): choose one of 'all', 'root', 'block'"),
    ({"layer": -1}, r"--layer: must be >= 0, got -1"),
])
def test_predict_refuses_a_bad_option(tmp_path, kwargs, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(gd.OptionError, match=message):
        gd.predict(tmp_path / "run", tiny_graph(), **kwargs)


def test_predict_needs_an_existing_model_and_a_cache_for_a_graph(tmp_path):
    with pytest.raises(gd.OptionError, match=r"the model '.*nowhere' does not exist"):
        gd.predict(tmp_path / "nowhere", tiny_graph())
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(gd.OptionError, match=r"not in a run directory, so give cache_dir="):
        gd.predict(tmp_path / "model.pt", tiny_graph())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # refused before building


def test_a_cache_every_user_may_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(gd.OptionError, match=r"writable by every user"):
        gd.build(tiny_graph(), cache_dir=shared / "cache", layers=1)
    assert not (shared / "cache").exists()
