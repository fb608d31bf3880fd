"""The synthetic source's entry points (preprocess/sources/__init__.py registers them): `--generator`
picks the module, sbm and local in synthetic_chunks.py, the typed mag graph in synthetic_mag.py."""
from __future__ import annotations

from granndis_hpc.preprocess.sources.synthetic_chunks import SyntheticSource, load_synthetic as _load_chunks
from granndis_hpc.preprocess.sources.synthetic_mag import MagSource, load_mag


def open_synthetic(generator: str = "sbm", **params):
    """The sliced source of `--generator` (preprocess/build/sliced.py protocol)."""
    return MagSource(**params) if generator == "mag" else SyntheticSource(generator, **params)


def load_synthetic(symmetrize=True, self_loops="remove", name="synthetic", generator="sbm", **params):
    """The whole canonical graph of `--generator` in this process (a Graph; mag's with its types)."""
    if generator == "mag":
        return load_mag(symmetrize, self_loops, None if name == "synthetic" else name, **params)
    return _load_chunks(symmetrize, self_loops, name, generator=generator, **params)
