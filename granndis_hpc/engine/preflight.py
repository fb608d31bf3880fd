"""Set-up checks and choices of the training loop that need no communication: the model's options,
the split totals against the manifest, the optimizer's groups, the CPU threads per rank.  Each raises
TrainingError with what to change; the trainer raises them on every rank together."""
from __future__ import annotations

import os
from typing import Dict

import torch

from granndis_hpc.engine.steps import TrainingError
from granndis_hpc.nn.contract import ModelContract


def check_input_dropout(cfg, contract: ModelContract) -> None:
    """--input-dropout needs a model that applies it with keyed masks (its contract's input_dropout_rows)."""
    if cfg.input_dropout > 0 and (not contract.keyed or contract.input_dropout_rows is None):
        raise TrainingError(f"--input-dropout {cfg.input_dropout}: model {cfg.model!r} does not apply input "
                            f"dropout (its contract names no input_dropout_rows, or its forward takes no keyed "
                            f"`dropout`); leave --input-dropout out or use --model sage, gcn or ressage")


def optimizer_groups(model, cfg, contract: ModelContract):
    """The optimizer's parameter groups: --weight-decay on every parameter, or (--weight-decay-on first)
    only on the layer reading the input features (the contract's first_layer_prefix), as Kipf & Welling's
    GCN and PyG's examples/gcn.py do."""
    if cfg.weight_decay_on == "all":
        return [{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]
    prefix = contract.first_layer_prefix
    first = [p for name, p in model.named_parameters() if name.startswith(prefix)]
    rest = [p for name, p in model.named_parameters() if not name.startswith(prefix)]
    if not first:
        raise TrainingError(f"--weight-decay-on first: model {cfg.model!r} has no parameters named {prefix}*; "
                            f"declare first_layer_prefix in the model's contract or use --weight-decay-on all")
    return [{"params": first, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]


def features_entry(manifest: Dict) -> Dict:
    """How the shard set's features were preprocessed (`preprocess build --normalize-features`); shard
    sets built before the option existed hold the raw features."""
    return dict(manifest.get("features") or {"normalization": "none"})


def check_split_totals(totals: Dict, manifest: Dict, path: str) -> None:
    """The inner rows flagged train/val/test, summed over the job, against the manifest's counts: split
    flags edited in a server file (test flags copied from the train flags) would otherwise evaluate on
    other vertices and report a different accuracy with exit status 0."""
    ds = manifest["dataset"]
    wrong = [f"{k} {int(totals[k])} (manifest: {int(ds[f'num_{k}'])})" for k in ("train", "val", "test")
             if int(totals[k]) != int(ds[f"num_{k}"])]
    if wrong:
        raise TrainingError(f"{path}: the server files flag {', '.join(wrong)} inner vertices: their split/* flags "
                            f"were edited after the build; run `granndis preprocess verify {path}` and rebuild the "
                            f"set with `granndis preprocess build ... --overwrite`")
    if int(ds["num_classes"]) > max(int(ds["num_vertices"]), 1):
        raise TrainingError(f"{path}: manifest num_classes {ds['num_classes']} exceeds its {ds['num_vertices']} "
                            f"vertices: the output layer would be that wide; rebuild the set from its source")
    if int(totals["train"]) == 0:
        raise TrainingError(f"{path}: the shards have no training vertices; build the set from a dataset "
                            f"whose split marks training vertices")


def share_cpu_threads(topo) -> None:
    """Ranks on one node share its cores: without this every rank starts one torch thread per core and
    they fight (measured: 20x slower on 4 ranks over 2 cores).  OMP_NUM_THREADS, when set, wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // topo.ranks_on_node))


class DeterministicKernels:
    """--deterministic: torch's deterministic algorithms for the run (torch.use_deterministic_algorithms),
    restored by close() (the Python API runs several trainers in one process).  On a GPU that makes the
    kernels that add with atomics take their deterministic form: index_add (GAT's softmax sums and
    messages, the index_add aggregation), scatter_add and index_put with accumulation; cuBLAS gets a
    fixed workspace (CUBLAS_WORKSPACE_CONFIG, read when its handle is made, so set before any GPU work);
    the loss avoids NLLLoss, which has no deterministic CUDA kernel (targets.loss).  What has no
    deterministic form raises instead of running.  On the CPU these kernels are deterministic already."""

    def __init__(self, enabled: bool):
        self.restore = None
        if enabled:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            self.restore = (torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled())
            torch.use_deterministic_algorithms(True)

    def close(self) -> None:
        if self.restore is not None:
            torch.use_deterministic_algorithms(self.restore[0], warn_only=self.restore[1])
            self.restore = None


# ---- before start-up: what the options and the shard set's manifest alone show -----------------------
def check_before_start(cfg, world_size: int) -> None:
    """What a run would refuse after its start-up (the world, the link check, the shards read), found from
    the options and the shard sets' manifests alone, so that a launch fails in seconds: the importability of
    the model's code, a shard set built for another job shape or layer count, a set the mode cannot use.
    Raises ConfigError, ModelCodeError, ShardError, TrainingError or MemoryModelError; the caller raises it on
    every rank together.  The trainer checks all of this again (the Python API does not come through here)."""
    from granndis_hpc import shards

    check_model_code(cfg)
    rps = _ranks_per_server(cfg.ranks_per_server, world_size)
    job = None if rps is None else (world_size // rps, rps)
    if cfg.mode == "auto":  # a comma-separated list: auto leaves out a set of another shape, refuses if all are
        from granndis_hpc.memory_model import MemoryModelError
        from granndis_hpc.memory_model.shardsets import fitting_sets
        paths = [p for p in str(cfg.shards).split(",") if p]
        usable, skipped = fitting_sets({p: shards.read_manifest(p) for p in paths}, cfg.conv_layers, job,
                                       cfg.inductive)
        if not usable:  # choose_shard_sets' refusal, which it gives after the world is up
            raise MemoryModelError("--mode auto: none of the shard sets can run this job: " + "; ".join(skipped))
        return
    from granndis_hpc.engine import inductive
    from granndis_hpc.engine.modes import make_mode

    manifest = shards.read_manifest(cfg.shards)
    mode = make_mode(cfg)
    built = (int(manifest["servers"]), int(manifest["gpus_per_server"]))
    if job is None and built[0] * built[1] != world_size:  # servers from the nodes: only the total is known
        raise shards.ShardError(
            f"shard set {cfg.shards} was built for {built[0]} servers x {built[1]} GPUs per server "
            f"({built[0] * built[1]} ranks) but this job runs {world_size} ranks; launch {built[0] * built[1]} "
            f"ranks, or re-run preprocess with --servers and --gpus-per-server of this job")
    servers, gpus = job or built
    shards.check_job(manifest, servers, gpus, mode.shard_layers())
    mode.check(manifest)
    inductive.check_shards(cfg.inductive, manifest, cfg.shards)
    check_typed_model(cfg.model, manifest, cfg.shards)


def check_typed_model(model: str, manifest: dict, path: str) -> None:
    """A typed model (R-GCN, R-GAT: registry capability ``typed``) needs a set with vertex and edge types."""
    from granndis_hpc import registry

    if registry.typed(model) and "types" not in manifest["dataset"]:
        raise TrainingError(f"--model {model} needs a heterogeneous shard set (vertex and edge types), and "
                            f"{path} has one vertex type; build the set from a heterogeneous source "
                            f"(docs/heterogeneous.md), or choose a model for homogeneous graphs")


def check_model_code(cfg) -> None:
    """The code a model names (`--model pyg` and `pyg-hetero`'s module and factory: the options that name
    code) imports on this rank and holds the factory: nn/pyg.py's ModelCodeError otherwise.  Nothing of the
    user's code runs but its import."""
    from granndis_hpc import registry

    if cfg.model not in registry.MODELS or "module" not in registry.code_options(cfg.model):
        return
    from granndis_hpc.nn.pyg import model_factory
    options = registry.model_options(cfg.model, cfg.model_option)
    if options.get("module"):  # none named: the trainer says what to add (from the model file, where one is read)
        model_factory(options["module"], options.get("factory", "build"))


def _ranks_per_server(given, world_size: int):
    """--ranks-per-server (or its environment variable) when it fits the job; None when the servers are the
    nodes, found by the topology, or when the value is wrong, which the topology refuses with its reason."""
    from granndis_hpc.cluster.topology import _resolve_ranks_per_server

    return _resolve_ranks_per_server(given, world_size)[0]
