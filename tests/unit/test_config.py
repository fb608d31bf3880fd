"""TOML config layer: file values, command-line precedence, type checks, unknown keys, --help defaults."""
import argparse
import json
import os
from dataclasses import dataclass
from typing import List, Optional

import pytest

from granndis_hpc.config import (ConfigError, load_resolved_config, option, parse_args_with_config,
                                 resolved_config, write_resolved_config)


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


@dataclass
class Options:
    """Options shaped like granndis-train's: every kind of option the config layer must handle."""
    shards: str = option(help="shard directory")
    mode: str = option("flx", choices=("fb", "flx", "cob", "eas"), help="training method")
    layers: int = option(3, help="GNN layers")
    lr: float = option(0.01, help="learning rate")
    batches_per_epoch: int = option(1, parse=positive_int, help="co-batches per epoch")
    quiet: bool = option(False, help="no progress bar")
    eval: bool = option(True, flag="--no-eval", help="skip evaluation")
    fanouts: List[int] = option([15, 10], nargs="+", help="per-layer fanout")
    tag: Optional[List[str]] = option(None, append=True, help="free-form run tags")
    seed: int = option(0)  # no help text on purpose: --help must still show it


def make_parser():
    return Options


def write_toml(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_file_values_and_command_line_override(tmp_path):
    cfg = write_toml(tmp_path, """
shards = "/data/shards/cora"
mode = "eas"
layers = 5
lr = 1          # an integer is a valid float
batches-per-epoch = 4
quiet = true
eval = false
fanouts = [25, 10, 5]
tag = ["a", "b"]
""")
    ns = parse_args_with_config(make_parser(), ["--config", cfg])
    assert ns.shards == "/data/shards/cora" and ns.mode == "eas" and ns.layers == 5
    assert ns.lr == 1.0 and isinstance(ns.lr, float)
    assert ns.batches_per_epoch == 4 and ns.quiet is True and ns.eval is False
    assert ns.fanouts == [25, 10, 5] and ns.tag == ["a", "b"] and ns.seed == 0
    assert ns.config == cfg

    # Flags on the command line win over the file; lists are replaced, not appended to.
    ns = parse_args_with_config(make_parser(), [f"--config={cfg}", "--layers", "7", "--mode", "fb",
                                                "--fanouts", "3", "--tag", "c", "--seed", "9"])
    assert (ns.layers, ns.mode, ns.fanouts, ns.tag, ns.seed) == (7, "fb", [3], ["c"], 9)
    assert ns.batches_per_epoch == 4  # still from the file

    # Without a config file the parser's defaults apply and --shards is required again.
    ns = parse_args_with_config(make_parser(), ["--shards", "x"])
    assert (ns.mode, ns.layers, ns.eval, ns.tag, ns.config) == ("flx", 3, True, None, None)
    with pytest.raises(SystemExit):
        parse_args_with_config(make_parser(), [])


def test_underscore_and_dash_spellings_are_the_same_option(tmp_path):
    cfg = write_toml(tmp_path, 'shards = "s"\nbatches_per_epoch = 6\n')
    assert parse_args_with_config(make_parser(), ["--config", cfg]).batches_per_epoch == 6
    both = write_toml(tmp_path, 'shards = "s"\nbatches_per_epoch = 6\nbatches-per-epoch = 2\n', "both.toml")
    with pytest.raises(ConfigError, match="also given as"):
        parse_args_with_config(make_parser(), ["--config", both])


def test_unknown_key_lists_close_matches(tmp_path):
    cfg = write_toml(tmp_path, 'shards = "s"\nbatches_per_epok = 3\n')
    with pytest.raises(ConfigError) as err:
        parse_args_with_config(make_parser(), ["--config", cfg])
    msg = str(err.value)
    assert "batches_per_epok" in msg and cfg in msg and "unknown option" in msg
    assert "batches_per_epoch" in msg  # the suggestion

    # the flag --no-eval stores into "eval": the key "no-eval" would read as the opposite, so it is refused
    cfg = write_toml(tmp_path, 'no-eval = true\n', "flag.toml")
    with pytest.raises(ConfigError, match="write 'eval = false'"):
        parse_args_with_config(make_parser(), ["--config", cfg])

    cfg = write_toml(tmp_path, 'zzzz = 1\n', "far.toml")
    with pytest.raises(ConfigError, match="--help"):
        parse_args_with_config(make_parser(), ["--config", cfg])


@pytest.mark.parametrize("line, expect", [
    ('layers = "three"', ["'layers'", "integer", "'three'"]),
    ("layers = 3.5", ["'layers'", "integer", "3.5"]),
    ("layers = true", ["'layers'", "integer", "True"]),
    ("lr = \"fast\"", ["'lr'", "number", "'fast'"]),
    ("quiet = 1", ["'quiet'", "true or false", "1"]),
    ("mode = \"sgd\"", ["'mode'", "not one of", "'flx'"]),
    ("mode = 3", ["'mode'", "string"]),
    ("batches-per-epoch = -2", ["'batches-per-epoch'", "positive_int", "must be > 0"]),
    ("fanouts = 15", ["'fanouts'", "list"]),
    ("fanouts = [15, \"x\"]", ["'fanouts'[1]", "integer"]),
    ("fanouts = []", ["'fanouts'", "non-empty"]),
    ("[training]\nlayers = 3", ["'training'", "[sections] are not supported"]),
    ("config = \"other.toml\"", ["'config'", "another config file"]),
])
def test_wrong_type_names_key_file_expected_and_value(tmp_path, line, expect):
    cfg = write_toml(tmp_path, 'shards = "s"\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        parse_args_with_config(make_parser(), ["--config", cfg])
    msg = str(err.value)
    assert cfg in msg, msg
    for piece in expect:
        assert piece in msg, (piece, msg)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        parse_args_with_config(make_parser(), ["--config", str(tmp_path / "missing.toml")])
    bad = write_toml(tmp_path, "layers = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_args_with_config(make_parser(), ["--config", bad])


def test_help_lists_every_option_with_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option, so each default can be matched to its option
    parser = make_parser()
    bad = write_toml(tmp_path, "nonsense = 1\n")  # --help must work even with a broken config file
    with pytest.raises(SystemExit) as exit_info:
        parse_args_with_config(parser, ["--config", bad, "--help"])
    assert exit_info.value.code == 0
    # one block per option: its "  --name ..." line plus the indented help lines under it
    lines, current = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            lines[current] = line
        elif current and line.startswith("   "):
            lines[current] += " " + line.strip()
        else:
            current = None
    for opt, default in [("--mode", "flx"), ("--layers", "3"), ("--lr", "0.01"), ("--batches-per-epoch", "1"),
                         ("--quiet", "off"), ("--no-eval", "off"), ("--fanouts", "[15, 10]"),
                         ("--tag", "None"), ("--seed", "0"), ("--config", "None")]:
        assert lines[opt].rstrip().endswith(f"(default: {default})"), lines[opt]
    assert lines["--shards"].rstrip().endswith("shard directory")  # required: no misleading default
    assert "default" not in lines["-h"]


def test_config_option_is_not_added_twice():
    @dataclass
    class WithConfig(Options):
        config: Optional[str] = option("site.toml", help="site config")
    # the declared option is used (adding it again would raise argparse.ArgumentError)
    ns = parse_args_with_config(WithConfig, ["--shards", "s"])
    assert ns.config == "site.toml"


def test_resolved_config_round_trip(tmp_path):
    import pathlib
    cfg = write_toml(tmp_path, 'shards = "s"\nlayers = 4\n')
    ns = parse_args_with_config(make_parser(), ["--config", cfg, "--tag", "x"])
    ns.out = pathlib.Path(tmp_path / "run")  # Path values become strings
    ns.dims = (3, 4)                          # tuples become lists
    run_dir = tmp_path / "run"
    path = write_resolved_config(ns, run_dir)
    assert path == os.path.join(str(run_dir), "config.json")
    on_disk = json.loads(open(path).read())
    assert on_disk == load_resolved_config(run_dir) == resolved_config(ns)
    expected = {k: v for k, v in vars(ns).items()}
    expected["out"] = str(run_dir)
    expected["dims"] = [3, 4]
    assert on_disk == expected
    assert not [f for f in os.listdir(run_dir) if f != "config.json"]  # no temporary files left behind

    ns.bad = object()
    with pytest.raises(ConfigError, match="'bad'"):
        resolved_config(ns)
    with pytest.raises(ConfigError, match="not a run directory"):
        load_resolved_config(tmp_path / "nowhere")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="config.json is not readable JSON"):
        load_resolved_config(tmp_path / "broken")
