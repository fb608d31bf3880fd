"""The options of every `granndis preprocess` command, declared once (granndis_hpc/options/ derives
their parsers, ``--config FILE.toml`` and ``--help``).

A command's options class is composed of the groups it takes, by inheritance: build = source + layout
+ EAS + its own + the estimate (for ``--hops auto``); plan = source + layout + EAS + its own + the
estimate.  The estimate's model options are granndis-train's own declarations (:func:`reuse` of
TrainConfig's fields): ``--model --hidden --dropout --norm --checkpoint-activations --memory-per-gpu
--device`` mean and check the same thing in both commands.  Options that mean something else get
another name: the EAS fanout is ``--eas-fanout`` (``--fanout`` is granndis-train's sampler fanout;
preprocess still accepts ``--fanout`` for one release, with a warning), the co-batch sampler fanout
a plan estimates is ``--cob-fanout`` (granndis-train's ``--fanout``, reused).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options import Options, option, reuse
from granndis_hpc.units import parse_rate

from granndis_hpc.preprocess.build.halo import EAS_SELECT_RULES
from granndis_hpc.preprocess.partition.twolevel import PARTITIONERS
from granndis_hpc.preprocess.partition.row_blocks import DEFAULT_BLOCK_ROWS
from granndis_hpc.preprocess.sources import SourceOptions

PRELOADS = ("full", "eas")
# The release in which the old spelling of a renamed option stops being accepted.
_OLD_SPELLING_ENDS = "the next release"


def hops_text(text: str) -> str:
    """--hops: a number of hops, or `auto` (the largest k that fits --memory-per-gpu); kept as written
    (:func:`hops_value` converts).  Its range (1 <= k <= --layers) is the build's own check, said once
    by rank 0 with the other build problems."""
    if text != "auto":
        try:
            int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--hops takes a number of hops or 'auto', got {text!r}") from None
    return text


hops_text.__name__ = "number of hops or 'auto'"


def rate_text(text: str) -> str:
    """A link rate as written ('10gbit'), checked with units.parse_rate and kept as written."""
    parse_rate(text)
    return text


rate_text.__name__ = "rate"


def hops_value(text: Optional[str]):
    """The --hops text as the build takes it: None, "auto" or an int."""
    return text if text in (None, "auto") else int(hops_text(text))


def build_config(args, command: str):
    """The BuildConfig that BuildOptions `args` describe (`granndis preprocess build` and the Python API)."""
    from granndis_hpc.preprocess.build.pipeline import BuildConfig

    return BuildConfig(out=args.out, servers=args.servers, gpus_per_server=args.gpus_per_server, layers=args.layers,
                       preload=args.preload, hops=hops_value(args.hops), fanout=args.eas_fanout,
                       select=args.eas_select, partitioner=args.partitioner, seed=args.seed, overwrite=args.overwrite,
                       command=command, inductive=args.inductive, row_block_rows=args.row_block_rows)


def _positive_counts(text: str) -> Optional[str]:
    """--cob-batches: comma-separated positive counts."""
    try:
        counts = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        return f"must be comma-separated counts such as 2,4,8, got {text!r}"
    if not counts or any(b < 1 for b in counts):
        return f"must be positive counts, got {text!r}"
    return None


@dataclass
class LayoutOptions(Options):
    OPTIONS_GROUP = "layout"
    servers: int = option(None, required=True, ge=1, help="number of servers S (required)")
    gpus_per_server: int = option(None, required=True, ge=1, help="GPUs (ranks) per server G (required)")
    layers: int = reuse(TrainConfig, "layers", default=None, required=True,
                        help="message-passing layers L the shards are built for (granndis-train's --layers, "
                             "less its --linear-layers; required)")
    partitioner: str = option("parmetis", choices=PARTITIONERS, help="server-level partitioner")
    row_block_rows: int = option(DEFAULT_BLOCK_ROWS, ge=0, metavar="ROWS",
                                 help="order each GPU's rows (inside a hop) by METIS blocks of about ROWS rows of its "
                                      "subgraph, so that sparse products read nearby rows (faster epochs on CPU ranks: "
                                      "docs/performance/single-rank.md); 0: by global id. A plan takes the "
                                      "build's: co-batches are drawn in the files' row order")


@dataclass
class EasOptions(Options):
    OPTIONS_GROUP = "Expansion-aware Sampling (EAS)"
    eas_fanout: int = option(15, ge=1, deprecated={"--fanout": _OLD_SPELLING_ENDS},
                             help="EAS fanout f: max external in-neighbours added per frontier vertex (the "
                                  "paper's 15; not granndis-train's --fanout, the co-batch sampler's)")
    eas_select: str = option("degree", choices=EAS_SELECT_RULES,
                             help="prefer candidates with many unselected neighbours (degree, the paper's rule) "
                                  "or uniform")


@dataclass
class EstimateOptions(Options):
    """What the memory model's estimate is for: granndis-train's declarations of the same options."""
    OPTIONS_GROUP = "model and memory budget (the estimate)"
    model: str = reuse(TrainConfig, "model", help="model the estimate is for")
    model_option: Optional[List[str]] = reuse(TrainConfig, "model_option")
    hidden: int = reuse(TrainConfig, "hidden")
    dropout: float = reuse(TrainConfig, "dropout", help="dropout of training (as granndis-train)")
    norm: bool = reuse(TrainConfig, "norm")
    linear_layers: Optional[int] = reuse(TrainConfig, "linear_layers",
                                         help="per-vertex Linear layers after the --layers aggregating ones "
                                              "(granndis-train's --linear-layers; they need no hop of the set)")
    checkpoint_activations: bool = reuse(TrainConfig, "checkpoint_activations",
                                         help="ressage: recompute residual blocks in the backward pass")
    precision: str = reuse(TrainConfig, "precision",
                           help="the dtype training computes in (granndis-train's --precision): bf16 estimates "
                                "activations, halo buffers and row gradients at 2 bytes a number")
    halo_route: str = reuse(TrainConfig, "halo_route",
                            help="how training's world halo crosses servers (granndis-train's --halo-route): "
                                 "the inter- and intra-server bytes the epoch-time model prices")
    memory_per_gpu: Optional[str] = reuse(TrainConfig, "memory_per_gpu",
                                          help="GPU memory budget per rank, e.g. 40GiB: plan recommends the "
                                               "build that fits; build --hops auto preloads as deep as fits")
    device: str = reuse(TrainConfig, "device",
                        help="the device training runs on (dropout masks are bool on cuda, float on cpu; on cpu "
                             "the estimate is of a rank's resident memory, the process included); auto = cuda, "
                             "the GPUs a plan is for")

    @property
    def estimate_device(self) -> str:
        return "cuda" if self.device == "auto" else self.device


@dataclass
class BuildOptions(EstimateOptions, EasOptions, LayoutOptions, SourceOptions):
    """`granndis preprocess build`."""
    preload: str = option("full", choices=PRELOADS, group="preloading",
                          help="full: k-hop preloading (FLX); eas: Expansion-aware Sampling")
    hops: Optional[str] = option(None, parse=hops_text, metavar="K|auto", group="preloading",
                                 help="preloaded hops (default: --layers for full, 1 for eas); auto: the largest "
                                      "k <= --layers whose estimated memory fits --memory-per-gpu (see `granndis "
                                      "preprocess plan`)")
    inductive: bool = reuse(TrainConfig, "inductive", group="preloading",
                            help="also write what inductive training needs (granndis-train --inductive): every "
                                 "row's in-degree and hop within the train-induced graph and the split of every "
                                 "world-view source (docs/inductive.md); the partition, preloads and world view "
                                 "stay those of the full graph, which validation and test run on")
    whole_graph: bool = option(False, group="preloading",
                               help="load the whole graph on every rank and build from it (the simpler "
                                    "whole-graph build, for comparisons): by default chunked and synthetic sources are "
                                    "read and built as 1/P slices per rank")
    out: str = option(None, required=True, group="output",
                      help="output directory (required; must not exist or be empty, unless --overwrite)")
    overwrite: bool = option(False, group="output",
                             help="replace the shard set --out holds (nothing else: any other file there is refused); "
                                  "the old set is kept until the new one is complete")
    progress: bool = reuse(TrainConfig, "progress", group="output",
                           help="draw rank 0's progress bar over the phases even when stderr is not a terminal "
                                "(mpirun pipes the ranks' output)")
    log_level: str = reuse(TrainConfig, "log_level", group="output",
                           help="the least severe log lines written to stderr (info: notices such as removed "
                                "temporaries of an interrupted build); rank 0 only unless --log-all-ranks")
    log_all_ranks: bool = reuse(TrainConfig, "log_all_ranks", group="output")


@dataclass
class PlanOptions(EstimateOptions, EasOptions, LayoutOptions, SourceOptions):
    """`granndis preprocess plan`."""
    inductive: bool = reuse(TrainConfig, "inductive", group="layout",
                            help="the build is for inductive training (build --inductive): read from the build "
                                 "presets; the estimates are those of the full graph's views, which bound the "
                                 "train-induced training views from above")
    eas_hops: int = option(1, ge=1, group="EAS and co-batches", help="EAS hops h (the paper's 1)")
    no_eas: bool = option(False, group="EAS and co-batches", help="plan full preloads only")
    hops: Optional[int] = option(None, ge=1, metavar="H", group="layout",
                                 help="estimate the one full build of H hops (fb, flx k <= H, cob when H >= L) and "
                                      "the EAS build: what --mode auto chooses among on those sets (default: one "
                                      "build per k)")
    cob_batches: str = option("2,4,8,16", check=_positive_counts, group="EAS and co-batches",
                              help="co-batch counts per epoch to estimate")
    cob_fanout: int = reuse(TrainConfig, "fanout", group="EAS and co-batches",
                            help="co-batch sampler fanout the estimate is for (granndis-train's --fanout; "
                                 "-1 = all in-neighbours)")
    inter_rate: Optional[str] = option(None, parse=rate_text, metavar="RATE", group="predicted epoch time",
                                       help="the link between servers in bits/s, e.g. 10gbit: adds each option's "
                                            "predicted epoch seconds (the compute rate measured on this machine) and "
                                            "recommends the fastest that fits, as --mode auto's --auto-rule time does")
    inter_both_rate: Optional[str] = option(
        None, parse=rate_text, metavar="RATE", group="predicted epoch time",
        help="the link between servers in bits/s each way while both servers send at once, as the halo "
             "exchanges and the gradient all-reduce do, e.g. 5gbit where both directions share one budget "
             "(default: --inter-rate, a full-duplex link; --mode auto measures it at start-up)")
    intra_rate: Optional[str] = option(None, parse=rate_text, metavar="RATE", group="predicted epoch time",
                                       help="the links inside a server in bits/s, e.g. 100gbit (default: --inter-rate)")
    cobatch_setup: Optional[str] = option(
        None, metavar="SECONDS,SECONDS_PER_ROW", group="predicted epoch time",
        help="what setting up a co-batch costs, fixed seconds and seconds per row of its dependency graph, e.g. "
             "0.002,4e-6 (a run's summary.json plan.auto.cobatch_setup; default: timed on this host on each "
             "server's graph, one server at a time, the slowest server's kept)")
    json: Optional[str] = option(None, metavar="PATH", help="also write the options and the decision as JSON")
    build_ranks: Optional[int] = option(None, metavar="P", group="build memory (the distributed `preprocess build`)",
                                        help="ranks of the build the memory estimate is for (default: this plan's "
                                             "ranks); checked with the other plan options, on every rank")
    memory_per_rank: Optional[str] = reuse(TrainConfig, "memory_per_gpu", group="build memory (the distributed "
                                                                                 "`preprocess build`)",
                                           help="also print the smallest number of build ranks whose estimated "
                                                "peak fits SIZE per rank")


@dataclass
class ChunkOptions(SourceOptions):
    """`granndis preprocess chunk`."""
    out: str = option(None, required=True, group="output", help="output directory (required; must not exist, or be "
                                                                "empty)")
    chunks: int = option(8, ge=1, group="output", help="number of edge chunks and of node chunks")


@dataclass
class ShardSetOptions(Options):
    """`granndis preprocess verify|info`."""
    dir: str = option(None, required=True, positional=True, help="the shard set's directory")


__all__ = ["BuildOptions", "build_config", "ChunkOptions", "EasOptions", "EstimateOptions", "LayoutOptions",
           "PlanOptions", "ShardSetOptions", "SourceOptions", "hops_text", "hops_value"]
