"""Sizes as users write them on command lines and in TOML files ("40GiB", "512MB", "1.5e9")."""
from __future__ import annotations

import math
import re

# Element sizes the memory model counts with: every float tensor of the engine is float32, every
# index tensor int64 (granndis_hpc/memory_model, nn/layers.py and nn/models.py byte counts).
FLOAT32_BYTES = 4
INT64_BYTES = 8

_UNITS = {"": 1, "b": 1,
          "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text) -> int:
    """Bytes from '40GiB', '512 MB', '1.5e9' or an int; a clear ValueError for anything else."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE.match(str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"not a size: {text!r}; write a number of bytes with an optional unit, "
                             f"e.g. 40GiB, 512MiB, 16GB")
        value, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(value * _UNITS[unit]):  # '1e400', 'inf': int() would raise OverflowError
        raise ValueError(f"a size must be a finite number of bytes, got {text!r}")
    nbytes = int(value * _UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return nbytes


def format_size(nbytes: float) -> str:
    """'38.2 GiB' style: binary units, three significant digits."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


# Link rates in bits per second, with tc's decimal units (emucluster's --rate writes them the same way).
_RATE_UNITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}


def parse_rate(text) -> float:
    """Bytes per second of a link written in bits per second ('10Gbit', '100mbit'); a clear ValueError
    for anything else, bytes-or-bits units ('100MB', '1G') included."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise ValueError(f"link rate {text!r} not understood; write bits per second with a unit, e.g. 100mbit, "
                         f"10gbit (units: {', '.join(_RATE_UNITS)})")
    bps = float(m.group(1)) * _RATE_UNITS[unit]
    if not math.isfinite(bps) or bps <= 0:
        raise ValueError(f"a link rate must be positive and finite, got {text!r}")
    return bps / 8
