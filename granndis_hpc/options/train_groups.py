"""The option groups of `granndis-train`, one dataclass each; :class:`granndis_hpc.options.train.TrainConfig`
is composed of them (with :class:`granndis_hpc.options.startup.ClusterOptions`) by inheritance, so
``config.hidden`` reads a field of any group, and a function that needs one group can be typed with
that group's class.  A group's ``OPTIONS_GROUP`` is its --help section, its section of
docs/configuration.md and the name of its optional ``[section]`` in ``--config FILE.toml``.

Each field's ``on_resume`` rule says what ``--resume`` does with it: "keep" (default) = a resumed run
must have the same value, and the checkpoint fingerprint holds it (it changes the trajectory);
"may_change" = given again with --resume it wins (nothing the numbers depend on, or checked otherwise:
shards, ranks_per_server, mode and preloaded_layers are the fingerprint's shape, which only the exact
modes may change, see rundir/checkpoint.py); "reset" = not carried over from the run being resumed.
The checks that span groups are TrainConfig's.  Standard library and light modules only: building the
parser loads no torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from granndis_hpc import registry
from granndis_hpc.graph.sampler import SAMPLERS
from granndis_hpc.metric_names import METRICS
from granndis_hpc.units import parse_size

from .declare import Options, option, specs

LOG_LEVELS = ("debug", "info", "warning", "error")  # granndis_hpc/progress.py: setup_logging
# --weight-decay-on: every parameter, or the first layer's only (the model contract's first_layer_prefix,
# nn/contract.py).
WEIGHT_DECAY_ON = ("all", "first")
OPTIMIZER_NAMES = ("adam", "adamw", "sgd")
LR_SCHEDULES = ("constant", "step", "cosine", "plateau")
# --halo-dtype: the wire format of training halo rows (engine/exchange.py); float32 is exact.
HALO_DTYPES = ("float32", "bfloat16", "float16")
# --halo-route: how the world group's halo rows cross servers (engine/halo_route.py HALO_ROUTES).
HALO_ROUTES = ("per-server", "direct")
# --halo-payload: what the world group's halo sends between servers (engine/partial.py).
HALO_PAYLOADS = ("rows", "partial", "smaller")
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
    rules = {s.name: s for s in specs(cls)
             if s.meta.get("on_resume") == "may_change" and s.name not in ("resume", "out")}
    free = [s.flag for s in rules.values() if not s.meta.get("resume_shape")]
    shape = [s.flag for s in rules.values() if s.meta.get("resume_shape")]
    return ("continue RUN_DIR from its newest complete checkpoint (from epoch 0 when it has none yet) with the "
            "options in RUN_DIR/config.json (nothing else is needed, but for a model that imports code, as pyg "
            "does, its module=... and factory=... model options as config.json records them: a file never "
            "chooses the code that runs); options given again may differ only for "
            f"{', '.join(free)}, and {' / '.join(shape)} when they name the same shard set and layout, or, in the "
            f"exact modes fb and flx, the same dataset built for another layout")


def _fanout_problem(value: int) -> Optional[str]:
    if value == -1 or value >= 1:
        return None
    return f"must be a positive number of neighbours or -1 for all, got {value}"


@dataclass
class DataOptions(Options):
    """The shard set a run reads and how it is evaluated."""
    OPTIONS_GROUP = "data and evaluation"
    # required=True, not a missing default: the groups compose by inheritance, and --resume takes it from
    # RUN_DIR/config.json.
    shards: str = option(None, required=True, on_resume="may_change", resume_shape=True,
                         help="shard directory written by `granndis preprocess build` (required, except with "
                              "--resume)")
    inductive: bool = option(
        False,
        help="inductive training (the GraNNDis artifact's, PipeGCN's and BNS-GCN's protocol): train on the subgraph "
             "induced by the training vertices, measure validation accuracy on the graph induced by the training "
             "and validation vertices and test accuracy on the full graph; needs a shard set built with `granndis "
             "preprocess build ... --inductive` (docs/inductive.md)")
    skip_checksums: bool = option(False, on_resume="may_change", help="do not verify shard sha256 at start-up")
    verify_content: bool = option(False, on_resume="may_change",
                                  help="before training, recompute the dataset content digest from the rows the "
                                       "ranks read and refuse a set whose files were edited after the build "
                                       "(dataset.content_sha256; the dataset's bytes travel to rank 0 once)")
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


@dataclass
class ModelOptions(Options):
    """The model's architecture."""
    OPTIONS_GROUP = "model"
    model: str = option("sage", choices=_model_names, help="GNN architecture")
    # None, not []: checkpoints written before the option existed hold no value for it (same fingerprint).
    model_option: Optional[List[str]] = option(
        None, append=True, metavar="NAME=VALUE",
        help="an extra constructor option of the model, as its registry entry declares them (repeat for several), "
             "e.g. gat: heads, out_heads, concat, attn_dropout, negative_slope; gin: eps (docs/models.md)")
    layers: int = option(3, ge=1, help="layers of the model: the message-passing ones, plus --linear-layers")
    # None, not 0: checkpoints written before the option existed hold no value for it (same fingerprint);
    # __post_init__ turns 0 into None.
    linear_layers: Optional[int] = option(
        None, ge=0, metavar="N",
        help="the last N of --layers are per-vertex Linear layers (no aggregation; every built-in model), so the "
             "model aggregates over --layers - N hops and trains on a set built with that many: the GraNNDis "
             "artifact's 3-layer GraphSAGE is --layers 4 --linear-layers 1 on a 3-hop set (default: none)")
    hidden: int = option(64, ge=1, help="hidden width")
    dropout: float = option(0.5, ge=0.0, lt=1.0, help="dropout probability")
    input_dropout: float = option(0.0, ge=0.0, lt=1.0,
                                  help="dropout probability of the input features (Kipf & Welling's GCN: 0.5); "
                                       "keyed by vertex id like --dropout, so cached halo rows need no exchange")
    norm: bool = option(False, help="LayerNorm between sage/gcn layers")
    checkpoint_activations: bool = option(
        False, help="recompute each residual block (its exchange included) in the backward pass instead of "
                    "keeping its activations (deep models, less memory); ressage only: refused for sage and "
                    "gcn, which have no residual blocks")


@dataclass
class OptimOptions(Options):
    """The optimizer, its step and the run's length (engine/optim.py)."""
    OPTIONS_GROUP = "optimisation"
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
    optimizer: str = option("adam", choices=OPTIMIZER_NAMES, fingerprint=False,
                            help="adam, adamw (decoupled weight decay) or sgd (--momentum, --nesterov)")
    momentum: float = option(0.0, ge=0.0, lt=1.0, fingerprint=False, help="sgd: momentum")
    nesterov: bool = option(False, fingerprint=False,
                            help="sgd: Nesterov momentum (needs --momentum > 0)")
    clip_grad_norm: float = option(0.0, ge=0.0, fingerprint=False,
                                   help="clip the gradient to this global L2 norm (0 = off); the norm is the whole "
                                        "graph's, as one process computes it")
    seed: int = option(0, ge=0, help="seed for parameters and dropout")


@dataclass
class ScheduleOptions(Options):
    """The learning rate per epoch and early stopping (engine/optim.py).  Apart from --patience, not in the
    checkpoint fingerprint: the optimizer's saved state holds them and refuses other values on resume."""
    OPTIONS_GROUP = "schedule"
    lr_schedule: str = option("constant", choices=LR_SCHEDULES, fingerprint=False,
                              help="learning rate per epoch after --warmup-epochs: constant; step (x --gamma every "
                                   "--step-size epochs); cosine (down to --min-lr over --lr-decay-epochs); plateau "
                                   "(x --gamma after --plateau-patience evaluations without a better validation "
                                   "metric, not below --min-lr)")
    warmup_epochs: int = option(0, ge=0, fingerprint=False,
                                help="linear warm-up: epoch e < N runs at --lr * (e + 1) / N")
    step_size: int = option(30, ge=1, fingerprint=False, help="step: epochs per decay")
    gamma: float = option(0.1, gt=0.0, lt=1.0, fingerprint=False,
                          help="step and plateau: the factor of each decay")
    min_lr: float = option(0.0, ge=0.0, fingerprint=False,
                           help="cosine: the final learning rate; plateau: the lowest")
    lr_decay_epochs: int = option(0, ge=0, fingerprint=False,
                                  help="cosine: the epoch the decay ends at (0 = --epochs of the run's start; kept "
                                       "when a resumed run changes --epochs)")
    plateau_patience: int = option(10, ge=1, fingerprint=False,
                                   help="plateau: evaluations without a better validation metric before a decay")
    patience: int = option(0, ge=0, on_resume="may_change",
                           help="early stopping: end the run after N evaluations (--eval-every) without a better "
                                "validation metric, with the best model in best-model.pt (0 = off)")


@dataclass
class ExchangeOptions(Options):
    """The GraNNDis method and how its rows and gradients travel."""
    OPTIONS_GROUP = "mode and exchange"
    mode: str = option("flx", choices=_mode_names, on_resume="may_change", resume_shape=True,
                       help="fb: full-batch baseline (1-hop halo every layer, world-wide); flx: flexible "
                            "preloading (full k-hop preload, only gradients cross servers); eas: "
                            "expansion-aware sampled preload; cob: cooperative batching (a server's GPUs share "
                            "one co-batch); mb: per-GPU mini-batches (the baseline cob is measured against); "
                            "auto: GraNNDis' automatic choice for --memory-per-gpu")
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
    no_link_check: bool = option(False, on_resume="may_change",
                                 help="skip the start-up ping-pong that measures the inter- and intra-server links "
                                      "(a few MiB, under a second on a fast network; summary.json's links and the "
                                      "start-up line say whether GraNNDis' modes can pay on them)")
    # Communication hidden behind computation (engine/exchange.py, cluster/gradsync.py): only the order of
    # floating-point sums changes, so a resumed run may switch it.
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
    halo_payload: str = option("rows", choices=HALO_PAYLOADS, on_resume="may_change",
                               help="what fb (and flx's world layers when k < L) sends between servers for "
                                    "layers whose aggregation is a weighted sum (sage, gcn, gin, sage-sum, "
                                    "rgcn): 'rows' (default) the halo rows; 'partial' for each remote "
                                    "destination row the sum of the sending rank's rows' contributions (rgcn: "
                                    "summed over relations and projected, output wide; gradients return the "
                                    "same way); 'smaller' whichever of the two is fewer bytes, per pair of "
                                    "servers and layer, from exact counts; all exact, overlapped or with "
                                    "--no-overlap; 'partial' and 'smaller' need --mode fb or flx with "
                                    "--preloaded-layers below --layers, --precision fp32 and no input or "
                                    "attention dropout; with --inductive they travel on the train-induced "
                                    "graph training runs on; --mode auto sets it to the payload of the option "
                                    "it chooses (fb's and flx's partial payloads are among its options; rows "
                                    "otherwise)")
    # Kept on resume: a checkpoint's trajectory and its summary's exactness are those of one precision.
    precision: str = option("fp32", choices=PRECISIONS,
                            help="the dtype the layers compute in: fp32, or bf16 (torch.autocast on the run's "
                                 "device: activations and halo rows at half width, parameters, gradients and "
                                 "optimizer state in float32, the loss in float32); a bf16 run is not exact "
                                 "(summary.json says so; its checkpoints resume only on the same shape), and "
                                 "evaluation computes in bf16 too")


@dataclass
class RunDirOptions(Options):
    """Where a run writes, what it continues or starts from, and its checkpoints."""
    OPTIONS_GROUP = "run directory"
    out: Optional[str] = option(None, on_resume="may_change",
                                help="run directory (config.json, metrics.jsonl, summary.json, checkpoints); "
                                     "one that already holds a run is refused: continue it with --resume, "
                                     "or give --overwrite-run")
    resume: Optional[str] = option(None, metavar="RUN_DIR", on_resume="may_change", help=_resume_help)
    # Warm start (engine/model_source.py reads the model): parameters only, so the run is a new one.
    init_from: Optional[str] = option(
        None, metavar="RUN_OR_FILE",
        help="start from a trained model's parameters (a run directory, its best-model.pt or a checkpoint directory) "
             "with a fresh optimizer, in a new run (--out), on any shape and mode; the model options not given are "
             "the saved model's, and those given must match it")
    eval_only: bool = option(False, fingerprint=False,
                             help="train nothing: evaluate the --init-from model on --shards and write summary.json "
                                  "(with --out) and the accuracies")
    overwrite_run: bool = option(False, on_resume="reset",
                                 help="replace the granndis-train run that --out already holds (its files only; it is "
                                      "deleted only after the new run has written its config.json)")
    # Checkpoints (rundir/checkpoint.py): every N epochs (0 = only when SIGUSR1/SIGTERM asks to stop).
    checkpoint_every: int = option(0, ge=0, metavar="N", on_resume="may_change",
                                   help="write a checkpoint into RUN_DIR/checkpoints/ every N epochs (the newest "
                                        "2 complete ones are kept); 0 = only when SIGUSR1 or SIGTERM asks the run "
                                        "to stop, which it does after the current epoch, with a checkpoint, "
                                        "exiting 0")
    checkpoint_initial: bool = option(False, on_resume="may_change",
                                      help="also write the initial parameters, before the first step, as the "
                                           "checkpoint of epoch 0 (RUN_DIR/checkpoints/epoch-000000, never pruned): "
                                           "--init-from, --resume and granndis predict take it as any checkpoint")


@dataclass
class LoggingOptions(Options):
    """What a run prints."""
    OPTIONS_GROUP = "logging and output"
    quiet: bool = option(False, on_resume="may_change",
                         help="no banner, per-epoch lines or progress bar on stdout (the final result line stays)")
    log_level: str = option("info", choices=LOG_LEVELS, on_resume="may_change",
                            help="the least severe log lines written to stderr (info: notices such as a resumed "
                                 "checkpoint or removed temporary files; --quiet does not hide them); rank 0 only "
                                 "unless --log-all-ranks: the other ranks log warnings and errors")
    log_all_ranks: bool = option(False, on_resume="may_change",
                                 help="every rank logs at --log-level, each line labelled [rank R] (default: ranks "
                                      "other than 0 log only warnings and errors)")
    # Force the rank-0 bar on (mpirun pipes output, so no terminal is seen).
    progress: bool = option(False, on_resume="may_change",
                            help="draw rank 0's progress bar (epochs, loss, ETA) even when stderr is not a "
                                 "terminal, as under mpirun/srun, which pipe the ranks' output")
