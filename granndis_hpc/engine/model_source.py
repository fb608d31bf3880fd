"""A trained model, read back: its parameters, the options that built it and the dataset it was trained on.

Three places hold one (`granndis predict --model`, `--init-from`, `--eval-only`):

    RUN_DIR                              best-model.pt when there is one, else the newest complete checkpoint
    RUN_DIR/best-model.pt (any copy)     the best-validation parameters
    RUN_DIR/checkpoints/epoch-00000E     (or its state.pt) the parameters after epoch E

best-model.pt carries its provenance (the run's resolved options, the dataset's name and content digest)
since the trainer writes it; a file without it (written before) takes them from the config.json beside
it and the dataset digest from the checkpoint's fingerprint or the shard set config.json names.  Files
are read with torch.load(weights_only=True): no pickled code runs.  What a file records is data: its
architecture options are checked (types, ranges, known models and options) and its parameters must be
finite tensors before anything is built from them, and the options that name code to import (`--model
pyg`'s module and factory) are never taken from it: the user names them again (model_code.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from granndis_hpc import registry
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.rundir.config_file import CONFIG_FILE_NAME, load_resolved_config
from granndis_hpc.options import ConfigError
from granndis_hpc.model_code import code_refusal, given_names
from granndis_hpc.options import check_recorded
from granndis_hpc.rundir.checkpoint_files import COMPLETE, SHARED_FILE, CheckpointError, latest_complete, read_complete
from granndis_hpc.rundir.best_model import BEST_MODEL

# The options that decide a model's parameters' shapes and its forward (with the shard set's feature
# width and class count): what a model read back is rebuilt with.
ARCHITECTURE = ("model", "hidden", "layers", "linear_layers", "norm", "dropout", "input_dropout", "model_option")
# Options a file may lack (written before they existed): their absence means their default.
_MAY_LACK = ("linear_layers", "norm", "dropout", "input_dropout", "model_option")


class ModelSourceError(ValueError):
    """The path holds no usable trained model, or one that does not fit the shard set."""


@dataclass
class ModelSource:
    path: str  # the file the parameters were read from
    kind: str  # "best-model" or "checkpoint"
    state: Dict[str, torch.Tensor]
    config: Dict  # the training run's resolved options (config.json's keys)
    epoch: Optional[int] = None  # epochs trained when these parameters were kept
    dataset: Optional[str] = None
    dataset_sha256: Optional[str] = None
    extra: Dict = field(default_factory=dict)

    def architecture(self) -> Dict:
        """The architecture options the source records, checked as data (ModelSourceError otherwise)."""
        return checked_architecture(self.config, self.path)

    def provenance(self) -> Dict:
        """What an output made from this model records about it."""
        return {"model_path": os.path.abspath(self.path), "model_kind": self.kind, "epoch": self.epoch,
                "dataset": self.dataset, "dataset_sha256": self.dataset_sha256, "architecture": self.architecture()}


def model_provenance(cfg, manifest: Dict) -> Dict:
    """What best-model.pt records so that the file alone can be used: the run's resolved options and its
    dataset (name and content digest, dataset.content_sha256 of the shard set's manifest)."""
    from granndis_hpc.rundir.config_file import resolved_config
    ds = manifest.get("dataset", {})
    digest = ds.get("content_sha256")
    return {"config": resolved_config(cfg), "dataset": ds.get("name"),
            "dataset_sha256": digest if isinstance(digest, str) else None}


def _recorded(config: Dict, key: str, path: str):
    value = config.get(key)
    if value is None:
        if key in _MAY_LACK:
            return None
        raise ModelSourceError(f"{path}: records no {key!r} option: it is not a model file of granndis-train")
    try:
        return check_recorded(TrainConfig, key, value, f"{path}: its recorded option {key!r}")
    except ConfigError as exc:
        raise ModelSourceError(f"{exc}: the file is damaged or was edited") from None


def checked_architecture(config, path: str) -> Dict:
    """The architecture options a model file records, checked as data before anything is built from them:
    each as a TOML value of the option is (type, range, a known model), then the model's options and
    linear head as the registry declares them.  ModelSourceError naming the file and the option."""
    if not isinstance(config, dict):
        raise ModelSourceError(f"{path}: its recorded options are a {type(config).__name__}, not a mapping: "
                               f"the file is damaged or was edited")
    arch = {key: _recorded(config, key, path) for key in ARCHITECTURE}
    try:
        registry.model_options(arch["model"], arch["model_option"])
    except ValueError as exc:
        raise ModelSourceError(f"{path}: its recorded {exc}") from None
    problem = registry.linear_head_problem(arch["model"], arch["layers"], arch["linear_layers"])
    if problem:
        raise ModelSourceError(f"{path}: its recorded options cannot be built: {problem}")
    return arch


def check_parameters(state: Dict, path: str) -> None:
    """The model entries are named tensors, all finite: NaN or infinite parameters would predict NaN logits
    (and class 0 for every vertex) with exit status 0, as --resume refuses them."""
    for name, value in state.items():
        if not isinstance(name, str) or not torch.is_tensor(value):
            raise ModelSourceError(f"{path}: its model entry {str(name)[:40]!r} is a {type(value).__name__}, not a "
                                   f"named tensor: the file is damaged or was edited")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ModelSourceError(f"{path}: its model parameter {name!r} holds NaN or infinite values, so it cannot "
                                   f"be used: take an earlier checkpoint (RUN_DIR/checkpoints/epoch-E) or train again")


def _text(value) -> Optional[str]:
    return value if isinstance(value, str) else None


def _load(path: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelSourceError(f"{path}: no such file") from None
    except Exception as exc:  # noqa: BLE001 -- torch raises many types for a damaged or foreign file
        raise ModelSourceError(f"{path}: not a model file written by granndis-train ({type(exc).__name__}); "
                               f"give a run directory, its best-model.pt or a checkpoint directory") from None


def _config_beside(run_dir: str, what: str) -> Dict:
    try:
        return load_resolved_config(run_dir)
    except ConfigError:
        raise ModelSourceError(f"{what} has no provenance of its own and {os.path.join(run_dir, CONFIG_FILE_NAME)} "
                               f"cannot be read: keep the file in its run directory") from None


def _digest_of_shards(config: Dict) -> Optional[str]:
    """The content digest of the shard set the run trained on, when it is still readable (old files)."""
    from granndis_hpc.shards import read_manifest  # h5py-free, but keep the import where it is needed
    try:
        value = read_manifest(config.get("shards") or "").get("dataset", {}).get("content_sha256")
    except Exception:  # noqa: BLE001 -- gone or unreadable: the caller says what is unknown
        return None
    return value if isinstance(value, str) else None


def _best_model(path: str) -> ModelSource:
    obj = _load(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise ModelSourceError(f"{path}: holds no 'model' parameters; it is not a best-model.pt of granndis-train")
    prov = obj.get("provenance")
    if isinstance(prov, dict) and isinstance(prov.get("config"), dict):
        config, dataset, digest = prov["config"], prov.get("dataset"), prov.get("dataset_sha256")
    else:
        config = _config_beside(os.path.dirname(os.path.abspath(path)), path)
        dataset, digest = None, _digest_of_shards(config)
    epoch = obj.get("epoch") if isinstance(obj.get("epoch"), int) else None
    return ModelSource(path, "best-model", obj["model"], config, epoch=epoch, dataset=_text(dataset),
                       dataset_sha256=_text(digest),  # the metric's values at that epoch (rundir/best_model.py)
                       extra={k: v for k, v in obj.items() if k not in ("model", "provenance", "epoch")})


def _checkpoint(directory: str) -> ModelSource:
    complete = read_complete(directory)
    if complete is None:
        raise ModelSourceError(f"{directory}: not a complete checkpoint (no readable {COMPLETE})")
    state_path = os.path.join(directory, SHARED_FILE)
    from granndis_hpc.rundir.checkpoint import read_payload  # its size and sha256 checked first
    try:
        obj = read_payload(directory, complete["files"][SHARED_FILE])
    except (CheckpointError, KeyError, TypeError) as exc:
        raise ModelSourceError(f"{directory}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise ModelSourceError(f"{state_path}: holds no 'model' parameters; the checkpoint is damaged")
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(directory)))
    fp = complete.get("fingerprint") or {}
    config = _config_beside(run_dir, directory)
    return ModelSource(state_path, "checkpoint", obj["model"], config, epoch=int(complete.get("epoch", 0)),
                       dataset=_text(fp.get("dataset")), dataset_sha256=_text(fp.get("dataset_sha256")))


def read_model_source(path: str) -> ModelSource:
    """The trained model at `path` (a run directory, a best-model.pt, a checkpoint directory or its
    state.pt), its options and parameters checked as data; ModelSourceError saying what is wrong
    otherwise."""
    source = _find_source(os.fspath(path))
    source.architecture()
    check_parameters(source.state, source.path)
    return source


def _find_source(path: str) -> ModelSource:
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, COMPLETE)):
            return _checkpoint(path)
        if os.path.isfile(os.path.join(path, BEST_MODEL)):
            return _best_model(os.path.join(path, BEST_MODEL))
        try:
            newest = latest_complete(path)
        except CheckpointError:
            newest = None
        if newest is not None:
            return _checkpoint(newest.path)
        raise ModelSourceError(f"{path}: holds neither {BEST_MODEL} nor a complete checkpoint; give a run "
                               f"directory of a finished (or checkpointed) granndis-train run")
    if os.path.basename(path) == SHARED_FILE and os.path.isfile(os.path.join(os.path.dirname(path), COMPLETE)):
        return _checkpoint(os.path.dirname(path))
    if not os.path.exists(path):
        raise ModelSourceError(f"{path}: no such file or directory; give a run directory, its {BEST_MODEL} "
                               f"or a checkpoint directory")
    return _best_model(path)


def dataset_refusal(source: ModelSource, manifest: Dict, shards: str) -> Optional[str]:
    """Why the model cannot be applied to this shard set's dataset (None: it can): the content digests
    must match, so a model is never applied to other data by mistake."""
    ds = manifest.get("dataset", {})
    name, digest = ds.get("name"), ds.get("content_sha256")
    if source.dataset_sha256 is None:
        return (f"{source.path} does not say which dataset it was trained on (no content digest, and the shard "
                f"set its run names is not readable), so it cannot be checked against {shards}")
    if digest is None:
        return (f"{shards} has no dataset content digest (built by an older granndis-hpc): rebuild it with "
                f"`granndis preprocess build ... --overwrite`")
    if digest != source.dataset_sha256:
        return (f"{source.path} was trained on another dataset than {shards} holds (dataset "
                f"{source.dataset!r} content {source.dataset_sha256[:12]}..., the shard set: {name!r} content "
                f"{digest[:12]}...): the graph, features, labels or split differ")
    return None


def load_parameters(model: torch.nn.Module, source: ModelSource) -> None:
    """Copy the source's parameters into `model` (built from source.architecture()), refusing a model of
    another shape with the differences named."""
    mine = model.state_dict()
    missing = sorted(set(mine) - set(source.state))
    unexpected = sorted(set(source.state) - set(mine))
    shapes = [f"{k} {tuple(source.state[k].shape)} (here {tuple(mine[k].shape)})"
              for k in sorted(set(mine) & set(source.state)) if tuple(source.state[k].shape) != tuple(mine[k].shape)]
    problems = ([f"missing {', '.join(missing[:4])}"] if missing else []) + \
               ([f"unexpected {', '.join(unexpected[:4])}"] if unexpected else []) + shapes[:4]
    if problems:
        raise ModelSourceError(f"{source.path}: its parameters do not fit the model built here "
                               f"({source.architecture()}, the shard set's feature width and classes): "
                               + "; ".join(problems))
    model.load_state_dict(source.state)


def _run_differs(cfg, arch: Dict) -> List[str]:
    """The run's architecture options that are not the saved model's."""
    differ = [f"--{k.replace('_', '-')} {getattr(cfg, k)!r} (the model: {arch[k]!r})"
              for k in ("model", "hidden", "layers") if arch[k] != getattr(cfg, k)]
    if bool(arch["norm"]) != cfg.norm:
        differ.append(f"--norm {cfg.norm!r} (the model: {bool(arch['norm'])!r})")
    if not differ and registry.model_options(cfg.model, cfg.model_option) != \
            registry.model_options(arch["model"], arch["model_option"]):
        differ.append(f"--model-option {cfg.model_option!r} (the model: {arch['model_option']!r})")
    return differ


def saved_model_options(path: str, given: Dict) -> Dict:
    """--init-from / --eval-only: the architecture options of the model at `path` that the user did not
    give (`given`: the command line's and --config's values), so that a run starts from a saved model
    without retyping them.  Model options (--model-option) merge: the recorded items the user did not
    name, then the user's.  Items that name code (--model pyg's module and factory) are never taken from
    the file: the user names them (model_code.py), or the run is refused with what to add."""
    arch = read_model_source(path).architecture()
    taken = {k: arch[k] for k in ARCHITECTURE if k != "model_option" and k not in given and arch.get(k) is not None}
    model = given.get("model", arch.get("model"))
    if model is not None and model == arch.get("model") and arch.get("model_option"):
        mine = list(given.get("model_option") or ())
        skip = given_names(mine) | set(registry.code_options(model))
        kept = [item for item in arch["model_option"] if given_names([item]).isdisjoint(skip)]
        if kept:
            taken["model_option"] = kept + mine
    return taken


def init_source(cfg) -> ModelSource:
    """--init-from: the trained model, checked against the run's own options, which must describe the same
    architecture and name the same code (a file never chooses it); returns the source, whose parameters
    load_parameters copies into the run's model (and summary.json names)."""
    source = read_model_source(cfg.init_from)
    arch = source.architecture()
    if arch["model"] == cfg.model:
        problem = code_refusal(cfg.model, registry.model_options(cfg.model, arch["model_option"]), cfg.model_option,
                               source.path)
        if problem:
            raise ModelSourceError(f"--init-from {cfg.init_from}: {problem}")
    differ = _run_differs(cfg, arch)
    if differ:
        raise ModelSourceError(f"--init-from {cfg.init_from}: the run builds another model than the saved one: "
                               f"{', '.join(differ)}; give the saved model's options")
    return source
