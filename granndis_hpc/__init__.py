"""granndis-hpc: GraNNDis training of deep GNNs on multi-server GPU clusters.

The Python API (docs/python-api.md) is this package's top level: build, train, predict, read_predictions,
world, their result types (ShardSet, TrainResult, Predictions), GranndisError and OptionError, and
TrainConfig (every training option).  They are imported on first use (PEP 562), so `import granndis_hpc`
loads neither torch nor MPI.
"""
__version__ = "0.1.0"

_API = ("GranndisError", "OptionError", "Predictions", "ShardSet", "TrainResult", "World", "build", "predict",
        "read_predictions", "train", "world")
__all__ = [*_API, "TrainConfig", "__version__"]


def __getattr__(name):
    if name in _API:
        from granndis_hpc import api

        value = getattr(api, name)
    elif name == "TrainConfig":
        from granndis_hpc.options.train import TrainConfig as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
