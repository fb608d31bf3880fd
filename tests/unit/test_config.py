"""TOML config layer: file values, command-line precedence, type checks, unknown keys, --help defaults."""
import argparse
import json
import os
import re
from dataclasses import dataclass
from typing import List, Optional

import pytest

from granndis_hpc.rundir.config_file import load_resolved_config, resolved_config, write_resolved_config
from granndis_hpc.options import ConfigError, option, parse_args_with_config


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


# ---- granndis-train's options: one declaration (TrainConfig) --------------------------------------
import dataclasses  # noqa: E402

from granndis_hpc import cli  # noqa: E402
from granndis_hpc.nn import PassSettings  # noqa: E402
from granndis_hpc.registry import checkpointable  # noqa: E402
from granndis_hpc.options.startup import DEVICE_NAMES, TRANSPORT_NAMES
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import allowed_choices, specs

OUT_OF_RANGE = [("epochs", "0", ">= 1"), ("epochs", "-5", ">= 1"), ("layers", "0", ">= 1"), ("hidden", "0", ">= 1"),
                ("lr", "0", "> 0.0"), ("lr", "-0.1", "> 0.0"), ("weight_decay", "-1e-4", ">= 0.0"),
                ("dropout", "1", "< 1.0"), ("dropout", "-0.5", ">= 0.0"), ("input_dropout", "1", "< 1.0"),
                ("input_dropout", "-0.5", ">= 0.0"), ("seed", "-1", ">= 0"),
                ("eval_every", "-1", ">= 0"), ("checkpoint_every", "-2", ">= 0"), ("ranks_per_server", "0", ">= 1"),
                ("batches_per_epoch", "0", ">= 1"), ("fanout", "0", "-1 for all"), ("fanout", "-2", "-1 for all"),
                ("preloaded_layers", "0", ">= 1"), ("linear_layers", "-1", ">= 0"),
                ("momentum", "1", "< 1.0"), ("warmup_epochs", "-1", ">= 0"),
                ("step_size", "0", ">= 1"), ("gamma", "1", "< 1.0"), ("min_lr", "-1", ">= 0.0"),
                ("lr_decay_epochs", "-1", ">= 0"), ("plateau_patience", "0", ">= 1"),
                ("clip_grad_norm", "-1", ">= 0.0"), ("patience", "-1", ">= 0"),
                ("dist_timeout", "0", "> 0.0")]


def test_every_numeric_option_has_a_range():
    """A numeric option added without a range (or check) would accept nonsense such as --epochs 0."""
    numeric = [s for s in specs(TrainConfig) if s.kind in (int, float)]
    assert {s.name for s in numeric} == {name for name, _, _ in OUT_OF_RANGE}
    for s in numeric:
        assert set(s.meta) & {"ge", "gt", "le", "lt", "check"}, s.name


@pytest.mark.parametrize("name, text, expect", OUT_OF_RANGE)
def test_out_of_range_values_are_refused_at_parse_time(tmp_path, capsys, name, text, expect):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SystemExit) as exit_info:  # the command line: argparse's usage error
        parse_args_with_config(TrainConfig, ["--shards", "s", f"{flag}={text}"])  # '=': argparse reads -1e-4 as a flag
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and expect in err, err
    cfg = write_toml(tmp_path, f'shards = "s"\n{name} = {text}\n')  # the same rule for a config file
    with pytest.raises(ConfigError, match=rf"key '{name}'.*{re.escape(expect)}"):
        parse_args_with_config(TrainConfig, ["--config", cfg])
    value = float(text) if any(s.name == name and s.kind is float for s in specs(TrainConfig)) else int(text)
    with pytest.raises(ConfigError, match=re.escape(expect)):  # and for a TrainConfig built in code
        TrainConfig(shards="s", **{name: value})


def test_epochs_zero_exits_non_zero_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.run_training(["--shards", "/nonexistent", "--epochs", "0"])
    assert exit_info.value.code == 2 and "must be >= 1, got 0" in capsys.readouterr().err


def test_choices_come_from_their_registries():
    from granndis_hpc.cluster.topology import DEVICES, TRANSPORTS
    from granndis_hpc.graph.sampler import SAMPLERS
    from granndis_hpc.nn.models import MODELS
    meta = {s.name: s.meta for s in specs(TrainConfig)}
    from granndis_hpc.engine.modes import MODES
    assert allowed_choices(meta["model"]) == tuple(MODELS) and allowed_choices(meta["sampler"]) == tuple(SAMPLERS)
    assert allowed_choices(meta["mode"]) == tuple(MODES) == ("fb", "flx", "eas", "cob", "mb", "auto")
    assert DEVICE_NAMES == tuple(DEVICES) and TRANSPORT_NAMES == tuple(TRANSPORTS)
    assert meta["device"]["choices"] == DEVICE_NAMES and meta["intra_transport"]["choices"] == TRANSPORT_NAMES


def test_memory_per_gpu_is_a_size_and_auto_needs_it(tmp_path, capsys):
    cfg = TrainConfig(shards="s", mode="auto", memory_per_gpu="40GiB")
    assert cfg.memory_per_gpu == "40GiB" and cfg.memory_per_gpu_bytes == 40 << 30  # kept as written
    assert TrainConfig(shards="s").memory_per_gpu is None
    with pytest.raises(ConfigError, match="--mode auto .*--memory-per-gpu"):
        TrainConfig(shards="s", mode="auto")
    with pytest.raises(ConfigError, match="memory-per-gpu.*'lots' is not a valid size"):
        TrainConfig(shards="s", memory_per_gpu="lots")
    with pytest.raises(SystemExit):
        parse_args_with_config(TrainConfig, ["--shards", "s", "--memory-per-gpu", "-3GB"])
    assert "argument --memory-per-gpu" in capsys.readouterr().err
    toml = write_toml(tmp_path, 'shards = "s"\nmemory_per_gpu = "12 GB"\nmode = "auto"\n')
    ns = parse_args_with_config(TrainConfig, ["--config", toml])
    assert ns.memory_per_gpu == "12 GB" and ns.mode == "auto"


@pytest.mark.parametrize("model", ["sage", "gcn", "ressage"])
def test_checkpoint_activations_is_refused_where_it_would_be_ignored(model):
    if checkpointable(model):
        assert TrainConfig(shards="s", model=model, checkpoint_activations=True).checkpoint_activations
    else:
        with pytest.raises(ConfigError, match=f"model '{model}' would ignore it"):
            TrainConfig(shards="s", model=model, checkpoint_activations=True)


def test_checkpointable_models_really_recompute():
    """The checkpointable models (their registry entries) must be exactly those that call torch.utils.checkpoint."""
    import torch
    from granndis_hpc.nn.models import MODELS, build_model
    from tests.pyg_factories import PYG_OPTIONS
    for name in MODELS:
        if name == "pyg" and not PYG_OPTIONS:
            continue  # (torch_geometric absent)
        if MODELS.entry(name).get("typed"):
            continue  # (they need a typed graph: tests/unit/test_hetero_layers.py; none recomputes)
        model = build_model(name, 4, 8, 3, 2, dropout=0.0, norm=False, **(PYG_OPTIONS if name == "pyg" else {}))
        calls = []
        original = torch.utils.checkpoint.checkpoint
        torch.utils.checkpoint.checkpoint = lambda fn, *a, **k: calls.append(name) or original(fn, *a, **k)
        try:
            model.train()
            x = torch.randn(5, 4, requires_grad=True)
            model(x, [_full_graph(5)] * 2, settings=PassSettings(checkpoint_activations=True)).sum().backward()
        finally:
            torch.utils.checkpoint.checkpoint = original
        assert bool(calls) == checkpointable(name), name


def _full_graph(n):
    """Every row an in-neighbour of every row (n_dst = n_src = n)."""
    import torch
    from granndis_hpc.nn.graph import LayerGraph
    return LayerGraph(n, n, torch.arange(0, n * n + 1, n), torch.arange(n).repeat(n),
                      torch.full((n,), float(n)), torch.full((n,), float(n)))


def test_train_cross_option_rules():
    with pytest.raises(ConfigError, match="--checkpoint-every needs a run directory"):
        TrainConfig(shards="s", checkpoint_every=5)
    with pytest.raises(ConfigError, match="--resume /a continues in that run directory"):
        TrainConfig(shards="s", resume="/a", out="/b")
    with pytest.raises(ConfigError, match="--overwrite-run .* --resume"):
        TrainConfig(shards="s", resume="/a", out="/a", overwrite_run=True)


def test_train_help_lists_every_option(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as exit_info:
        parse_args_with_config(TrainConfig, ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in text, f.name
    assert re.search(r"--epochs EPOCHS\s+training epochs \[>= 1\] \(default: 200\)", text), text


def test_no_private_argparse_api():
    import pathlib
    for module in ("options/train.py", "options/train_groups.py", "options/parser.py", "cli.py"):
        source = (pathlib.Path(cli.__file__).parent / module).read_text()
        assert "._actions" not in source and "argparse._" not in source, module
