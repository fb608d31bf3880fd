"""The TOML reader of ``--config FILE.toml`` (the rules: granndis_hpc/options/__init__.py)."""
from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Any, Dict, List, Optional

from .declare import MAX_VALUE_CHARS, ConfigError, _from_file, _Spec, group_title, specs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python < 3.11 (pyproject pulls in tomli there)
    import tomli as tomllib


def _keys(cls) -> Dict[str, _Spec]:
    """Every accepted key spelling (the field name, with '_' or '-') -> its spec.  Flag names that
    differ from the field (``--no-eval`` for ``eval``) are deliberately not keys: ``no-eval = true``
    would read as the opposite of what it does."""
    by_key = {}
    for spec in specs(cls):
        if spec.name != "config":
            by_key[spec.name] = by_key[spec.name.replace("_", "-")] = spec
    return by_key


def _flag_hint(cls, key: str) -> Optional[str]:
    for spec in specs(cls):
        if spec.flag == "--" + key and key.replace("-", "_") != spec.name:
            example = f"{spec.name} = false" if spec.kind is bool and spec.default is True else f"{spec.name} = ..."
            return f" The flag --{key} stores into {spec.name!r}: write '{example}' in the config file."
    return None


# An options file is a few hundred bytes; anything near this is not one (and would be echoed in errors).
MAX_CONFIG_BYTES = 1 << 20


_PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def presets() -> List[str]:
    """The names of the installed presets (granndis_hpc/configs: NAME.toml for --config NAME)."""
    from importlib import resources

    return sorted(f.name[: -len(".toml")] for f in resources.files("granndis_hpc.configs").iterdir()
                  if f.name.endswith(".toml"))


def resolve_config(path) -> str:
    """The file --config names: PATH itself, or, for a bare NAME that is no file here, the installed
    preset NAME.toml (``--config products``); ConfigError naming the presets when neither exists."""
    path = os.fspath(path)
    if os.path.exists(path) or not _PRESET_NAME.fullmatch(path) or path.endswith(".toml"):
        return path
    from importlib import resources

    preset = resources.files("granndis_hpc.configs") / f"{path}.toml"
    if preset.is_file():
        return str(preset)
    raise ConfigError(f"--config {path}: no such file, and no preset of that name; give a path to a TOML file, "
                      f"or one of the presets: {', '.join(presets())}")


def load_config_file(path, cls) -> Dict[str, Any]:
    """Read and check a TOML file (or an installed preset, resolve_config) against the options dataclass
    `cls`; return {field: value}."""
    path = resolve_config(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # bounded: --config /dev/zero must not fill the memory
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {path!r} is larger than {MAX_CONFIG_BYTES >> 10} KiB: not an options "
                              f"file (options are a few 'name = value' lines); check the --config path")
        raw = tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (check the --config path)") from None
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8: random bytes, or a Latin-1 file
        raise ConfigError(f"config file {path!r} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start}); save it as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"config file {path!r} is not valid TOML for options: its values nest too deeply "
                          f"(options are flat 'name = value' lines)") from None

    keys, sections = _keys(cls), _sections(cls)
    values: Dict[str, Any] = {}
    seen_as: Dict[str, str] = {}
    for key, value in raw.items():
        where = f"config file {path!r}, key {key!r}"
        if not isinstance(value, dict):
            _read(cls, keys, key, value, where, values, seen_as)
            continue
        section = sections.get(key)
        if section is None:
            raise ConfigError(f"{where}: {_section_problem(key, sections)}")
        for inner, item in value.items():
            where = f"config file {path!r}, key {inner!r} in [{key}]"
            spec = keys.get(inner)
            if spec is not None and group_title(cls, spec) != section:
                raise ConfigError(f"{where}: {inner!r} is an option of [{_section_name(group_title(cls, spec))}], "
                                  f"not of [{key}]: move it there, or above the first [section] header")
            _read(cls, keys, inner, item, where, values, seen_as, f"[{key}] {inner}")
    return values


def _section_name(title: Optional[str]) -> str:
    return (title or "").replace(" ", "-")


def _sections(cls) -> Dict[str, str]:
    """Every accepted spelling of a group's TOML section (its title, spaces written '-' or '_') -> the
    group's title."""
    out = {}
    for spec in specs(cls):
        title = group_title(cls, spec)
        if title is not None:
            out[_section_name(title)] = out[_section_name(title).replace("-", "_")] = title
    return out


def _section_problem(key: str, sections: Dict[str, str]) -> str:
    if not sections:
        return ("[sections] are not supported; write every option as a top-level 'name = value' line (before any "
                "[section] header)")
    names = sorted({_section_name(t) for t in sections.values()})
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" Did you mean [{close[0]}]?" if close else ""
    return (f"[{key}] is not a group of these options.{hint} The sections are "
            f"{', '.join(f'[{n}]' for n in names)}, each holding its own options; or write the options as "
            f"top-level 'name = value' lines")


def _read(cls, keys: Dict[str, _Spec], key: str, value, where: str, values: Dict[str, Any],
          seen_as: Dict[str, str], spelled: Optional[str] = None) -> None:
    """Check one 'key = value' of the file and store it in `values` under the field's name."""
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        raise ConfigError(f"{where}: a value of {len(value)} characters (starting {value[:24]!r}); option values "
                          f"are at most {MAX_VALUE_CHARS} characters (a path's limit)")
    if key.replace("-", "_") == "config":
        raise ConfigError(f"{where}: a config file cannot name another config file")
    spec = keys.get(key)
    if spec is None:
        flag_hint = _flag_hint(cls, key)
        if flag_hint:
            raise ConfigError(f"{where}: not an option name.{flag_hint}")
        close, named = [], set()
        for name in difflib.get_close_matches(key, sorted(keys), n=6, cutoff=0.6):
            if keys[name].name not in named:  # one spelling per option, the closest one
                named.add(keys[name].name)
                close.append(name)
        close = close[:3]
        hint = (" Did you mean " + " or ".join(repr(c) for c in close) + "?") if close else \
            " Run with --help for the list of options."
        raise ConfigError(f"{where}: unknown option.{hint}")
    if spec.name in seen_as:
        raise ConfigError(f"{where}: the same option is also given as {seen_as[spec.name]!r}; keep one of them")
    seen_as[spec.name] = spelled or key
    values[spec.name] = _from_file(spec, value, where)
