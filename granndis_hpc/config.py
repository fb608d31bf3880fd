"""The options of `granndis-train` (:class:`TrainConfig`: one declaration, from which its parser,
``--config FILE.toml`` and ``--help`` are derived by granndis_hpc/options/) and the resolved config of
a run (``RUN_DIR/config.json``, so a run can be reproduced and ``granndis report`` can label it).

The framework (``option()``, specs, defaults, validate, build_parser, read_options, the TOML rules) lives
in granndis_hpc/options/, which every command shares; import its names from there.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import List, Optional

from granndis_hpc import registry
from granndis_hpc.fsutil import atomic_write_json, read_json_object
from granndis_hpc.options import (ConfigError, HelpFormatter, add_options, allowed_choices,
                                  build_parser, defaults, load_config_file, missing_required, option,
                                  parse_args_with_config, read_options, resume_rule, specs, validate)
from granndis_hpc.graph.sampler import SAMPLERS
from granndis_hpc.metric_names import METRICS
from granndis_hpc.startup_options import (deterministic_option, dist_timeout_option, host_staging_option,
                                          master_addr_option, share_gpus_option)
from granndis_hpc.schedule_options import LR_SCHEDULES, OPTIMIZER_NAMES, SCHEDULE_GROUP, schedule_problem
from granndis_hpc.units import parse_size

CONFIG_FILE_NAME = "config.json"


# ---------------------------------------------------------------------------------------------
# The options of granndis-train

# The same lists as cluster.topology.DEVICES / TRANSPORTS (tests/unit/test_config.py keeps them equal).
# Not imported from there: that module imports mpi4py, which initialises MPI, and `granndis report`
# reads this module on machines without MPI.
DEVICE_NAMES = ("auto", "cpu", "cuda")
TRANSPORT_NAMES = ("auto", "gloo", "nccl", "mpi")
LOG_LEVELS = ("debug", "info", "warning", "error")  # granndis_hpc/progress.py: setup_logging
# --weight-decay-on: every parameter, or the first layer's only (the model contract's first_layer_prefix, nn/contract.py).
WEIGHT_DECAY_ON = ("all", "first")
# --halo-dtype: the wire format of training halo rows (engine/exchange.py); float32 is exact.
HALO_DTYPES = ("float32", "bfloat16", "float16")
# --halo-route: how the world group's halo rows cross servers (engine/halo_route.py HALO_ROUTES).
HALO_ROUTES = ("per-server", "direct")
# --precision: the dtype the layers compute in (engine/precision.py); fp32 is exact.
PRECISIONS = ("fp32", "bf16")
# Which halo exchanges a layer computes behind (exchange group names, cluster/exchange_group.py).
OVERLAP_HALOS = {"world": frozenset({"world"}), "all": frozenset({"world", "server"})}


def _mode_names():
    # The registries (granndis_hpc/registry.py, filled by engine/modes.py and nn/models.py) list their
    # names without importing the engine or torch; read when an option is checked, so that a mode or
    # model registered after import is a valid choice.
    return tuple(registry.MODES)


def _model_names():
    return tuple(registry.MODELS)


def _sampler_names():
    return tuple(SAMPLERS)


def _size_text(text: str) -> str:
    """A memory size as written ('40GiB'), checked with units.parse_size and kept as written, so that
    config.json records what the user typed."""
    parse_size(text)
    return text


_size_text.__name__ = "size"


def _resume_help(cls) -> str:
    """--resume's help, from the fields' on_resume rules (a field marked "may_change" is listed without
    anyone editing this text)."""
    rules = {s.name: s for s in specs(cls) if s.meta.get("on_resume") == "may_change" and s.name not in ("resume", "out")}
    free = [s.flag for s in rules.values() if not s.meta.get("resume_shape")]
    shape = [s.flag for s in rules.values() if s.meta.get("resume_shape")]
    return ("continue RUN_DIR from its newest complete checkpoint (from epoch 0 when it has none yet) with the "
            f"options in RUN_DIR/config.json (nothing else is needed, but for a model that imports code, as pyg does, "
            f"its module=... and factory=... model options as config.json records them: a file never chooses the "
            f"code that runs); options given again may differ only for "
            f"{', '.join(free)}, and {' / '.join(shape)} when they name the same shard set and layout, or, in the "
            f"exact modes fb and flx, the same dataset built for another layout")


def _fanout_problem(value: int) -> Optional[str]:
    if value == -1 or value >= 1:
        return None
    return f"must be a positive number of neighbours or -1 for all, got {value}"


@dataclass
class TrainConfig:
    """Every option of `granndis-train`; the parser, --config and --help are derived from it."""
    # on_resume: "keep" (default) = a resumed run must have the same value, and the checkpoint
    # fingerprint holds it (it changes the trajectory); "may_change" = given again with --resume it wins
    # (nothing the numbers depend on, or checked otherwise: shards, ranks_per_server, mode and
    # preloaded_layers are the fingerprint's shape, which only the exact modes may change, see
    # rundir/checkpoint.py); "reset" = not carried over from the run being resumed.
    shards: str = option(help="shard directory written by `granndis preprocess build` (required, except with "
                              "--resume)", on_resume="may_change", resume_shape=True)
    mode: str = option("flx", choices=_mode_names, on_resume="may_change", resume_shape=True,
                       help="fb: full-batch baseline (1-hop halo every layer, world-wide); flx: flexible "
                            "preloading (full k-hop preload, only gradients cross servers); eas: "
                            "expansion-aware sampled preload; cob: cooperative batching (a server's GPUs share "
                            "one co-batch); mb: per-GPU mini-batches (the baseline cob is measured against); "
                            "auto: GraNNDis' automatic choice for --memory-per-gpu")
    model: str = option("sage", choices=_model_names, help="GNN architecture")
    # None, not []: checkpoints written before the option existed hold no value for it (same fingerprint).
    model_option: Optional[List[str]] = option(None, append=True, metavar="NAME=VALUE",
                                                help="an extra constructor option of the model, as its registry entry "
                                           "declares them (repeat for several), e.g. gat: heads, out_heads, concat, "
                                           "attn_dropout, negative_slope; gin: eps (docs/models.md)")
    layers: int = option(3, ge=1, help="layers of the model: the message-passing ones, plus --linear-layers")
    # None, not 0: checkpoints written before the option existed hold no value for it (same fingerprint);
    # __post_init__ turns 0 into None.
    linear_layers: Optional[int] = option(
        None, ge=0, metavar="N",
        help="the last N of --layers are per-vertex Linear layers (no aggregation; every built-in model), so the "
             "model aggregates over --layers - N hops and trains on a set built with that many: the GraNNDis "
             "artifact's 3-layer GraphSAGE is --layers 4 --linear-layers 1 on a 3-hop set (default: none)")
    inductive: bool = option(
        False,
        help="inductive training (the GraNNDis artifact's, PipeGCN's and BNS-GCN's protocol): train on the subgraph "
             "induced by the training vertices, measure validation accuracy on the graph induced by the training "
             "and validation vertices and test accuracy on the full graph; needs a shard set built with `granndis "
             "preprocess build ... --inductive` (docs/inductive.md)")
    hidden: int = option(64, ge=1, help="hidden width")
    epochs: int = option(200, ge=1, on_resume="may_change", help="training epochs")
    lr: float = option(0.01, gt=0.0, help="learning rate (a schedule's peak)")
    weight_decay: float = option(0.0, ge=0.0, help="weight decay (adam and sgd: L2 in the gradient; adamw: decoupled)")
    weight_decay_on: str = option("all", choices=WEIGHT_DECAY_ON,
                                  help="parameters --weight-decay applies to: all, or first = the layer that "
                                       "reads the input features (Kipf & Welling's GCN and PyG's examples/gcn.py "
                                       "decay conv 0 only)")
    # The optimizer and its schedule (engine/optim.py).  Not in the checkpoint fingerprint (checkpoints
    # written before these options existed ran with their defaults): the optimizer's saved state holds
    # them and refuses other values on resume, as the sampler's does for its options.
    optimizer: str = option("adam", choices=OPTIMIZER_NAMES, fingerprint=False, group=SCHEDULE_GROUP,
                            help="adam, adamw (decoupled weight decay) or sgd (--momentum, --nesterov)")
    momentum: float = option(0.0, ge=0.0, lt=1.0, fingerprint=False, group=SCHEDULE_GROUP, help="sgd: momentum")
    nesterov: bool = option(False, fingerprint=False, group=SCHEDULE_GROUP,
                            help="sgd: Nesterov momentum (needs --momentum > 0)")
    lr_schedule: str = option("constant", choices=LR_SCHEDULES, fingerprint=False, group=SCHEDULE_GROUP,
                              help="learning rate per epoch after --warmup-epochs: constant; step (x --gamma every "
                                   "--step-size epochs); cosine (down to --min-lr over --lr-decay-epochs); plateau "
                                   "(x --gamma after --plateau-patience evaluations without a better validation "
                                   "metric, not below --min-lr)")
    warmup_epochs: int = option(0, ge=0, fingerprint=False, group=SCHEDULE_GROUP,
                                help="linear warm-up: epoch e < N runs at --lr * (e + 1) / N")
    step_size: int = option(30, ge=1, fingerprint=False, group=SCHEDULE_GROUP, help="step: epochs per decay")
    gamma: float = option(0.1, gt=0.0, lt=1.0, fingerprint=False, group=SCHEDULE_GROUP,
                          help="step and plateau: the factor of each decay")
    min_lr: float = option(0.0, ge=0.0, fingerprint=False, group=SCHEDULE_GROUP,
                           help="cosine: the final learning rate; plateau: the lowest")
    lr_decay_epochs: int = option(0, ge=0, fingerprint=False, group=SCHEDULE_GROUP,
                                  help="cosine: the epoch the decay ends at (0 = --epochs of the run's start; kept "
                                       "when a resumed run changes --epochs)")
    plateau_patience: int = option(10, ge=1, fingerprint=False, group=SCHEDULE_GROUP,
                                   help="plateau: evaluations without a better validation metric before a decay")
    clip_grad_norm: float = option(0.0, ge=0.0, fingerprint=False, group=SCHEDULE_GROUP,
                                   help="clip the gradient to this global L2 norm (0 = off); the norm is the whole "
                                        "graph's, as one process computes it")
    patience: int = option(0, ge=0, on_resume="may_change", group=SCHEDULE_GROUP,
                           help="early stopping: end the run after N evaluations (--eval-every) without a better "
                                "validation metric, with the best model in best-model.pt (0 = off)")
    dropout: float = option(0.5, ge=0.0, lt=1.0, help="dropout probability")
    input_dropout: float = option(0.0, ge=0.0, lt=1.0,
                                  help="dropout probability of the input features (Kipf & Welling's GCN: 0.5); "
                                       "keyed by vertex id like --dropout, so cached halo rows need no exchange")
    norm: bool = option(False, help="LayerNorm between sage/gcn layers")
    seed: int = option(0, ge=0, help="seed for parameters and dropout")
    eval_every: int = option(10, ge=0, on_resume="may_change",
                             help="exact full-graph evaluation every N epochs (and always at the end); "
                                  "0 = only at the end")
    # Not in the checkpoint fingerprint (checkpoints written before the option existed evaluated accuracy):
    # the optimizer's saved state holds it, with the early-stopping state it drives (engine/optim.py).
    metric: Optional[str] = option(None, choices=METRICS, fingerprint=False,
                                   help="the evaluation metric (best-model selection, --patience, the report): "
                                        "accuracy, micro-f1 (sklearn's micro-averaged F1 of logits > 0) or rocauc "
                                        "(OGB's ROC-AUC averaged over the tasks with both classes; multi-label "
                                        "sets only); default: accuracy, and micro-f1 for a multi-label set "
                                        "(docs/after-training.md)")
    out: Optional[str] = option(None, on_resume="may_change",
                                help="run directory (config.json, metrics.jsonl, summary.json, checkpoints); "
                                     "one that already holds a run is refused: continue it with --resume, "
                                     "or give --overwrite-run")
    ranks_per_server: Optional[int] = option(None, ge=1, on_resume="may_change", resume_shape=True,
                                             help="emulate servers of N ranks (default: env "
                                                  "GRANNDIS_RANKS_PER_SERVER, else one server per shared-memory "
                                                  "node)")
    device: str = option("auto", choices=DEVICE_NAMES, help="auto = cuda:local_rank when CUDA is available")
    intra_transport: str = option("auto", choices=TRANSPORT_NAMES, on_resume="may_change",
                                  help="intra-server transport (auto: NCCL on GPU, measured default on CPU)")
    master_addr: Optional[str] = master_addr_option()
    dist_timeout: float = dist_timeout_option()
    deterministic: bool = deterministic_option()
    share_gpus: bool = share_gpus_option()
    host_staging: bool = host_staging_option()
    quiet: bool = option(False, on_resume="may_change",
                         help="no banner, per-epoch lines or progress bar on stdout (the final result line stays)")
    log_level: str = option("info", choices=LOG_LEVELS, on_resume="may_change",
                            help="the least severe log lines written to stderr (info: notices such as a resumed "
                                 "checkpoint or removed temporary files; --quiet does not hide them); rank 0 only "
                                 "unless --log-all-ranks: the other ranks log warnings and errors")
    log_all_ranks: bool = option(False, on_resume="may_change",
                                 help="every rank logs at --log-level, each line labelled [rank R] (default: ranks "
                                      "other than 0 log only warnings and errors)")
    skip_checksums: bool = option(False, on_resume="may_change", help="do not verify shard sha256 at start-up")
    verify_content: bool = option(False, on_resume="may_change",
                                  help="before training, recompute the dataset content digest from the rows the "
                                       "ranks read and refuse a set whose files were edited after the build "
                                       "(dataset.content_sha256; the dataset's bytes travel to rank 0 once)")
    # Checkpoints (rundir/checkpoint.py): every N epochs (0 = only when SIGUSR1/SIGTERM asks to stop),
    # and the run directory to continue from (its newest complete checkpoint).
    checkpoint_every: int = option(0, ge=0, metavar="N", on_resume="may_change",
                                   help="write a checkpoint into RUN_DIR/checkpoints/ every N epochs (the newest "
                                        "2 complete ones are kept); 0 = only when SIGUSR1 or SIGTERM asks the run "
                                        "to stop, which it does after the current epoch, with a checkpoint, "
                                        "exiting 0")
    checkpoint_initial: bool = option(False, on_resume="may_change",
                                      help="also write the initial parameters, before the first step, as the "
                                           "checkpoint of epoch 0 (RUN_DIR/checkpoints/epoch-000000, never pruned): "
                                           "--init-from, --resume and granndis predict take it as any checkpoint")
    resume: Optional[str] = option(None, metavar="RUN_DIR", on_resume="may_change", help=_resume_help)
    # Warm start (engine/model_source.py reads the model): parameters only, so the run is a new one.
    init_from: Optional[str] = option(None, metavar="RUN_OR_FILE",
                                      help="start from a trained model's parameters (a run directory, its "
                                           "best-model.pt or a checkpoint directory) with a fresh optimizer, in a new "
                                           "run (--out), on any shape and mode; the model options not given are the saved model's, and "
                                           "those given must match it")
    eval_only: bool = option(False, fingerprint=False, help="train nothing: evaluate the --init-from model on --shards and write "
                                         "summary.json (with --out) and the accuracies")
    overwrite_run: bool = option(False, on_resume="reset",
                                 help="replace the granndis-train run that --out already holds (its files only; it is "
                                      "deleted only after the new run has written its config.json)")
    # Cooperative batching (cob) and the per-GPU mini-batch baseline (mb).  Not in the checkpoint
    # fingerprint: the sampler's saved state holds them and its load_state_dict refuses other values,
    # in the modes where they change anything (the others never read them).
    batches_per_epoch: int = option(1, ge=1, fingerprint=False,
                                    help="cob/mb: co-batches per epoch (each server's training vertices in "
                                         "shuffled chunks)")
    sampler: str = option("sage", choices=_sampler_names, fingerprint=False,
                          help="cob/mb: sage = per-hop fanout sampling of the dependency graph; saint = the "
                               "subgraph induced on the batch")
    fanout: int = option(-1, check=_fanout_problem, fingerprint=False,
                         help="cob/mb: in-neighbours kept per vertex and hop (-1 = all)")
    sequential_sampling: bool = option(
        False, on_resume="may_change",
        help="cob/mb: sample each co-batch on the main thread after the previous step, instead of in a "
             "background thread while it computes (the same samples either way; for measuring the overlap)")
    checkpoint_activations: bool = option(
        False, help="recompute each residual block (its exchange included) in the backward pass instead of "
                    "keeping its activations (deep models, less memory); ressage only: refused for sage and "
                    "gcn, which have no residual blocks")
    preloaded_layers: Optional[int] = option(
        None, ge=1, metavar="K", on_resume="may_change", resume_shape=True,
        help="flx: the first K layers run on the server's preload (intra-server exchange only), the rest "
             "with the world exchange (default: the shard set's --hops, at most --layers)")
    memory_per_gpu: Optional[str] = option(
        None, parse=_size_text, metavar="SIZE",
        help="GPU memory budget per rank, e.g. 40GiB; --mode auto picks among the options that fit")
    auto_rule: str = option(
        "time", choices=("time", "memory"), fingerprint=False,
        help="--mode auto: time = the option of the shortest predicted epoch (the links and the compute rate "
             "measured at start-up); memory = GraNNDis' order (paper §5.1): the deepest preload that fits, then "
             "the sampled preload, then the fewest co-batches")
    auto_modes: str = option(
        "any", choices=("any", "exact"), fingerprint=False,
        help="--mode auto: any = the sampled modes (eas, cob) too; exact = only the exact full-graph modes (fb, flx)")
    # Communication hidden behind computation (engine/exchange.py, cluster/gradsync.py): only the order of
    # floating-point sums changes, so a resumed run may switch it.
    no_link_check: bool = option(False, on_resume="may_change",
                                 help="skip the start-up ping-pong that measures the inter- and intra-server links "
                                      "(a few MiB, under a second on a fast network; summary.json's links and the "
                                      "start-up line say whether GraNNDis' modes can pay on them)")
    no_overlap: bool = option(False, on_resume="may_change",
                              help="wait for each layer's whole halo before computing and reduce the gradients "
                                   "after the whole backward (the order before overlap existed, for "
                                   "comparison); by default a layer aggregates the edges of the rows it holds "
                                   "while its halo travels, in both passes, and gradient buckets are reduced "
                                   "during the backward")
    # Server-view halos move between the ranks of one server (shared memory, NVLink) in a fraction of
    # the layer's compute, so hiding them saves little, while the split own/halo products and the
    # polling cost every layer: measured 1.0-1.6x slower for eas and 1.65x for a 56-layer cob model
    # (docs/performance/overlap.md).  So by default only the exchanges that cross servers overlap.
    overlap_halos: str = option("world", choices=tuple(OVERLAP_HALOS), on_resume="may_change",
                                help="which halo exchanges a layer computes behind: 'world' (default) the "
                                     "ones that cross servers (fb; flx's world layers when k < L; "
                                     "evaluation), 'all' also the intra-server ones of flx, eas and cob; "
                                     "--no-overlap none")
    halo_dtype: str = option("float32", choices=HALO_DTYPES,
                             help="dtype training halo rows and their gradients travel in; bfloat16/float16 "
                                  "halve the halo bytes and are widened on arrival, but the run is then not "
                                  "exact (summary.json says so; its checkpoints resume only on the same "
                                  "shape); evaluation always exchanges float32")
    halo_route: str = option("per-server", choices=HALO_ROUTES, on_resume="may_change",
                             help="how halo rows cross between servers (fb, flx's world layers when k < L, "
                                  "evaluation): 'per-server' (default) sends each row a server reads once "
                                  "across the inter-server link, to one of its ranks that reads it, which "
                                  "shares it with the others over the intra-server link (gradients summed "
                                  "there and sent back once); 'direct' sends it once to every rank that "
                                  "reads it; both are exact")
    # Kept on resume: a checkpoint's trajectory and its summary's exactness are those of one precision.
    precision: str = option("fp32", choices=PRECISIONS,
                            help="the dtype the layers compute in: fp32, or bf16 (torch.autocast on the run's "
                                 "device: activations and halo rows at half width, parameters, gradients and "
                                 "optimizer state in float32, the loss in float32); a bf16 run is not exact "
                                 "(summary.json says so; its checkpoints resume only on the same shape), and "
                                 "evaluation computes in bf16 too")
    # Force the rank-0 bar on (mpirun pipes output, so no terminal is seen).
    progress: bool = option(False, on_resume="may_change",
                            help="draw rank 0's progress bar (epochs, loss, ETA) even when stderr is not a "
                                 "terminal, as under mpirun/srun, which pipe the ranks' output")

    def __post_init__(self):
        # Like torchtitan's ParallelDims: a config that exists is a valid one, however it was made.
        validate(self)
        if self.weight_decay_on != "all" and self.weight_decay == 0.0:
            raise ConfigError(f"--weight-decay-on {self.weight_decay_on} says which parameters --weight-decay "
                              f"applies to, but --weight-decay is 0: give --weight-decay (e.g. 5e-4) or leave "
                              f"--weight-decay-on out")
        # What a mode needs of the other options: its registry entry's `needs`, or the check_options
        # of a mode class registered in code (read from the loaded class only: no engine import here).
        entry = registry.MODES.entry(self.mode)
        check = entry.get("check_options")
        problem = registry.mode_problem(self.mode, self) or (check(self) if check is not None else None)
        if problem:
            raise ConfigError(problem)
        if not self.linear_layers:
            self.linear_layers = None
        problem = registry.linear_head_problem(self.model, self.layers, self.linear_layers)
        if problem:
            raise ConfigError(problem)
        if self.checkpoint_activations and not registry.checkpointable(self.model):
            able = [name for name in registry.MODELS if registry.checkpointable(name)]
            raise ConfigError(f"--checkpoint-activations recomputes residual blocks, which only "
                              f"{', '.join(able)} has; model {self.model!r} would ignore it: "
                              f"leave it out or use --model {able[0] if able else 'ressage'}")
        try:
            registry.model_options(self.model, self.model_option)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        problem = schedule_problem(self)
        if problem:
            raise ConfigError(problem)
        if self.precision == "bf16" and self.halo_dtype == "float16":
            raise ConfigError("--precision bf16 computes the halo rows in bfloat16, and --halo-dtype float16 would "
                              "round them again to float16 (another format, with a narrower range): leave "
                              "--halo-dtype out (bf16 halos already travel at half width)")
        if self.eval_only and not self.init_from:
            raise ConfigError("--eval-only evaluates a saved model: give it with --init-from RUN_OR_FILE")
        if self.eval_only and self.resume:
            raise ConfigError("--eval-only trains nothing, so there is nothing to --resume: leave one of them out")
        for flag, given in (("--checkpoint-every", self.checkpoint_every > 0), ("--checkpoint-initial", self.checkpoint_initial)):
            if given and not self.out:
                raise ConfigError(f"{flag} needs a run directory to write checkpoints into: add --out RUN_DIR")
        if self.resume and (not self.out or os.path.realpath(self.out) != os.path.realpath(self.resume)):
            raise ConfigError(f"--resume {self.resume} continues in that run directory, but --out is {self.out!r}; "
                              f"leave --out out or set it to {self.resume}")
        if self.resume and self.overwrite_run:
            raise ConfigError("--overwrite-run starts a new run in place of the old one and --resume continues "
                              "the old one: give one of them")

    @property
    def conv_layers(self) -> int:
        """The model's message-passing layers: the hops its training and evaluation views span."""
        return self.layers - (self.linear_layers or 0)

    @property
    def memory_per_gpu_bytes(self) -> Optional[int]:
        return None if self.memory_per_gpu is None else parse_size(self.memory_per_gpu)


# ---------------------------------------------------------------------------------------------
# Resolved config of a run


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


__all__ = ["ConfigError", "HelpFormatter", "TrainConfig", "allowed_choices", "DEVICE_NAMES", "TRANSPORT_NAMES",
           "WEIGHT_DECAY_ON", "option", "specs", "defaults", "validate", "build_parser",
           "add_options", "read_options", "missing_required", "resume_rule", "parse_args_with_config",
           "load_config_file", "resolved_config", "write_resolved_config", "load_resolved_config", "CONFIG_FILE_NAME"]
