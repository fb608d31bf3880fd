"""Option values a hostile or unlucky user can give: NaN and infinity passed every
range (NaN compares false with every bound), and reached torch or the loss as tracebacks or a NaN loss
two epochs later.  Every float option refuses them at parse time: command line (usage error, exit 2),
TOML (ConfigError naming the file and key) and code (TrainConfig.__post_init__)."""
import subprocess
import sys

import pytest

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError, build_parser, load_config_file, specs
from granndis_hpc.units import parse_size
from tests.conftest import REPO

FLOATS = [s for s in specs(TrainConfig) if s.kind is float]


def test_every_float_option_is_covered():
    assert {s.name for s in FLOATS} >= {"lr", "weight_decay", "dropout", "input_dropout"}


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("spec", FLOATS, ids=lambda s: s.name)
def test_command_line_refuses_non_finite(spec, text, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser(TrainConfig).parse_args(["--shards", "x", f"{spec.flag}={text}"])
    assert info.value.code == 2 and "must be a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("spec", FLOATS, ids=lambda s: s.name)
def test_toml_and_code_refuse_non_finite(spec, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f"{spec.name} = nan\n")
    with pytest.raises(ConfigError, match=rf"c.toml.*key '{spec.name}'.*must be a finite number, got nan"):
        load_config_file(str(path), TrainConfig)
    with pytest.raises(ConfigError, match=rf"{spec.flag}: must be a finite number, got inf"):
        TrainConfig(shards="x", **{spec.name: float("inf")})


@pytest.mark.parametrize("text", ["1e400", "inf", "1e400GiB"])
def test_sizes_refuse_overflow(text):
    with pytest.raises(ValueError, match="finite|not a size"):
        parse_size(text)
    with pytest.raises(ConfigError, match="memory-per-gpu"):
        TrainConfig(shards="x", memory_per_gpu=text)


def test_a_toml_option_error_exits_2_without_a_traceback(tmp_path):
    """One process (no mpirun): the refusal is the collective option error, status 2 like argparse's."""
    path = tmp_path / "c.toml"
    path.write_text("lr = inf\n")
    res = subprocess.run([sys.executable, "-m", "granndis_hpc.cli", "train", "--shards", str(tmp_path),
                          "--config", str(path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "must be a finite number, got inf" in res.stderr and "Traceback" not in res.stderr
