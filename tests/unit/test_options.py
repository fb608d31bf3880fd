"""One options framework (granndis_hpc/options/) for every command: granndis-train, granndis report and
every `granndis preprocess` subcommand.  Parsing only: nothing here builds or trains."""
import dataclasses
import pathlib
import re

import pytest

from granndis_hpc import options
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError, Options, option, read_command, specs
from granndis_hpc.preprocess import options as popts
from granndis_hpc.preprocess.__main__ import COMMANDS

REPO = pathlib.Path(__file__).resolve().parents[2]
LAYOUT = ["--servers", "2", "--gpus-per-server", "2", "--layers", "3"]


def parse(argv):
    return read_command({k: (cls, text) for k, (cls, text, _) in COMMANDS.items()}, argv, "granndis preprocess")


def _resume_help(cls, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option
    with pytest.raises(SystemExit):
        options.parse_args_with_config(cls, ["--help"])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.lstrip().startswith("--resume RUN_DIR"))
    return line


def test_resume_help_names_every_option_that_may_change(capsys, monkeypatch):
    text = _resume_help(TrainConfig, capsys, monkeypatch)
    changeable = [s for s in specs(TrainConfig) if s.meta.get("on_resume") == "may_change" and s.name not in ("resume",
                                                                                                              "out")]
    assert "sequential_sampling" in {s.name for s in changeable}  # the hand-written list had left it out
    for s in changeable:
        assert re.search(re.escape(s.flag) + r"\b", text), (s.flag, text)
    for s in specs(TrainConfig):  # and nothing that must stay the same on resume
        if s.meta.get("on_resume", "keep") == "keep":
            assert not re.search(re.escape(s.flag) + r"(?![\w-])", text), (s.flag, text)

    @dataclasses.dataclass
    class WithOneMore(TrainConfig):  # a field marked may_change is listed without editing the text
        brand_new: int = option(1, ge=0, on_resume="may_change")

    assert "--brand-new" in _resume_help(WithOneMore, capsys, monkeypatch)


def test_no_private_argparse_api_anywhere():
    private = re.compile(r"\._(option_string_actions|actions|defaults|action_groups|optionals|positionals|"
                         r"registries|subparsers|get_optional_actions)\b|argparse\._")
    offenders = [f"{p.relative_to(REPO)}:{i}" for root in ("granndis_hpc", "preprocess", "bench", "slurm")
                 for p in (REPO / root).rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert offenders == []


SHARED_WITH_TRAIN = ("model", "hidden", "dropout", "norm", "checkpoint_activations", "memory_per_gpu", "device")


@pytest.mark.parametrize("cls", [popts.PlanOptions, popts.BuildOptions])
def test_estimate_options_are_granndis_trains_declarations(cls):
    """plan/build's --model --hidden --dropout --norm --device ... check what granndis-train checks."""
    train = {s.name: s for s in specs(TrainConfig)}
    mine = {s.name: s for s in specs(cls)}
    for name in SHARED_WITH_TRAIN:
        a, b = dict(train[name].meta), dict(mine[name].meta)
        a.pop("help"), b.pop("help")
        assert (a, train[name].default, train[name].kind) == (b, mine[name].default, mine[name].kind), name
    # --servers/--gpus-per-server/--layers and the EAS options: one declaration, in LayoutOptions/EasOptions
    for name in ("servers", "gpus_per_server", "layers", "partitioner", "eas_fanout", "eas_select"):
        owners = [k.__name__ for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {})]
        assert owners in (["LayoutOptions"], ["EasOptions"]), (name, owners)


def test_plan_device_auto_estimates_for_cuda():
    from granndis_hpc.preprocess.plan.command import config_from_args
    _, args = parse(["plan", *LAYOUT])
    assert args.device == "auto" and config_from_args(args).device == "cuda"
    _, args = parse(["plan", *LAYOUT, "--device", "cpu"])
    assert config_from_args(args).device == "cpu"


@pytest.mark.parametrize("extra, expect", [
    (["--dropout", "nan"], "must be a finite number"), (["--dropout", "1"], "must be < 1.0"),
    (["--avg-degree", "inf"], "must be a finite number"), (["--servers", "0"], "must be >= 1"),
    (["--hidden", "0"], "must be >= 1"), (["--eas-fanout", "0"], "must be >= 1"),
    (["--model", "gat9"], "not one of the allowed values"), (["--memory-per-gpu", "lots"], "argument --memory-per-gpu"),
    (["--cob-batches", "2,x"], "comma-separated counts"), (["--eas-hops", "0"], "must be >= 1"),
])
def test_preprocess_values_are_checked_at_parse_time(capsys, extra, expect):
    with pytest.raises(SystemExit) as exit_info:
        parse(["plan", *LAYOUT, *extra])
    assert exit_info.value.code == 2
    assert expect in capsys.readouterr().err


def test_eas_fanout_old_spelling_still_works_with_a_warning(capsys):
    _, args = parse(["build", *LAYOUT, "--out", "x", "--preload", "eas", "--fanout", "3"])
    assert args.eas_fanout == 3
    assert "--fanout is deprecated" in capsys.readouterr().err
    _, args = parse(["build", *LAYOUT, "--out", "x", "--eas-fanout", "4"])
    assert args.eas_fanout == 4 and "deprecated" not in capsys.readouterr().err
    assert parse(["plan", *LAYOUT, "--cob-fanout", "10"])[1].cob_fanout == 10  # train's --fanout, reused


def test_required_options_and_positionals(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(["build", "--servers", "2", "--layers", "3"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --gpus-per-server, --out" in capsys.readouterr().err
    assert parse(["verify", "some/set"]) == ("verify", popts.ShardSetOptions(dir="some/set"))
    with pytest.raises(SystemExit):
        parse(["info"])


def test_preprocess_reads_a_toml_config(tmp_path, capsys):
    cfg = tmp_path / "build.toml"
    cfg.write_text('servers = 2\ngpus-per-server = 2\nlayers = 3\nout = "a"\neas_fanout = 7\nsymmetrize = false\n')
    _, args = parse(["build", "--config", str(cfg), "--out", "b"])
    assert (args.servers, args.layers, args.eas_fanout, args.symmetrize, args.out) == (2, 3, 7, False, "b")
    cfg.write_text("servers = 2\nlayres = 3\n")
    with pytest.raises(SystemExit) as exit_info:
        parse(["build", "--config", str(cfg)])
    assert exit_info.value.code == 2 and "Did you mean 'layers'" in capsys.readouterr().err


def test_options_built_in_code_are_checked():
    with pytest.raises(ConfigError, match="--dropout: must be < 1.0"):
        popts.PlanOptions(servers=2, gpus_per_server=2, layers=3, dropout=1.0)
    with pytest.raises(ConfigError, match="--out is required"):
        popts.ChunkOptions()

    @dataclasses.dataclass
    class Small(Options):
        n: int = option(1, ge=1, deprecated={"--count": "the next release"})

    with pytest.raises(ConfigError, match="--n: must be >= 1"):
        Small(n=0)
    assert options.parse_options(Small, ["--count", "3"]).n == 3


def test_report_options_are_the_framework(capsys):
    from granndis_hpc.report.command import ReportOptions
    assert options.parse_options(ReportOptions, ["a", "b"]).run_dirs == ["a", "b"]
    with pytest.raises(SystemExit) as exit_info:
        options.parse_options(ReportOptions, ["a", "--sweep", "s.json"])
    assert exit_info.value.code == 2 and "not both" in capsys.readouterr().err
