"""`granndis preprocess plan`: what each build would cost per GPU, without writing a shard.

preprocess/plan/sets.py runs the build's own steps for a full preload of every k = 1..L (or, with
`--hops H`, the one build of H hops) and for EAS, without writing them, and every mode estimates its
options on those sets as it does for --mode auto (granndis_hpc.memory_model); `choose` ranks them
(one ranking for plan and auto).  From a sliced source (chunked, chunk-native synthetic) every set is
counted from the build ranks' slices (preprocess/plan/halo_counts.py), no rank loading the graph; other
sources are loaded whole on every rank.  This module prints the table and the recommendation.

`auto_hops` is what `build --hops auto --memory-per-gpu X` calls: the largest k whose estimate fits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from granndis_hpc import memory_model as mm
from granndis_hpc import registry
from granndis_hpc.cluster.group import as_group
from granndis_hpc.units import format_size, parse_rate, parse_size

from granndis_hpc.preprocess.build.pipeline import check_dataset
from granndis_hpc.preprocess.plan import cobatch_setup
from granndis_hpc.preprocess.plan.build_memory import estimate_build_memory, smallest_fitting_ranks
from granndis_hpc.preprocess.options import hops_value
from granndis_hpc.preprocess.plan.sets import plan_options
from granndis_hpc.preprocess.partition.row_blocks import DEFAULT_BLOCK_ROWS
from granndis_hpc.preprocess.build.sliced import GraphSlice

__all__ = ["PlanConfig", "PlanError", "plan_options", "auto_hops", "format_table", "describe_build", "cmd_plan"]


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
    precision: str = "fp32"  # --precision: bf16 activations are 2 bytes a number
    halo_route: str = "per-server"  # --halo-route: the world halo's bytes between and within servers
    linear_layers: Optional[int] = None  # per-vertex Linear layers after the `layers` convs
    budget: Optional[int] = None  # bytes per GPU
    device: str = "cuda"  # dropout masks are bool on CUDA, float on CPU
    partitioner: str = "parmetis"
    seed: int = 0
    row_block_rows: int = DEFAULT_BLOCK_ROWS  # the build's locality blocks: co-batches are drawn in file order
    ks: Optional[Sequence[int]] = None  # default 0..L
    eas_hops: int = 1
    fanout: int = 15
    eas_select: str = "degree"
    eas: bool = True
    cob_batches: Sequence[int] = (2, 4, 8, 16)
    cob_fanout: int = -1
    cob_sampler: str = "sage"
    hops: Optional[int] = None  # estimate the one full build of H hops (what --mode auto sees on it)
    model_options: Sequence[str] = ()  # the model's extra constructor options, NAME=VALUE
    inductive: bool = False  # the build is for --inductive training (estimates add its evaluation views)
    time_setup: bool = False  # time a co-batch's set-up on the server graphs (--inter-rate, plan/cobatch_setup.py)


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


def build_memory_lines(graph, result, raw_keys: int, ranks: int, partitioner: str, budget: Optional[int],
                       symmetric: bool = True, row_block_parts: int = 0):
    """Rank 0's lines on the distributed build's memory (and its JSON record).  row_block_parts: the GPUs
    whose rows get locality blocks (S G, or 0 with --row-block-rows 0)."""
    lines, record = [], {}
    common = dict(num_vertices=graph.num_vertices, num_edges=graph.num_edges, raw_keys=int(raw_keys),
                  num_features=graph.num_features, partitioner=partitioner, symmetric=bool(symmetric),
                  row_block_parts=int(row_block_parts))
    for label, loads in (result.get("server_loads") or {}).items():
        eas, loads = loads
        est = estimate_build_memory(servers=loads, ranks=ranks, eas=eas, **common)
        rec = est.to_dict()
        rec["inputs"] = {**common, "eas": eas, "servers": [vars(x) for x in loads]}  # for another P
        writers = sorted({s.server % ranks for s in loads})
        others = [b for r, b in enumerate(est.per_rank) if r not in writers]
        text = (f"[plan] build {label}: estimated peak per build rank with P = {ranks}: {format_size(est.peak)} "
                f"(writer ranks {','.join(map(str, writers))})"
                + (f", {format_size(max(others))} on the others" if others else ""))
        if budget is not None:
            fit = smallest_fitting_ranks(budget, servers=loads, eas=eas, **common)
            rec["smallest_ranks_fitting"] = fit
            text += (f"; smallest P fitting --memory-per-rank {format_size(budget)}: {fit}" if fit else
                     f"; no P fits --memory-per-rank {format_size(budget)} (a writer rank holds its server's rows)")
        lines.append(text)
        record[label] = rec
    return lines, record


def describe_build(o: mm.Option, cfg: PlanConfig) -> str:
    """The build (and train) command of an option: its mode's registry entry says which preload."""
    base = (f"granndis preprocess build ... --servers {cfg.servers} --gpus-per-server {cfg.gpus_per_server} --layers "
            f"{cfg.layers}")
    if cfg.inductive:
        base += " --inductive"
    build = registry.MODES.entry(o.mode).get("build") or f"(train --mode {o.mode})"
    payload = f" (train with --halo-payload {o.payload})" if o.payload != "rows" else ""
    return f"{base} " + build.format(k=o.k, batches=o.batches, eas_hops=cfg.eas_hops, fanout=cfg.fanout,
                                     cob_fanout=cfg.cob_fanout) + payload


def format_table(options: Sequence[mm.Option], cfg: PlanConfig, decision: Optional[mm.Decision]) -> str:
    timed = any(o.predicted for o in options)  # --inter-rate: each option's predicted epoch seconds
    names = {id(o): f"{o.label} [{o.source}]" if o.source else o.label for o in options}  # --hops H: which set
    w = max([20, *map(len, names.values())])
    lines = [f"{'option':<{w}} {'rows held':>10} {'peak/GPU':>11} {'inter-server B/epoch':>21} "
             f"{'(halo + grad)':>24}" + (f" {'epoch s':>9}" if timed else "") + "  fits"]
    for o in sorted(options, key=mm.preference):
        fits = "-" if cfg.budget is None else ("yes" if o.peak <= cfg.budget else "no")
        ib = o.inter_server_bytes
        epoch = f" {o.predicted['total_s']:>9.3g}" if timed else ""
        lines.append(f"{names[id(o)]:<{w}} {o.rows_per_gpu:>10,} {format_size(o.peak):>11} {ib['total']:>21,} "
                     f"{ib['halo']:>12,} + {ib['gradient']:>9,}{epoch}  {fits}")
    if decision is not None and decision.rule == "time":  # the terms, as --mode auto prints its table
        lines.append("predicted epoch by term (s; fixed: steps and exchange rounds), fastest first:")
        lines += [f"  {line}" for line in mm.decision_table(decision.to_dict())]
    if decision is not None:
        if decision.choice is None:
            lines.append(f"recommendation: none -- {decision.reason}")
        else:
            lines.append(f"recommendation: {decision.choice.label}: {describe_build(decision.choice, cfg)}")
            lines.append(f"  because {decision.reason}")
    return "\n".join(lines)


def auto_hops(group, graph, cfg: PlanConfig) -> mm.Decision:
    """`build --hops auto`: the largest k in 1..L whose estimate fits cfg.budget (collective).  `graph`:
    the whole Graph, or this rank's sliced.GraphSlice (counted without assembling it, halo_counts.py).

    Raises PlanError (the same on every rank, as a collective ClusterError under mpirun) when there is no budget or
    when not even k = 1
    fits, saying what budget would (`preprocess plan` prints the EAS and co-batch options too)."""
    group = as_group(group)
    if cfg.budget is None:
        _everywhere(group, PlanError("--hops auto picks the largest preloaded depth that fits a memory budget: "
                                     "add --memory-per-gpu (e.g. 40GiB), or give --hops K with 1 <= K <= --layers"))
    # One build per k = 1..L and nothing else (no EAS): every option is a full preload of its own depth.
    cfg = dataclasses.replace(cfg, ks=list(range(1, cfg.layers + 1)), eas=False, hops=None)
    full = plan_options(group, graph, cfg)["options"]
    decision = mm.choose(full, cfg.budget)
    if decision.choice is None:
        smallest = min(full, key=lambda o: o.peak)
        _everywhere(group, PlanError(
            f"--memory-per-gpu {format_size(cfg.budget)} is too small for any full preload: k = 1 needs an "
            f"estimated {format_size(smallest.peak)} per GPU; instead give --memory-per-gpu "
            f"{-(-smallest.peak // (1 << 20))}MiB or more, more servers/GPUs, or a smaller model; "
            f"`granndis preprocess plan` prints every option (EAS and co-batches too)"))
    return decision


# ---------------------------------------------------------------------------------------------------
# Command line (registered by preprocess/__main__.py)
def _budget(text) -> Optional[int]:
    return None if text is None else parse_size(text)


def config_from_args(args, **overrides) -> PlanConfig:
    """A PlanConfig from plan's or build's options (preprocess/options.py; build has no co-batch options)."""
    batches = [int(b) for b in str(getattr(args, "cob_batches", "2,4,8,16")).split(",") if b.strip()]
    cfg = PlanConfig(servers=args.servers, gpus_per_server=args.gpus_per_server, layers=args.layers,
                     model=args.model, hidden=args.hidden, dropout=args.dropout, norm=args.norm,
                     checkpoint_activations=args.checkpoint_activations, precision=args.precision,
                     halo_route=getattr(args, "halo_route", "per-server"),
                     linear_layers=getattr(args, "linear_layers", None), budget=_budget(args.memory_per_gpu),
                     device=args.estimate_device, partitioner=args.partitioner, seed=args.seed,
                     row_block_rows=args.row_block_rows, eas_hops=getattr(args, "eas_hops", 1), fanout=args.eas_fanout,
                     eas_select=args.eas_select, eas=not getattr(args, "no_eas", False), cob_batches=batches,
                     cob_fanout=getattr(args, "cob_fanout", -1),
                     hops=args.hops if isinstance(getattr(args, "hops", None), int) else None,
                     model_options=tuple(getattr(args, "model_option", None) or ()),
                     inductive=bool(getattr(args, "inductive", False)),
                     time_setup=(getattr(args, "inter_rate", None) is not None
                                 and getattr(args, "cobatch_setup", None) is None))
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


def check_both_rate(args) -> None:
    """PlanError unless --inter-both-rate comes with --inter-rate and is at most it (a link carries no
    more one way while the other way is busy too)."""
    both = getattr(args, "inter_both_rate", None)
    if both is None:
        return
    if args.inter_rate is None:
        raise PlanError(f"--inter-both-rate {both} is the link between servers with both sending at once: give "
                        f"--inter-rate (its rate one way) with it")
    if parse_rate(both) > parse_rate(args.inter_rate):
        raise PlanError(f"--inter-both-rate {both} is more than --inter-rate {args.inter_rate}: a link carries no "
                        f"more one way while the other way is busy too; give at most --inter-rate (a full-duplex "
                        f"link: leave --inter-both-rate out)")


def planned_rates(group, args, m: mm.ModelSpec, graph, setup: Optional[dict] = None,
                  options: Sequence[mm.Option] = ()) -> Optional[mm.Rates]:
    """--inter-rate (and --inter-both-rate, --intra-rate): the links given, with the compute rate measured
    and calibrated on this machine's first GPU, else its CPU (rank 0's, shared; the exchange rounds' fixed
    cost needs the cluster and is not priced), at the in-degree of the graph the options train on
    (mm.training_degree) and their overlapped path's shape (mm.training_shape), and a co-batch's set-up
    (`setup`: cobatch_setup.summary's or given's fields); None without --inter-rate."""
    if args.inter_rate is None:
        return None
    rates = None
    if group.rank == 0:
        import torch

        from granndis_hpc.memory_model import compute_rate

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        degree = mm.training_degree(options, m, graph.num_edges / max(1, graph.num_vertices))
        row_s, edge_s = compute_rate.measure(m.widths(), degree, device)
        try:  # the model's real step (compute_rate.calibrate); the exchange rounds need the cluster: not priced
            cal = compute_rate.calibrate(m, degree, device, row_s, edge_s, shape=mm.training_shape(options))
        except (ValueError, TypeError, RuntimeError, NotImplementedError):
            cal = {"compute_scale": 1.0, "step_s": 0.0}
        both = getattr(args, "inter_both_rate", None)
        rates = mm.Rates(parse_rate(args.inter_rate), parse_rate(args.intra_rate or args.inter_rate), row_s, edge_s,
                         compute_scale=cal["compute_scale"], step_s=cal["step_s"],
                         overlap_scale=cal.get("overlap_scale"), overlap_step_s=cal.get("overlap_step_s", 0.0),
                         inter_both_Bps=None if both is None else parse_rate(both),
                         cobatch_s=(setup or {}).get("cobatch_s", 0.0),
                         cobatch_row_s=(setup or {}).get("cobatch_row_s", 0.0))
    return group.bcast_object(rates)


def cmd_plan(args, argv) -> int:
    import json
    import sys

    from granndis_hpc.preprocess import sources

    group = as_group(None)  # MPI.COMM_WORLD, through cluster/
    try:
        with group.errors("reading the options", catch=(ValueError, mm.MemoryModelError)):
            cfg = config_from_args(args)
            _budget(args.memory_per_rank)  # a bad size fails here, on every rank
            if args.build_ranks is not None and args.build_ranks < 1:
                raise PlanError(f"--build-ranks must be >= 1 (got {args.build_ranks})")
            check_both_rate(args)
            if getattr(args, "cobatch_setup", None) is not None:
                cobatch_setup.parse_setup(args.cobatch_setup)  # refused before the work
            if args.json:
                check_writable(args.json)  # before the work, not after printing the table
        with group.errors("opening the dataset"):
            # A sliced source is counted from the ranks' slices (preprocess/plan/halo_counts.py): no rank loads
            # the graph; the others are loaded whole on every rank.
            sliced = sources.sliced_from_args(args)
        if sliced is not None:
            from granndis_hpc.preprocess.build.sliced import load_slice

            graph = load_slice(group, sliced, symmetrize=args.symmetrize, self_loops=args.self_loops,
                               normalize=args.normalize_features)
        else:
            with group.errors("loading the dataset"):
                graph = sources.load_from_args(args)
        result = plan_options(group, graph, cfg)
        setup = _setup(args, result)
        rates = planned_rates(group, args, result["model"], graph, setup, result["options"])
        if rates is not None:
            mm.price(result["options"], rates)
        if cfg.budget is None:
            decision = None
        elif rates is not None:
            decision = mm.choose_by_time(result["options"], cfg.budget, rates)
        else:
            decision = mm.choose(result["options"], cfg.budget)
        if decision is not None and setup is not None and setup["method"]:
            decision = dataclasses.replace(decision, reason=decision.reason + "; " + setup["method"])
        if decision is not None and result["model"].payload_refusal:
            decision = dataclasses.replace(decision, reason=decision.reason + mm.refusal_note(result["model"]))
    except Exception as exc:  # noqa: BLE001
        return fail(group, "plan", exc)
    if group.rank == 0:
        m = result["model"]
        print(f"[plan] {graph.name}: {graph.num_vertices} vertices, {graph.num_edges} edges; {cfg.servers} servers x "
              f"{cfg.gpus_per_server} GPUs; {m.layers}-layer {m.name}"
              f"{f' + {m.linear_layers} Linear' if m.linear_layers else ''}, hidden {m.hidden}; estimates per GPU on "
              f"{cfg.device} (max over GPUs), inter-server bytes per epoch summed over ranks", flush=True)
        print(format_table(result["options"], cfg, decision), flush=True)
        if decision is None and setup is not None and setup["method"]:  # (with a decision its reason says it)
            print(f"[plan] {setup['method']}", flush=True)
        if decision is None and m.payload_refusal:  # (with a decision its reason says it)
            print(f"[plan] {mm.refusal_note(m)[2:]}", flush=True)
        lines, build_record = build_memory_lines(graph, result, _raw_keys(args, graph), args.build_ranks or group.size,
                                                 cfg.partitioner, _budget(args.memory_per_rank),
                                                 symmetric=getattr(args, "symmetrize", True),
                                                 row_block_parts=(cfg.servers * cfg.gpus_per_server
                                                                  if cfg.row_block_rows else 0))
        for line in lines:
            print(line, flush=True)
        if args.json:
            try:
                with open(args.json, "w") as f:
                    json.dump({"options": [o.to_dict() for o in result["options"]], "cobatch_setup": setup,
                               "decision": None if decision is None else decision.to_dict(),
                               "partition": result["partition"], "build_memory": build_record}, f,
                              indent=1, sort_keys=True)
            except OSError as exc:  # rank 0 only, after every collective: nothing waits for it
                print(f"preprocess plan: error: cannot write --json {args.json}: {exc.strerror or exc}; "
                      f"choose a writable path", file=sys.stderr, flush=True)
                return 1
    if decision is not None and decision.choice is None:
        if group.rank == 0:  # every rank decided alike (the same estimates): said once
            print(f"preprocess plan: error: {decision.reason}", file=sys.stderr, flush=True)
        return 2
    return 0


def _setup(args, result) -> Optional[dict]:
    """The co-batch set-up the plan prices cob with (--inter-rate only; plan/cobatch_setup.py): --cobatch-setup's,
    else the one timed on the server graphs; None where no option sets up co-batches."""
    if args.inter_rate is None or not any(mm.sets_up_cobatches(o) for o in result["options"]):
        return None
    if getattr(args, "cobatch_setup", None) is not None:
        return cobatch_setup.given(args.cobatch_setup)
    return cobatch_setup.summary(result.get("setup") or {})


def _raw_keys(args, graph) -> int:
    """Edge keys the distributed build's load makes: the raw edges (a synthetic graph's draws, a chunked
    directory's edges, else the canonical ones), twice when symmetrising."""
    if args.source == "synthetic":
        raw = int(round(args.vertices * args.avg_degree / 2))
    elif args.source == "chunked":
        from granndis_hpc.preprocess.formats.chunked import open_source

        raw = open_source(args.path, target_type=getattr(args, "target_type", None)).num_edges
    else:
        raw = graph.num_edges
    return raw * (2 if getattr(args, "symmetrize", True) else 1)


def resolve_build_hops(group, graph, args, printer=print, record: Optional[dict] = None) -> Optional[int]:
    """build's --hops: checks 1 <= k <= L for a full preload, and resolves `auto` with the memory
    model (rank 0 says which k and why; `record`, when given, gets the decision under "hops_auto"
    for the manifest).  Collective when --hops auto; errors are raised on every rank alike."""
    group = as_group(group)
    hops = hops_value(args.hops)
    if args.memory_per_gpu is not None and hops != "auto":
        _everywhere(group, PlanError("--memory-per-gpu is what --hops auto fits the preload into; add --hops "
                                     "auto, or leave --memory-per-gpu out"))
    if hops == "auto" and args.preload != "full":
        _everywhere(group, PlanError("--hops auto picks the depth of a full preload; with --preload eas give "
                                     "--hops H (EAS hops, default 1)"))
    # --hops K > --layers is refused by the build's own validate_config.
    if hops != "auto":
        return hops
    # `graph`: the whole Graph, or this rank's sliced.GraphSlice (the count is then over every slice).
    num_train = int(group.allreduce_sum(np.array([np.count_nonzero(graph.train_mask)], dtype=np.int64))[0]
                    if isinstance(graph, GraphSlice) else np.count_nonzero(graph.train_mask))
    with group.errors("reading the options", catch=(ValueError,)):
        cfg = config_from_args(args, eas=False)
        # before the memory model sizes an output layer of num_classes (2**40: "needs 3.1e+03 TiB per GPU")
        check_dataset(graph.name, graph.num_vertices, graph.num_classes, num_train)
    decision = auto_hops(group, graph, cfg)
    if group.rank == 0:
        printer(f"[preprocess] --hops auto: k = {decision.choice.k} (estimated peak "
                f"{format_size(decision.choice.peak)} per GPU of {format_size(cfg.budget)}): {decision.reason}",
                flush=True)
    if record is not None:
        record["hops_auto"] = decision.to_dict()
    return decision.choice.k
