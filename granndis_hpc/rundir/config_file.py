"""The resolved config of a run, ``RUN_DIR/config.json``: every option the run ran with (flat keys, the
field names), written when it starts so that it can be reproduced, continued (``--resume``) and
labelled (``granndis report``), and read back by ``--resume``, ``--init-from`` and ``granndis predict``.
Torch-free, like the options it records."""
from __future__ import annotations

import dataclasses
import os

from granndis_hpc.fsutil import atomic_write_json, read_json_object
from granndis_hpc.options import ConfigError

CONFIG_FILE_NAME = "config.json"


def _jsonable(value, key):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, key) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item(), key)
    raise ConfigError(f"option {key!r} has a value of type {type(value).__name__} ({value!r}) that cannot "
                      "be written to config.json; give the option a plain type (str, int, float, bool, list)")


def resolved_config(ns) -> dict:
    """Every option of `ns` (an argparse.Namespace, a dict or an options dataclass) as a JSON-able dict
    with sorted keys."""
    if dataclasses.is_dataclass(ns) and not isinstance(ns, type):
        items = dataclasses.asdict(ns).items()
    else:
        items = ns.items() if isinstance(ns, dict) else vars(ns).items()
    return {k: _jsonable(v, k) for k, v in sorted(items)}


def write_resolved_config(ns, run_dir) -> str:
    """Write RUN_DIR/config.json atomically (a crash never leaves half a file); return its path."""
    path = os.path.join(os.fspath(run_dir), CONFIG_FILE_NAME)
    atomic_write_json(path, resolved_config(ns))
    return path


def load_resolved_config(run_dir) -> dict:
    """Read RUN_DIR/config.json; ConfigError naming the file if it is missing or not a JSON object."""
    path = os.path.join(os.fspath(run_dir), CONFIG_FILE_NAME)
    return read_json_object(path, ConfigError,
                            not_found_hint=f": {run_dir!s} is not a run directory (it has no resolved config)")
