"""granndis-train's options in named groups (granndis_hpc/options/train_groups.py, startup.py): TrainConfig
is composed of one dataclass per group; each group is a --help section, a table of the configuration
reference and an optional [section] of --config FILE.toml, where flat keys keep working; a run's
config.json stays flat, so the runs written before the groups existed still resume and predict."""
import dataclasses
import json
import re

import pytest

from granndis_hpc.options import ConfigError, build_parser, load_config_file, read_options, specs
from granndis_hpc.options.declare import group_title
from granndis_hpc.options.predict import PredictOptions
from granndis_hpc.options.report import ReportOptions
from granndis_hpc.options.resume import train_config
from granndis_hpc.options.selfcheck import SelfcheckOptions
from granndis_hpc.options.startup import ClusterOptions
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options.train_groups import (DataOptions, ExchangeOptions, LoggingOptions, ModelOptions,
                                               OptimOptions, RunDirOptions, ScheduleOptions)
from granndis_hpc.rundir.config_file import load_resolved_config, write_resolved_config

GROUPS = {DataOptions: "data and evaluation", ModelOptions: "model", OptimOptions: "optimisation",
          ScheduleOptions: "schedule", ExchangeOptions: "mode and exchange", RunDirOptions: "run directory",
          ClusterOptions: "cluster", LoggingOptions: "logging and output"}
# Where the options the groups are named for live (written out here, not read from the classes).
EXPECTED = {"hidden": "model", "layers": "model", "dropout": "model", "lr": "optimisation",
            "optimizer": "optimisation", "weight_decay": "optimisation", "lr_schedule": "schedule",
            "warmup_epochs": "schedule", "mode": "mode and exchange", "preloaded_layers": "mode and exchange",
            "sampler": "mode and exchange", "no_overlap": "mode and exchange", "halo_dtype": "mode and exchange",
            "out": "run directory", "resume": "run directory", "checkpoint_every": "run directory",
            "overwrite_run": "run directory", "device": "cluster", "intra_transport": "cluster",
            "ranks_per_server": "cluster", "dist_timeout": "cluster", "host_staging": "cluster",
            "quiet": "logging and output", "log_level": "logging and output", "shards": "data and evaluation"}


def _field_names(cls):
    return {f.name for f in dataclasses.fields(cls)}


def test_train_config_is_the_union_of_its_groups_each_option_in_one():
    seen = {}
    for cls, title in GROUPS.items():
        assert issubclass(TrainConfig, cls) and cls.OPTIONS_GROUP == title
        for name in _field_names(cls):
            assert name not in seen, (name, seen.get(name), title)
            seen[name] = title
    assert set(seen) == _field_names(TrainConfig)
    assert {s.name: group_title(TrainConfig, s) for s in specs(TrainConfig)} == seen
    for name, title in EXPECTED.items():
        assert seen[name] == title, name


def test_a_group_alone_is_checked_like_the_whole_and_reads_the_same_fields():
    cfg = TrainConfig(shards="s", hidden=8, lr=0.1, out="r")
    model = ModelOptions(hidden=8)
    assert model.hidden == cfg.hidden == 8 and isinstance(cfg, ModelOptions) and isinstance(cfg, OptimOptions)
    with pytest.raises(ConfigError, match=r"--hidden: must be >= 1, got 0"):
        ModelOptions(hidden=0)
    with pytest.raises(ConfigError, match=r"--shards is required"):
        TrainConfig(hidden=8)


def _help_sections(cls, capsys, monkeypatch) -> dict:
    """{section title: [flags]} of the --help text, as argparse prints it."""
    monkeypatch.setenv("COLUMNS", "2000")
    with pytest.raises(SystemExit) as exit_info:
        build_parser(cls, "granndis-train").parse_args(["--help"])
    assert exit_info.value.code == 0
    sections, current = {}, None
    for line in capsys.readouterr().out.splitlines():
        if re.fullmatch(r"\S.*:", line):
            current = line[:-1]
            sections[current] = []
        elif current is not None and re.match(r"  (--[\w-]+)", line):
            sections[current].append(re.match(r"  (--[\w-]+)", line).group(1))
    return sections


def test_help_shows_one_section_per_group_in_declaration_order(capsys, monkeypatch):
    sections = _help_sections(TrainConfig, capsys, monkeypatch)
    order = [t for t in sections if t in GROUPS.values()]
    assert order == ["data and evaluation", "model", "optimisation", "schedule", "mode and exchange",
                     "run directory", "cluster", "logging and output"]
    for name, title in EXPECTED.items():
        assert "--" + name.replace("_", "-") in sections[title], (name, title)
    assert "--config" in sections["options"]  # the command's own, outside the groups


def test_predict_shares_the_cluster_group(capsys, monkeypatch):
    sections = _help_sections(PredictOptions, capsys, monkeypatch)
    assert sections["cluster"] == ["--ranks-per-server", "--device", "--intra-transport", "--master-addr",
                                   "--dist-timeout", "--deterministic", "--share-gpus", "--host-staging"]
    assert "--shards" in sections["options"] and "--model" in sections["options"]


FLAT = ('shards = "s"\nepochs = 7\nhidden = 16\nmodel-option = ["eps=0.5"]\nmodel = "gin"\nout = "runs/a"\n'
        'lr_schedule = "step"\ndevice = "cpu"\nquiet = true\n')
SECTIONED = ('shards = "s"\n[optimisation]\nepochs = 7\n[model]\nhidden = 16\nmodel-option = ["eps=0.5"]\n'
             'model = "gin"\n[run-directory]\nout = "runs/a"\n[schedule]\nlr_schedule = "step"\n'
             '[cluster]\ndevice = "cpu"\n[logging_and_output]\nquiet = true\n')


def test_toml_sections_read_the_same_options_as_flat_keys(tmp_path):
    (tmp_path / "flat.toml").write_text(FLAT)
    (tmp_path / "sections.toml").write_text(SECTIONED)
    flat = load_config_file(tmp_path / "flat.toml", TrainConfig)
    sectioned = load_config_file(tmp_path / "sections.toml", TrainConfig)
    assert sectioned == flat == {"shards": "s", "epochs": 7, "hidden": 16, "model_option": ["eps=0.5"],
                                 "model": "gin", "out": "runs/a", "lr_schedule": "step", "device": "cpu",
                                 "quiet": True}
    # through the command line too: it overrides a sectioned value as it does a flat one
    given, from_file, _ = read_options(TrainConfig, ["--config", str(tmp_path / "sections.toml"), "--hidden", "32"])
    cfg = TrainConfig(**{**from_file, **given})
    assert (cfg.hidden, cfg.epochs, cfg.model_option, cfg.quiet) == (32, 7, ["eps=0.5"], True)
    # config.json stays flat: the field names, whatever form the file had
    write_resolved_config(cfg, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert set(saved) == _field_names(TrainConfig) and saved["hidden"] == 32 and saved["device"] == "cpu"


@pytest.mark.parametrize("text, expect", [
    ("[model]\nhidden = 8\nepochs = 3\n", ["key 'epochs' in [model]", "an option of [optimisation]"]),
    ("[modle]\nhidden = 8\n", ["key 'modle'", "Did you mean [model]?", "[run-directory]"]),
    ("hidden = 4\n[model]\nhidden = 8\n", ["key 'hidden' in [model]", "also given as 'hidden'"]),
    ("[model]\nhiden = 8\n", ["key 'hiden' in [model]", "Did you mean 'hidden'?"]),
    ("[model]\nhidden = \"wide\"\n", ["key 'hidden' in [model]", "expected an integer"]),
    ("[run-directory]\nconfig = \"x.toml\"\n", ["another config file"]),
])
def test_toml_section_mistakes_name_the_key_and_the_fix(tmp_path, text, expect):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config_file(tmp_path / "c.toml", TrainConfig)
    for piece in expect:
        assert piece in str(err.value), (piece, str(err.value))


def test_a_command_without_groups_takes_no_sections(tmp_path):
    (tmp_path / "c.toml").write_text("[report]\nout = \"r\"\n")
    with pytest.raises(ConfigError, match=r"\[sections\] are not supported"):
        load_config_file(tmp_path / "c.toml", ReportOptions)


# config.json as a run written before the groups existed recorded it: flat keys, and without the options
# added since (their defaults are what it ran with).
OLD_RUN = {"shards": "shards/cora", "mode": "fb", "model": "sage", "layers": 2, "hidden": 16, "epochs": 5,
           "lr": 0.01, "weight_decay": 0.0, "dropout": 0.5, "seed": 3, "eval_every": 1, "out": None,
           "ranks_per_server": 2, "device": "cpu", "intra_transport": "auto", "quiet": False,
           "skip_checksums": False, "checkpoint_every": 1, "resume": None, "batches_per_epoch": 1,
           "sampler": "sage", "fanout": -1, "no_overlap": False}


def test_a_flat_config_json_of_an_earlier_run_still_resumes_and_predicts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dict(OLD_RUN, out=str(run))))
    cfg = train_config({"resume": str(run), "epochs": 9})
    assert (cfg.mode, cfg.hidden, cfg.seed, cfg.layers, cfg.ranks_per_server) == ("fb", 16, 3, 2, 2)
    assert cfg.epochs == 9 and cfg.out == cfg.resume == str(run)
    assert cfg.optimizer == "adam" and cfg.halo_dtype == "float32"  # added since: the defaults it ran with
    with pytest.raises(Exception, match="hidden=32"):
        train_config({"resume": str(run), "hidden": 32})
    # what predict reads of it: the architecture, by the same flat names
    from granndis_hpc.engine.model_source import checked_architecture

    arch = checked_architecture(load_resolved_config(run), str(run / "config.json"))
    assert (arch["model"], arch["layers"], arch["hidden"]) == ("sage", 2, 16)


def test_selfcheck_options_are_the_clusters_own_declarations():
    for name in ("ranks_per_server", "device", "intra_transport", "master_addr", "dist_timeout"):
        mine = next(s for s in specs(SelfcheckOptions) if s.name == name)
        theirs = next(s for s in specs(ClusterOptions) if s.name == name)
        assert (mine.default, mine.meta) == (theirs.default, theirs.meta), name
    assert SelfcheckOptions(device="cpu", fail_rank=2).fail_rank == 2
    with pytest.raises(ConfigError, match="--master-addr"):
        SelfcheckOptions(master_addr="a b")
    with pytest.raises(ConfigError, match="--dist-timeout: must be > 0.0"):
        SelfcheckOptions(dist_timeout=0.0)
    # as cluster/selfcheck.py reads them: no --config (it names no file), every problem a usage error
    from granndis_hpc.options import parse_options

    assert parse_options(SelfcheckOptions, ["--seed", "4"], config=False).seed == 4
    for argv in (["--config", "x.toml"], ["--fail-rank", "-1"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as exit_info:
            parse_options(SelfcheckOptions, argv, config=False)
        assert exit_info.value.code == 2, argv
