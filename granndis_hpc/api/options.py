"""The API's options: TrainConfig's fields for training, BuildOptions' for a build, checked by their one
declaration (the command line's rules); a name that is not an option is refused with the close matches.

No torch, mpi4py or h5py here: the names and rules come from granndis_hpc/options/ (train.py) and
preprocess/options.py, which import none of them.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any, Dict, Iterable, Mapping, Optional

from granndis_hpc.api.errors import OptionError
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import ConfigError, load_config_file

# BuildOptions' fields that say where a dataset comes from (the API is handed the graph itself) or
# how the command prints; every other field of BuildOptions is a build option of the API.
_SOURCE_ONLY = ("source", "root", "path", "split_scheme", "target_type", "num_classes", "generator", "vertices",
                "avg_degree", "features", "classes", "communities", "train_frac", "val_frac", "homophily", "cell_size",
                "local_scale", "long_range", "feature_noise", "whole_graph", "out", "progress", "log_level",
                "log_all_ranks")
# The shape of the set: by default the running job's (servers x ranks per server).
SHAPE_OPTIONS = ("servers", "gpus_per_server")


def unknown_names(given: Iterable[str], known: Iterable[str], what: str) -> Optional[str]:
    """The refusal of the names in `given` that are not in `known` (each with its close matches), or None."""
    known = sorted(known)
    parts = []
    for name in sorted(set(given) - set(known)):
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        parts.append(repr(name) + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    if not parts:
        return None
    return f"{what}: unknown option{'s' if len(parts) > 1 else ''} {', '.join(parts)}"


def check_names(given: Iterable[str], known: Iterable[str], what: str) -> None:
    problem = unknown_names(given, known, what)
    if problem:
        raise OptionError(problem)


def train_option_names() -> tuple:
    return tuple(f.name for f in dataclasses.fields(TrainConfig))


def _config_values(config) -> Dict[str, Any]:
    """The values a `config=` argument gives: a TrainConfig, a mapping of its fields, or a TOML file
    (the --config file of granndis-train)."""
    if config is None:
        return {}
    if isinstance(config, TrainConfig):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        check_names(config, train_option_names(), "train(config=...)")
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        try:
            return load_config_file(os.fspath(config), TrainConfig)
        except ConfigError as exc:
            raise OptionError(str(exc)) from None
    raise OptionError(f"train(config=...): expected a TrainConfig, a dict of its fields or a TOML file's path, got "
                      f"{type(config).__name__}")


def train_config(config, options: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of `config` (see _config_values) with `options` (TrainConfig's field names) on top,
    checked as granndis-train checks its command line.  With resume=RUN_DIR the run's own config.json
    gives the rest, and options given again may differ only where --resume allows."""
    from granndis_hpc.options.resume import train_config as resolved
    from granndis_hpc.rundir.checkpoint_files import CheckpointError

    check_names(options, train_option_names(), "train()")
    given = {**_config_values(config), **{k: v for k, v in options.items()}}
    if isinstance(given.get("shards"), os.PathLike):
        given["shards"] = os.fspath(given["shards"])
    try:
        return resolved(given)
    except OptionError:
        raise
    except (ConfigError, TypeError, ValueError, CheckpointError) as exc:  # resume_config: CheckpointError
        raise OptionError(f"train(): {' '.join(str(exc).split())}") from None


def build_option_names() -> tuple:
    from granndis_hpc.preprocess.options import BuildOptions

    return tuple(f.name for f in dataclasses.fields(BuildOptions) if f.name not in _SOURCE_ONLY + SHAPE_OPTIONS)


def build_options(options: Mapping[str, Any], *, out: str, servers: int, gpus_per_server: int, what: str):
    """BuildOptions of the API's `options` (BuildOptions' field names), for a set written to `out` for
    servers x gpus_per_server; checked by their declarations (ranges, choices).  ``hops`` may be given
    as an int."""
    from granndis_hpc.preprocess.options import BuildOptions

    check_names(options, build_option_names(), what)
    values = dict(options)
    if isinstance(values.get("hops"), int) and not isinstance(values.get("hops"), bool):
        values["hops"] = str(values["hops"])
    if values.get("layers") is None:
        raise OptionError(f"{what}: layers is required (the message-passing layers the set is built for: "
                          f"train's layers less its linear_layers)")
    try:
        return BuildOptions(source="bundle", out=os.fspath(out), servers=servers, gpus_per_server=gpus_per_server,
                            **values)
    except (ConfigError, TypeError) as exc:
        raise OptionError(f"{what}: {' '.join(str(exc).split())}") from None
