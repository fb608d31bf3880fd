"""The Python API (docs/python-api.md): build, train and predict from a script or a notebook, on the same
engine as the command-line tools, in one process or under mpirun/srun with one rank per GPU.

    import granndis_hpc as gd
    result = gd.train(data, out="runs/cora", mode="fb", layers=2, epochs=50)   # a PyG Data
    preds = gd.predict(result, data)                                          # preds.prediction, preds.logits

Every function is collective: under mpirun every rank calls it, with the same arguments.  The names
below import nothing heavy; torch and MPI load when a function first runs.
"""
from granndis_hpc.api.building import build
from granndis_hpc.api.errors import GranndisError, OptionError
from granndis_hpc.api.prediction import predict
from granndis_hpc.api.results import Predictions, ShardSet, TrainResult, read_predictions
from granndis_hpc.api.training import train
from granndis_hpc.api.world import World, world

__all__ = ["GranndisError", "OptionError", "Predictions", "ShardSet", "TrainResult", "World", "build", "predict",
           "read_predictions", "train", "world"]
