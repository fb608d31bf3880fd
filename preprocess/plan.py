"""`python -m preprocess plan`: what each build would cost per GPU, without writing a shard.

It runs the build's own steps -- the same partitioners (preprocess/partition.py), the same halo
expansion and owner assignment (preprocess/build.py `build_server`, with the feature columns left
out) -- for a full preload of every k = 1..L and for EAS, counts each rank's rows per layer, and
feeds them to granndis_hpc.memory_model.  k = 0 (fb) reads only the world view, which every build
shares.  Collective over the communicator like the build (server s is handled by rank s % P).

`auto_hops` is what `build --hops auto --memory-per-gpu X` calls: the largest k whose estimate fits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from granndis_hpc import memory_model as mm
from granndis_hpc.cluster.group import as_group
from granndis_hpc.units import format_size

from .build import BuildConfig, build_server, validate_config
from .partition import partition_gpus, partition_servers


class PlanError(ValueError):
    """A plan or `--hops auto` request that cannot be served; the message says what to build."""


@dataclass
class PlanConfig:
    servers: int
    gpus_per_server: int
    layers: int
    model: str = "sage"
    hidden: int = 64
    dropout: float = 0.5
    norm: bool = False
    checkpoint_activations: bool = False
    budget: Optional[int] = None  # bytes per GPU
    device: str = "cuda"  # dropout masks are bool on CUDA, float on CPU
    partitioner: str = "parmetis"
    seed: int = 0
    ks: Optional[Sequence[int]] = None  # default 0..L
    eas_hops: int = 1
    fanout: int = 15
    eas_select: str = "degree"
    eas: bool = True
    cob_batches: Sequence[int] = (2, 4, 8, 16)
    cob_fanout: int = -1
    cob_sampler: str = "sage"


def fail(group, command: str, exc: BaseException) -> int:
    """A preprocess command's failure: print it and return exit status 1.  A collective error was raised
    by every rank with one message naming every failing rank, so rank 0 prints it and all exit 1
    together; anything else was seen by this rank only (it prints it),
    and its peers may be blocked in a collective: end the whole job."""
    import sys
    import time

    from granndis_hpc.cluster import ClusterError

    collective = isinstance(exc, ClusterError) and exc.collective
    if group.rank == 0 or not collective:  # a collective error holds every rank's message: said once
        print(f"preprocess {command}: error (rank {group.rank}): {exc}", file=sys.stderr, flush=True)
    if group.size > 1 and not collective:
        time.sleep(0.5)  # let the other ranks print their own message first
        group.abort(1)
    return 1


def _everywhere(group, exc: BaseException):
    """Raise `exc`, which every rank raises identically, as one collective error (the CLI then exits 1
    on every rank, no MPI_Abort); on one rank, `exc` itself."""
    with group.errors("", catch=(type(exc),)):
        raise exc


def _counting_graph(graph):
    """The graph with zero feature columns: build_server then gathers no feature rows (counts only)."""
    return dataclasses.replace(graph, features=np.zeros((graph.num_vertices, 0), dtype=np.float32))


def _partition(group, graph, cfg: PlanConfig):
    """The build's two-level partition (run_build's first half): server and GPU of every vertex."""
    sp = partition_servers(group, graph, cfg.servers, cfg.partitioner, cfg.seed)
    mine = list(range(group.rank, cfg.servers, group.size))
    gpu_local = np.full(graph.num_vertices, -1, dtype=np.int32)
    with group.errors("partitioning servers over GPUs"):
        for s in mine:
            inner = np.flatnonzero(sp.parts == s)
            gpu_local[inner], _ = partition_gpus(graph, inner, cfg.gpus_per_server)
    return sp, mine, group.allreduce_max(gpu_local)


def _server_arrays(graph, s, server_of, gpu_of, bcfg: BuildConfig) -> mm.ServerArrays:
    arrays, _ = build_server(graph, s, server_of, gpu_of, bcfg)
    return mm.server_arrays_from_build(arrays, s)


def plan_options(group, graph, cfg: PlanConfig) -> Dict[str, object]:
    """Collective: every option's estimate.  Returns (on every rank) {"options": [Option], "model":
    ModelSpec, "partition": manifest entry}.  `group`: a cluster Group or an mpi4py communicator."""
    group = as_group(group)
    bcfg = BuildConfig(out="", servers=cfg.servers, gpus_per_server=cfg.gpus_per_server, layers=cfg.layers,
                       partitioner=cfg.partitioner, seed=cfg.seed, fanout=cfg.fanout, select=cfg.eas_select)
    with group.errors("checking the plan options", catch=(ValueError, mm.MemoryModelError)):
        validate_config(bcfg, graph.num_vertices)
        m = mm.ModelSpec(cfg.model, graph.num_features, cfg.hidden, int(graph.num_classes), cfg.layers,
                         cfg.dropout, cfg.norm, cfg.checkpoint_activations)
        ks = list(range(0, cfg.layers + 1)) if cfg.ks is None else sorted(set(int(k) for k in cfg.ks))
        bad = [k for k in ks if not 0 <= k <= cfg.layers]
        if bad:
            raise PlanError(f"k = {bad[0]} preloaded hops is outside 0..{cfg.layers} for a {cfg.layers}-layer model")
    sp, mine, gpu_of = _partition(group, graph, cfg)
    counting = _counting_graph(graph)
    S, G, L = cfg.servers, cfg.gpus_per_server, cfg.layers
    rows: Dict[tuple, List[mm.RankRows]] = {}
    with group.errors("expanding the halos"):
        # One build per preloaded depth: owners and GPU row balance depend on the preload.
        full: Dict[int, List[mm.ServerArrays]] = {}
        last: Dict[int, tuple] = {}  # server -> (depth built, its arrays)
        for k in [k for k in ks if k > 0]:
            full[k] = []
            for s in mine:
                depth, arrays = last.get(s, (0, None))
                # Once the expansion stops growing (the BFS frontier emptied before `depth` hops), a
                # deeper preload is the same build: deep models do not pay L full expansions.
                if arrays is None or int(arrays.hop.max(initial=0)) >= depth:
                    arrays = _server_arrays(counting, s, sp.parts, gpu_of,
                                            dataclasses.replace(bcfg, preload="full", hops=k))
                last[s] = (k, arrays)
                full[k].append(arrays)
        any_arrays = next(iter(full.values())) if full else [
            _server_arrays(counting, s, sp.parts, gpu_of, dataclasses.replace(bcfg, preload="full", hops=1)) for s in mine]
        eas = ([_server_arrays(counting, s, sp.parts, gpu_of, dataclasses.replace(bcfg, preload="eas", hops=cfg.eas_hops))
                for s in mine] if cfg.eas else [])
        reads = mm.world_reads(any_arrays, S * G)
    sent = group.allreduce_sum(reads)  # every rank's world send list: what all readers ask of it
    # A server cannot make more co-batches than it has training vertices (the sampler refuses):
    # every rank must skip the same counts, so take the smallest server's over all ranks.
    mine_train = [int(np.count_nonzero(a.graph["train"] & (a.hop == 0))) for a in eas]
    min_train = int(group.allreduce_min(np.array([min(mine_train, default=1 << 62)], dtype=np.int64))[0])
    with group.errors("counting rows"):
        for k in ks:
            rows[("full", k)] = mm.shard_rows(full[k] if k > 0 else any_arrays, L, k, m.features, m.num_classes, sent)
        if cfg.eas:
            rows[("eas", L)] = mm.shard_rows(eas, L, L, m.features, m.num_classes, sent)
            base = mm.shard_rows(eas, L, 0, m.features, m.num_classes, sent)
            for b in [b for b in cfg.cob_batches if int(b) <= min_train]:
                cob = [mm.cobatch_server_arrays(a.graph, a.server, L, int(b), cfg.cob_fanout, cfg.cob_sampler,
                                                cfg.seed) for a in eas]
                rows[("cob", int(b))] = mm.with_cobatch(base, cob)
    # Each server file's rows and their in-edges, for the distributed build's estimate
    # (preprocess/build_memory.py: the writer's block is a 1/P share of them).
    loads = {f"flx k={k}": [_load(a) for a in full[k]] for k in ks if k > 0}
    if cfg.eas:
        loads["eas"] = [_load(a) for a in eas]
    all_loads = group.gather_object(loads)
    gathered = group.gather_object(rows)
    options = None
    if group.rank == 0:
        merged: Dict[tuple, List[mm.RankRows]] = {}
        for part in gathered:
            for key, rr in part.items():
                merged.setdefault(key, []).extend(rr)
        options = []
        for (kind, n), rr in merged.items():
            rr = sorted(rr, key=lambda r: r.rank)
            if kind == "full":
                options.append(mm.make_option("fb" if n == 0 else "flx", rr, m, S, cfg.device))
            elif kind == "eas":
                options.append(mm.make_option("eas", rr, m, S, cfg.device))
            else:
                options.append(mm.make_option("cob", rr, m, S, cfg.device, batches=n))
    options = group.bcast_object(options)
    server_loads = None
    if group.rank == 0:
        server_loads = {}
        for part in all_loads:
            for key, lst in part.items():
                server_loads.setdefault(key, []).extend(lst)
    return {"options": options, "model": m, "partition": sp.manifest_entry(), "server_loads": server_loads}


def _load(a: mm.ServerArrays):
    from .build_memory import ServerLoad

    return ServerLoad(server=int(a.server), rows=int(a.hop.shape[0]), fetched_edges=int(a.graph["in_degree"].sum()))


def build_memory_lines(graph, result, raw_keys: int, ranks: int, partitioner: str, budget: Optional[int]):
    """Rank 0's lines on the distributed build's memory (and its JSON record)."""
    from .build_memory import estimate_build_memory, smallest_fitting_ranks

    lines, record = [], {}
    common = dict(num_vertices=graph.num_vertices, num_edges=graph.num_edges, raw_keys=int(raw_keys),
                  num_features=graph.num_features, partitioner=partitioner)
    for label, loads in (result.get("server_loads") or {}).items():
        est = estimate_build_memory(servers=loads, ranks=ranks, eas=label == "eas", **common)
        rec = est.to_dict()
        rec["inputs"] = {**common, "eas": label == "eas", "servers": [vars(x) for x in loads]}  # for another P
        writers = sorted({s.server % ranks for s in loads})
        others = [b for r, b in enumerate(est.per_rank) if r not in writers]
        text = (f"[plan] build {label}: estimated peak per build rank with P = {ranks}: {format_size(est.peak)} "
                f"(writer ranks {','.join(map(str, writers))})"
                + (f", {format_size(max(others))} on the others" if others else ""))
        if budget is not None:
            fit = smallest_fitting_ranks(budget, servers=loads, eas=label == "eas", **common)
            rec["smallest_ranks_fitting"] = fit
            text += (f"; smallest P fitting --memory-per-rank {format_size(budget)}: {fit}" if fit else
                     f"; no P fits --memory-per-rank {format_size(budget)} (a writer rank holds its server's rows)")
        lines.append(text)
        record[label] = rec
    return lines, record


def describe_build(o: mm.Option, cfg: PlanConfig) -> str:
    base = f"python -m preprocess build ... --servers {cfg.servers} --gpus-per-server {cfg.gpus_per_server} --layers {cfg.layers}"
    if o.mode == "flx":
        return f"{base} --preload full --hops {o.k}   (train --mode flx)"
    if o.mode == "fb":
        return f"{base} --preload full --hops 1   (train --mode fb: the world view only)"
    if o.mode == "eas":
        return f"{base} --preload eas --hops {cfg.eas_hops} --fanout {cfg.fanout}   (train --mode eas)"
    return (f"{base} --preload eas --hops {cfg.eas_hops} --fanout {cfg.fanout}   (train --mode cob "
            f"--batches-per-epoch {o.batches} --fanout {cfg.cob_fanout})")


def format_table(options: Sequence[mm.Option], cfg: PlanConfig, decision: Optional[mm.Decision]) -> str:
    lines = [f"{'option':<16} {'rows held':>10} {'peak/GPU':>11} {'inter-server B/epoch':>21} "
             f"{'(halo + grad)':>24}  fits"]
    for o in sorted(options, key=mm.preference):
        fits = "-" if cfg.budget is None else ("yes" if o.peak <= cfg.budget else "no")
        ib = o.inter_server_bytes
        lines.append(f"{o.label:<16} {o.rows_per_gpu:>10,} {format_size(o.peak):>11} {ib['total']:>21,} "
                     f"{ib['halo']:>12,} + {ib['gradient']:>9,}  {fits}")
    if decision is not None:
        if decision.choice is None:
            lines.append(f"recommendation: none -- {decision.reason}")
        else:
            lines.append(f"recommendation: {decision.choice.label}: {describe_build(decision.choice, cfg)}")
            lines.append(f"  because {decision.reason}")
    return "\n".join(lines)


def auto_hops(group, graph, cfg: PlanConfig) -> mm.Decision:
    """`build --hops auto`: the largest k in 1..L whose estimate fits cfg.budget (collective).

    Raises PlanError (the same on every rank, as a collective ClusterError under mpirun) when there is no budget or when not even k = 1
    fits, naming what to build instead (EAS, or co-batches, with their estimates)."""
    group = as_group(group)
    if cfg.budget is None:
        _everywhere(group, PlanError("--hops auto picks the largest preloaded depth that fits a memory budget: "
                                     "add --memory-per-gpu (e.g. 40GiB), or give --hops K with 1 <= K <= --layers"))
    cfg = dataclasses.replace(cfg, ks=list(range(1, cfg.layers + 1)))
    result = plan_options(group, graph, cfg)
    options = result["options"]
    flx = [o for o in options if o.mode == "flx"]
    decision = mm.choose(flx, cfg.budget)
    if decision.choice is None:
        rest = [o for o in options if o.mode != "flx"]
        others = mm.choose(rest, cfg.budget)
        smallest = min(flx, key=lambda o: o.peak)
        if others.choice is not None:
            what = (f"build {describe_build(others.choice, cfg).split('build ... ', 1)[-1]} "
                    f"(estimated {format_size(others.choice.peak)} per GPU)")
        elif rest:
            what = others.reason
        else:  # nothing else was estimated: "the smallest estimate is 0 B" would be false
            what = (f"give --memory-per-gpu {-(-smallest.peak // (1 << 20))}MiB or more, more servers/GPUs, "
                    f"or a smaller model")
        _everywhere(group, PlanError(
            f"--memory-per-gpu {format_size(cfg.budget)} is too small for any full preload: k = 1 needs an "
            f"estimated {format_size(smallest.peak)} per GPU; instead {what}; "
            f"`python -m preprocess plan` prints every option"))
    return decision


# ---------------------------------------------------------------------------------------------------
# Command line (registered by preprocess/__main__.py)
def add_model_arguments(p, budget_required: bool = False) -> None:
    g = p.add_argument_group("model and memory budget (the estimate)")
    g.add_argument("--model", choices=mm.MODELS, default="sage", help="model the estimate is for (default sage)")
    g.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    g.add_argument("--dropout", type=float, default=0.5, help="dropout of training (default 0.5, as granndis-train)")
    g.add_argument("--norm", action="store_true", help="LayerNorm between sage/gcn convs")
    g.add_argument("--checkpoint-activations", action="store_true", help="ressage: recompute residual blocks")
    g.add_argument("--memory-per-gpu", default=None, metavar="SIZE",
                   help="memory budget of one GPU, e.g. 40GiB" + (" (required)" if budget_required else ""))
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="device the run trains on: dropout masks take 1 byte per value on CUDA, 4 on CPU")


def add_plan_arguments(p) -> None:
    g = p.add_argument_group("layout")
    g.add_argument("--servers", type=int, required=True, help="number of servers S")
    g.add_argument("--gpus-per-server", type=int, required=True, help="GPUs (ranks) per server G")
    g.add_argument("--layers", type=int, required=True, help="GNN layers L")
    from .partition import PARTITIONERS
    from .halo import EAS_SELECT_RULES

    g.add_argument("--partitioner", choices=PARTITIONERS, default="parmetis", help="server-level partitioner")
    e = p.add_argument_group("EAS and co-batches")
    e.add_argument("--eas-hops", type=int, default=1, help="EAS hops h (default 1, the paper's)")
    e.add_argument("--fanout", type=int, default=15, help="EAS fanout f (default 15, the paper's)")
    e.add_argument("--eas-select", choices=EAS_SELECT_RULES, default="degree")
    e.add_argument("--no-eas", action="store_true", help="plan full preloads only")
    e.add_argument("--cob-batches", default="2,4,8,16", help="co-batch counts per epoch to estimate (default 2,4,8,16)")
    e.add_argument("--cob-fanout", type=int, default=-1, help="co-batch sampler fanout (-1 = all in-neighbours)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the options and the decision as JSON")
    b = p.add_argument_group("build memory (the distributed `preprocess build`)")
    b.add_argument("--build-ranks", type=int, default=None, metavar="P",
                   help="ranks of the build the memory estimate is for (default: this plan's ranks)")
    b.add_argument("--memory-per-rank", default=None, metavar="SIZE",
                   help="also print the smallest number of build ranks whose estimated peak fits SIZE per rank")
    add_model_arguments(p)


def _budget(text) -> Optional[int]:
    from granndis_hpc.units import parse_size

    return None if text is None else parse_size(text)


def config_from_args(args, **overrides) -> PlanConfig:
    """A PlanConfig from plan's or build's parsed arguments (build has no EAS/co-batch options)."""
    batches = [int(b) for b in str(getattr(args, "cob_batches", "2,4,8,16")).split(",") if b.strip()]
    cfg = PlanConfig(servers=args.servers, gpus_per_server=args.gpus_per_server, layers=args.layers,
                     model=args.model, hidden=args.hidden, dropout=args.dropout, norm=args.norm,
                     checkpoint_activations=args.checkpoint_activations, budget=_budget(args.memory_per_gpu),
                     device=args.device, partitioner=args.partitioner, seed=int(getattr(args, "seed", 0) or 0),
                     eas_hops=getattr(args, "eas_hops", 1), fanout=args.fanout,
                     eas_select=getattr(args, "eas_select", "degree"), eas=not getattr(args, "no_eas", False),
                     cob_batches=batches, cob_fanout=getattr(args, "cob_fanout", -1))
    return dataclasses.replace(cfg, **overrides)


def check_writable(path: str) -> None:
    """PlanError unless `path` can be created or replaced (its directory exists and is writable)."""
    import os

    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise PlanError(f"--json {path}: is a directory; give a file name")
    if not os.path.isdir(directory):
        raise PlanError(f"--json {path}: directory {directory} does not exist; create it or choose another path")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise PlanError(f"--json {path}: not writable (permission denied or read-only); choose another path")


def cmd_plan(args, argv) -> int:
    import json
    import sys

    from . import sources

    group = as_group(None)  # MPI.COMM_WORLD, through cluster/
    if getattr(args, "source_error", None) is not None:
        print(f"preprocess plan: error: dataset loaders unavailable ({args.source_error})", file=sys.stderr)
        return 1
    try:
        with group.errors("reading the options", catch=(ValueError, mm.MemoryModelError)):
            cfg = config_from_args(args)
            _budget(args.memory_per_rank)  # a bad size fails here, on every rank
            if args.build_ranks is not None and args.build_ranks < 1:
                raise PlanError(f"--build-ranks must be >= 1 (got {args.build_ranks})")
            if cfg.eas_hops < 1 or cfg.fanout < 1:
                raise PlanError(f"--eas-hops and --fanout must be >= 1 (got {cfg.eas_hops}, {cfg.fanout})")
            if any(b < 1 for b in cfg.cob_batches):
                raise PlanError(f"--cob-batches must be positive counts, got {args.cob_batches!r}")
            if args.json:
                check_writable(args.json)  # before the work, not after printing the table
        with group.errors("loading the dataset"):
            graph = sources.load_from_args(args)
        result = plan_options(group, graph, cfg)
        decision = mm.choose(result["options"], cfg.budget) if cfg.budget is not None else None
    except Exception as exc:  # noqa: BLE001
        return fail(group, "plan", exc)
    if group.rank == 0:
        m = result["model"]
        print(f"[plan] {graph.name}: {graph.num_vertices} vertices, {graph.num_edges} edges; {cfg.servers} servers x "
              f"{cfg.gpus_per_server} GPUs; {m.layers}-layer {m.name}, hidden {m.hidden}; estimates per GPU on "
              f"{cfg.device} (max over GPUs), inter-server bytes per epoch summed over ranks", flush=True)
        print(format_table(result["options"], cfg, decision), flush=True)
        lines, build_record = build_memory_lines(graph, result, _raw_keys(args, graph), args.build_ranks or group.size,
                                                 cfg.partitioner, _budget(args.memory_per_rank))
        for line in lines:
            print(line, flush=True)
        if args.json:
            try:
                with open(args.json, "w") as f:
                    json.dump({"options": [o.to_dict() for o in result["options"]],
                               "decision": None if decision is None else decision.to_dict(),
                               "partition": result["partition"], "build_memory": build_record}, f,
                              indent=1, sort_keys=True)
            except OSError as exc:  # rank 0 only, after every collective: nothing waits for it
                print(f"preprocess plan: error: cannot write --json {args.json}: {exc.strerror or exc}; "
                      f"choose a writable path", file=sys.stderr, flush=True)
                return 1
    if decision is not None and decision.choice is None:
        print(f"preprocess plan: error (rank {group.rank}): {decision.reason}", file=sys.stderr, flush=True)
        return 2
    return 0


def _raw_keys(args, graph) -> int:
    """Edge keys the distributed build's load makes: the raw edges (a synthetic graph's draws, a chunked
    directory's edges, else the canonical ones), twice when symmetrising."""
    if args.source == "synthetic":
        raw = int(round(args.vertices * args.avg_degree / 2))
    elif args.source == "chunked":
        from .chunked import open_source

        raw = open_source(args.path).num_edges
    else:
        raw = graph.num_edges
    return raw * (2 if getattr(args, "symmetrize", True) else 1)


def hops_arg(text: str):
    """--hops: a number of hops, or `auto` (the largest k that fits --memory-per-gpu)."""
    import argparse

    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hops takes a number of hops or 'auto', got {text!r}") from None


def resolve_build_hops(group, graph, args, printer=print, record: Optional[dict] = None) -> Optional[int]:
    """build's --hops: checks 1 <= k <= L for a full preload, and resolves `auto` with the memory
    model (rank 0 says which k and why; `record`, when given, gets the decision under "hops_auto"
    for the manifest).  Collective when --hops auto; errors are raised on every rank alike."""
    group = as_group(group)
    if args.memory_per_gpu is not None and args.hops != "auto":
        _everywhere(group, PlanError("--memory-per-gpu is what --hops auto fits the preload into; add --hops "
                                     "auto, or leave --memory-per-gpu out"))
    if args.hops == "auto" and args.preload != "full":
        _everywhere(group, PlanError("--hops auto picks the depth of a full preload; with --preload eas give "
                                     "--hops H (EAS hops, default 1)"))
    # --hops K > --layers is refused by the build's own validate_config.
    if args.hops != "auto":
        return args.hops
    with group.errors("reading the options", catch=(ValueError,)):
        cfg = config_from_args(args, eas=False)
    decision = auto_hops(group, graph, cfg)
    if group.rank == 0:
        printer(f"[preprocess] --hops auto: k = {decision.choice.k} (estimated peak "
                f"{format_size(decision.choice.peak)} per GPU of {format_size(cfg.budget)}): {decision.reason}",
                flush=True)
    if record is not None:
        record["hops_auto"] = decision.to_dict()
    return decision.choice.k
