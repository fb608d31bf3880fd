"""The presets of the GraNNDis artifact's AE runs (configs/*.toml, docs/paper-experiments.md): every one
parses and is valid for its command, the train and build presets of a dataset agree, they hold the
paper's per-dataset settings, and one builds and trains 2 epochs on Cora (a stand-in of arxiv's size
class) in one process."""
import json
import pathlib

import pytest

from granndis_hpc.config import TrainConfig
from granndis_hpc.options import defaults, load_config_file
from granndis_hpc.preprocess.options import BuildOptions, PlanOptions

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
DATASETS = ("arxiv", "products", "reddit", "papers100m")
# Table 3 of the paper (lr, dropout), as the artifact's brief_*.sh scripts also set them.
TABLE3 = {"arxiv": (0.01, 0.5), "products": (0.003, 0.3), "reddit": (0.01, 0.5), "papers100m": (0.01, 0.5)}


def _train_preset(name):
    values = load_config_file(str(CONFIGS / f"{name}.toml"), TrainConfig)
    return TrainConfig(**{**values, "shards": "SET"})


def _build_preset(name):
    values = load_config_file(str(CONFIGS / f"{name}.build.toml"), BuildOptions)
    # `preprocess plan --config` reads the same file (docs/paper-experiments.md, step 1)
    PlanOptions(**{**defaults(PlanOptions), **load_config_file(str(CONFIGS / f"{name}.build.toml"), PlanOptions),
                   "servers": 2, "gpus_per_server": 2})
    return BuildOptions(**{**defaults(BuildOptions), **values, "out": "SET", "servers": 2, "gpus_per_server": 2})


def test_every_preset_parses_and_the_pairs_agree():
    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == sorted(
        [f"{d}.toml" for d in DATASETS] + [f"{d}.build.toml" for d in DATASETS])
    for name in DATASETS:
        train, build = _train_preset(name), _build_preset(name)
        assert (train.lr, train.dropout) == TABLE3[name] and train.input_dropout == train.dropout
        # 3 SAGE convolutions + 1 Linear classifier, on a 3-hop set with a self loop per vertex
        assert (train.model, train.layers, train.linear_layers, train.conv_layers) == ("sage", 4, 1, 3)
        assert train.norm and train.hidden == 64 and train.epochs == 1000 and train.seed == 7524
        assert build.layers == train.conv_layers and build.self_loops == "add"
        # the artifact trains every AE dataset but papers100M inductively, on a set built for it
        assert train.inductive == build.inductive == (name != "papers100m"), name
        # the build's memory estimate is for the preset's model
        for key in ("model", "hidden", "norm", "dropout", "linear_layers"):
            assert getattr(build, key) == getattr(train, key), (name, key)


def test_a_preset_builds_and_trains_on_cora(tmp_path, planetoid_root):
    pytest.importorskip("mpi4py")
    from granndis_hpc import cli
    from granndis_hpc.preprocess.__main__ import main as preprocess_main

    shards = tmp_path / "set"
    assert preprocess_main(["build", "--config", str(CONFIGS / "arxiv.build.toml"), "--source", "planetoid",
                            "--name", "cora", "--root", str(planetoid_root), "--servers", "1",
                            "--gpus-per-server", "1", "--partitioner", "metis", "--out", str(shards)]) == 0
    run = tmp_path / "run"
    summary = cli.run_training(["--config", str(CONFIGS / "arxiv.toml"), "--shards", str(shards), "--epochs", "2",
                                "--ranks-per-server", "1", "--mode", "flx", "--out", str(run), "--quiet"])
    assert summary["epochs"] == 2 and summary["layers"] == 4 and summary["linear_layers"] == 1
    config = json.loads((run / "config.json").read_text())
    assert (config["lr"], config["linear_layers"], config["norm"], config["input_dropout"]) == (0.01, 1, True, 0.5)
    assert 0.0 < summary["accuracy"]["val"] <= 1.0


def test_preset_keys_are_option_names_and_the_documented_example_reads(tmp_path):
    """docs/configuration.md: a key is the option's name (`linear-layers`), a repeated option a list."""
    import tomllib

    from granndis_hpc.options.reference import TOML_EXAMPLE

    for path in CONFIGS.glob("*.toml"):
        keys = tomllib.loads(path.read_text())
        assert not [k for k in keys if "_" in k], (path.name, sorted(keys))
    example = CONFIGS.parent / "docs" / "configuration.md"
    assert "\n".join(f"    {line}" for line in TOML_EXAMPLE.splitlines()) in example.read_text()
    given = tomllib.loads(TOML_EXAMPLE)
    assert given["model-option"] == ["heads=4", "concat=true"]
    written = tmp_path / "example.toml"
    written.write_text(TOML_EXAMPLE)
    values = load_config_file(str(written), TrainConfig)
    assert TrainConfig(**{**values, "shards": "SET"}).model_option == ["heads=4", "concat=true"]
