"""The presets are installed with the package: --config NAME reads granndis_hpc/configs/NAME.toml."""
import os

import pytest

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError
from granndis_hpc.options.toml import load_config_file, presets, resolve_config
from granndis_hpc.preprocess.options import BuildOptions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_preset_of_the_repository_is_a_preset_by_name():
    files = sorted(f[: -len(".toml")] for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".toml"))
    assert presets() == files and "products" in files


def test_a_preset_by_name_reads_as_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anywhere: not the repository
    assert load_config_file("products", TrainConfig) == load_config_file(os.path.join(REPO, "configs", "products.toml"),
                                                                         TrainConfig)
    assert load_config_file("products.build", BuildOptions)["layers"] == 3


def test_a_file_of_the_name_wins_and_an_unknown_name_lists_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "products").write_text("epochs = 3\n")
    assert resolve_config("products") == "products"
    with pytest.raises(ConfigError, match="no preset of that name.*arxiv, arxiv.build"):
        resolve_config("prodcts")
    with pytest.raises(ConfigError, match="not found"):
        load_config_file("missing.toml", TrainConfig)
