"""Options and the choice GraNNDis makes with them (paper §5.1): one ranking, applied by `choose`, that
--mode auto and `preprocess plan` both use.

The ranking is the modes' own (their registry entries, granndis_hpc/registry.py: `rank`, and a `knob`
that prefers the largest preloaded depth k or the fewest co-batches); the "why" text is written from
the same entries, so it states the order exactly as it is applied.  No mode is named here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from granndis_hpc.registry import MODES, auto_modes
from granndis_hpc.units import format_size

from .epoch_time import Rates, Work, seconds, work
from .estimate import ModelSpec, RankRows, estimate, inter_server_bytes
from .payload import computed_rows, halo_bytes, memory_bytes
from .payload import plan as payload_plan

# Which Option attribute a mode's knob is, and how auto prefers it: the largest k, the fewest co-batches.
_KNOBS = {"k": lambda o: -o.k, "batches": lambda o: o.batches}


def rows_held(r: RankRows) -> int:
    """Rows the views a GPU trains on hold: the server view's own and halo rows (k >= 1), plus the
    world view's halo rows when a layer runs on it (its own rows are the inner rows, already counted).
    The two views keep separate tensors, so a row in both halos counts twice, as its memory does."""
    n = (r.server.n_own + r.server.n_halo) if r.k > 0 and r.server is not None else r.world.n_own
    return int(n + (r.world.n_halo if r.k < r.layers else 0))


@dataclass
class Option:
    """One way to train: `mode` (a registered mode), `k` preloaded layers, `batches` co-batches per epoch,
    and what fb and flx send between servers (`payload`: --halo-payload, memory_model/payload.py)."""

    mode: str
    k: int = 0
    batches: int = 1
    payload: str = "rows"
    peak: int = 0  # estimated peak bytes, max over ranks
    peak_rank: int = 0
    breakdown: Dict[str, int] = field(default_factory=dict)  # of the peak rank
    rows_per_gpu: int = 0  # max over ranks of the rows a GPU holds (own + halo, training views)
    inter_server_bytes: Dict[str, int] = field(default_factory=dict)
    source: str = ""  # the shard set (or build) it reads
    # its epoch's rows, edges and bytes (memory_model/epoch_time.py)
    work: Optional[Work] = field(default=None, compare=False, repr=False)
    predicted: Dict[str, float] = field(default_factory=dict)  # epoch seconds, once priced with Rates

    @property
    def knob(self) -> Optional[str]:
        """The attribute that tells options of one mode apart (its registry entry's `knob`)."""
        return MODES.entry(self.mode).get("knob")

    @property
    def label(self) -> str:
        return (self.mode + (f" {self.knob}={getattr(self, self.knob)}" if self.knob else "")
                + (f" payload={self.payload}" if self.payload != "rows" else ""))

    def train_options(self) -> Dict[str, Any]:
        """The train options that run this option (its entry's `train_option` set to the knob, and
        --halo-payload where it sends partial aggregates)."""
        name = MODES.entry(self.mode).get("train_option")
        out: Dict[str, Any] = {name: int(getattr(self, self.knob))} if name and self.knob else {}
        return {**out, "halo_payload": self.payload} if self.payload != "rows" else out

    def to_dict(self) -> dict:
        return {"mode": self.mode, "k": self.k, "batches": self.batches, "payload": self.payload,
                "label": self.label, "peak_bytes": self.peak,
                "peak_rank": self.peak_rank, "breakdown": dict(self.breakdown), "rows_per_gpu": self.rows_per_gpu,
                "inter_server_bytes": dict(self.inter_server_bytes), "source": self.source,
                "train_options": self.train_options(), "exact": exact(self), "predicted_s": dict(self.predicted),
                "rounds": None if self.work is None else {"world": self.work.world_rounds,
                                                          "server": self.work.server_rounds,
                                                          "relay": self.work.relay_rounds,
                                                          "steps": self.work.steps,
                                                          "overlapped_steps": self.work.overlapped_steps,
                                                          "targets": self.work.target_rounds}}


def make_option(mode: str, rows: Sequence[RankRows], m: ModelSpec, servers: int, device: str = "cpu",
                batches: int = 1, source: str = "", payload: str = "rows") -> Option:
    ests = [estimate(r, m, device) for r in rows]
    # fb's and flx's partial payloads: the halo bytes of the layers and server pairs that send partials, and
    # what their structures and buffers add to the memory of the same option with rows
    halo = halo_bytes(rows, m, servers, payload) if payload != "rows" else None
    # a layer that sends partials exchanges them in a world round of their own (priced where it blocks), and the
    # layer below it computes its rows unsplit
    partial_layers = [bool(np.any(u)) for u in payload_plan(rows, m, servers, payload).use] if payload != "rows" else []
    if payload != "rows":
        for e, (graph, buffers) in zip(ests, memory_bytes(rows, m, servers, payload)):
            e["breakdown"] = {**e["breakdown"], "graph": e["breakdown"]["graph"] + int(graph),
                              "halo_buffers": e["breakdown"]["halo_buffers"] + int(buffers)}
            e["total"] += int(graph) + int(buffers)
    worst = max(range(len(ests)), key=lambda i: ests[i]["total"])
    held = max(rows_held(r) for r in rows)
    batched = MODES.entry(mode).get("knob") == "batches"
    # k: the layers on the server-side view (0 for fb, L for eas and cob).
    return Option(mode=mode, k=int(rows[0].k), batches=batches, payload=payload,
                  peak=int(ests[worst]["total"]), peak_rank=int(rows[worst].rank), breakdown=ests[worst]["breakdown"],
                  rows_per_gpu=int(held), source=source,
                  # one optimizer step per co-batch (batches is 1 for the full-graph modes)
                  inter_server_bytes=inter_server_bytes(rows, m, servers, steps=batches, halo_bytes=halo),
                  # a batched mode sets up each co-batch (one per epoch is planned once and reused) and
                  # all-reduces the target count of every one
                  work=work(computed_rows(rows, m, servers, payload) if payload != "rows" else rows, m, servers,
                            batches, halo_bytes=halo,
                            cobatches=batches if batched and batches > 1 else 0, batched=batched,
                            partial_layers=partial_layers))


@dataclass
class Decision:
    """What `choose` picked (None when nothing fits), its estimate, and what it rejected and why."""

    choice: Optional[Option]
    budget: int
    rejected: List[Option]
    reason: str
    options: List[Option] = field(default_factory=list)  # every option considered (the table)
    rule: str = "memory"
    rates: Dict[str, Optional[float]] = field(default_factory=dict)  # what the time rule priced with

    def to_dict(self) -> dict:
        return {"choice": None if self.choice is None else self.choice.to_dict(), "budget_bytes": self.budget,
                "reason": self.reason, "rejected": [o.to_dict() for o in self.rejected], "rule": self.rule,
                "rates": dict(self.rates), "options": [o.to_dict() for o in self.options]}


def preference(o: Option) -> tuple:
    """GraNNDis' order (paper §5.1, Fig. 13b), as the modes' registry entries rank themselves: full-batch
    FLX with the largest k, then FLX on EAS, then cooperative batching with the fewest (largest)
    co-batches.  fb (k = 0) comes last: it replicates nothing but sends every layer's halo over the slow
    links, which is what GraNNDis avoids; it is chosen only when nothing of GraNNDis' fits (it is also
    the lightest full-batch option)."""
    entry = MODES.entry(o.mode)
    knob = entry.get("knob")
    return (entry.get("rank"), _KNOBS[knob](o) if knob else 0)


def order_text() -> str:
    """The order `preference` applies, in words (each mode's `phrase`, in rank order)."""
    return ", then ".join(e.get("phrase") or e.name for e in auto_modes())


def _inter_total(o: Option) -> int:
    return int(o.inter_server_bytes.get("total", 0))  # what plan's table shows; halo + gradient


def exact(o: Option) -> bool:
    """Whether the option trains on the full graph exactly (fb, flx), not on a sample (eas, cob)."""
    return bool(MODES.entry(o.mode).get("exact_full_graph"))


def drop_dominated(options: Sequence[Option]) -> Tuple[List[Option], List[str]]:
    """The exact full-graph options (fb, flx) without those another one of the same shard set (sending rows,
    or the same payload) beats on both counts: no more memory and no more inter-server bytes, less of one
    (flx k = 1 of a 2-layer model holds more rows than fb for the same inter-server bytes, since fb caches
    its layer-0 halo; so with the same payload).  Returns (kept, one line per dropped option saying why)."""
    exacts = [o for o in options if exact(o)]
    kept, why = [], []
    for o in options:
        # An option with a partial payload dominates only those of its payload: its bytes are priced against
        # the rows options by the time rule (fb with rows stays the baseline it is kept against).
        better = next((b for b in exacts if exact(o) and b is not o and b.source == o.source
                       and b.payload in ("rows", o.payload)
                       and o.inter_server_bytes and b.inter_server_bytes  # known for both
                       and b.peak <= o.peak and _inter_total(b) <= _inter_total(o)
                       and (b.peak < o.peak or _inter_total(b) < _inter_total(o))), None)
        if better is None:
            kept.append(o)
        else:
            why.append(f"{o.label} (dominated by {better.label}: {format_size(better.peak)} <= "
                       f"{format_size(o.peak)} per GPU, {_inter_total(better):,} <= {_inter_total(o):,} "
                       f"inter-server bytes per epoch)")
    return kept, why


def _namer(options: Sequence[Option]):
    """An option's name in a decision: its label, plus its shard set where another set offers an option of
    the same label, in brackets as plan's table writes it (auto over several sets: "cob batches=2" twice,
    with different sizes, said neither which set each was on)."""
    sources: Dict[str, set] = {}
    for o in options:
        sources.setdefault(o.label, set()).add(o.source)

    def name(o: Option) -> str:
        return f"{o.label} [{o.source}]" if len(sources.get(o.label, ())) > 1 and o.source else o.label
    return name


def _more_cobatches_help(options: Sequence[Option]) -> bool:
    """Whether more co-batches than estimated could lower the peak: the cob estimate still fell from the
    second-most to the most co-batches estimated (per shard set)."""
    for source in {o.source for o in options}:
        cob = sorted((o for o in options if o.mode == "cob" and o.source == source), key=lambda o: o.batches)
        if len(cob) >= 2 and cob[-1].peak < cob[-2].peak:
            return True
    return False


# What a GPU holds beside the tensors the estimate counts: the CUDA context with the cuBLAS/cuSPARSE
# workspaces and NCCL's communicator buffers, and the caching allocator's reserved-but-unallocated blocks
# (fragmentation), taken as a tenth of what is allocated.  Where the device is there (--mode auto on a
# GPU), what it already holds is measured at start-up (torch.cuda.mem_get_info: total less free, which
# also counts other processes on the GPU) and the budget is clipped to what is free; GPU_CONTEXT_BYTES is
# the stand-in where nothing was measured (`preprocess plan`, which runs without the GPUs).  The
# fragmentation cannot be measured before the run's own tensors exist, so it stays an estimate.
GPU_CONTEXT_BYTES = 1 << 30
GPU_FRAGMENTATION = 0.10


def usable_budget(budget_bytes: int, device: str, memory: Optional[Tuple[int, int]] = None) -> int:
    """The part of a per-GPU budget the estimated peak may fill.  On the CPU all of it.  On a GPU: the
    budget less what the device holds already, at most what it has free, divided by 1 + the
    fragmentation share.  memory: (free, total) bytes the device reported at start-up; None: the
    context is taken as GPU_CONTEXT_BYTES and nothing clips the budget."""
    if device != "cuda":
        return int(budget_bytes)
    if memory is None:
        held, free = GPU_CONTEXT_BYTES, int(budget_bytes)
    else:
        free, held = int(memory[0]), int(memory[1]) - int(memory[0])
    return max(0, int(min(int(budget_bytes) - held, free) / (1.0 + GPU_FRAGMENTATION)))


def headroom_note(budget_bytes: int, fits_in: int, memory: Optional[Tuple[int, int]] = None) -> str:
    """What the decision's reason says about the GPU's headroom (usable_budget's arithmetic)."""
    if memory is None:
        return (f" (of {format_size(budget_bytes)} per GPU, {format_size(budget_bytes - fits_in)} is kept for the "
                f"CUDA context, NCCL's buffers and the allocator's fragmentation)")
    free, total = int(memory[0]), int(memory[1])
    return (f" (the GPU reported {format_size(free)} free of {format_size(total)} at start-up: "
            f"{format_size(total - free)} held by the CUDA context, NCCL and other processes; of "
            f"{format_size(min(budget_bytes - (total - free), free))} left of the {format_size(budget_bytes)} budget, "
            f"{GPU_FRAGMENTATION:.0%} is kept for the allocator's fragmentation)")


def choose(options: Sequence[Option], budget_bytes: int) -> Decision:
    """The first option in GraNNDis' preference order whose estimated peak fits the budget."""
    name = _namer(options)
    options, dominated = drop_dominated(options)
    dropped = ("; not considered: " + ", ".join(dominated)) if dominated else ""
    ordered = sorted(options, key=preference)
    for i, o in enumerate(ordered):
        if o.peak <= budget_bytes:
            rejected = ordered[:i]
            # The order as preference() applies it (one ranking, the same in `plan` and --mode auto).
            why = (f"{name(o)} is the first of GraNNDis' order ({order_text()}) whose "
                   f"estimated peak {format_size(o.peak)} per GPU fits {format_size(budget_bytes)}")
            if rejected:
                why += "; rejected: " + ", ".join(f"{name(r)} ({format_size(r.peak)})" for r in rejected)
            return Decision(o, int(budget_bytes), rejected, why + dropped, options=ordered)
    return _refusal(ordered, budget_bytes, name, dropped)


def _refusal(ordered: List[Option], budget_bytes: int, name, dropped: str = "", rule: str = "memory") -> Decision:
    """The Decision when no option fits: the budget the smallest estimate needs."""
    if not ordered:
        return Decision(None, int(budget_bytes), [], "no option was estimated for this job, so none can be chosen",
                        rule=rule)
    need = min(o.peak for o in ordered)
    # A budget the user can paste: whole MiB, rounded up (format_size rounds to 3 digits).
    paste = f"{-(-need // (1 << 20))}MiB"
    more = ", or more co-batches" if _more_cobatches_help(ordered) else ""
    return Decision(None, int(budget_bytes), list(ordered),
                    f"nothing fits {format_size(budget_bytes)} per GPU: the smallest estimate is "
                    f"{format_size(need)} ({name(min(ordered, key=lambda o: o.peak))}); "
                    f"use --memory-per-gpu {paste} or more, or more servers/GPUs{more}" + dropped,
                    options=list(ordered), rule=rule)


def price(options: Sequence[Option], rates: Rates) -> None:
    """Set every option's predicted epoch seconds (`predicted`) for the measured rates."""
    for o in options:
        if o.work is not None:  # (every option make_option makes has one)
            o.predicted = seconds(o.work, rates)


# --auto-rule time keeps fb (the registry's baseline: the simplest exact plan, nothing replicated,
# nothing sampled) unless another option that fits is predicted faster by more than this share of fb's
# predicted epoch: the model's terms are measured on a machine whose timings vary by more than a few
# per cent from run to run, so a smaller predicted gain is within the prediction's own error.
BASELINE_MARGIN = 0.10


def _baseline(o: Option) -> bool:
    """The registry's baseline sending rows (fb with a partial payload is one of the options it is kept against)."""
    return bool(MODES.entry(o.mode).get("baseline")) and o.payload == "rows"


def _training_work(options: Sequence[Option], counted) -> Optional[Work]:
    """The work of the baseline (fb's epoch, else the first option's) among the options whose work has
    what `counted` reads (None: no such option)."""
    found = [o for o in options if o.work is not None and counted(o.work)]
    chosen = next((o for o in found if _baseline(o)), found[0] if found else None)
    return None if chosen is None else chosen.work


def training_degree(options: Sequence[Option], m: ModelSpec, fallback: float) -> float:
    """The in-edges per computed row of the graph the run trains on, as the compute rate's kernels count
    them: the baseline's epoch (fb's, else the first option's), its edges times their input widths over
    its computed rows times theirs (Work.dst_units), so that a step at this degree holds the epoch's
    aggregation work per row.  The dataset's average degree is not it: an inductive run trains on the
    train-induced graph (products-size: about 3 in-edges a row, the dataset 26), and a scale calibrated
    at one degree misprices rows at the other.  `fallback` where no option has its epoch's work counted."""
    w = _training_work(options, lambda w: w.dst_units is not None and float(w.dst_units.sum()) > 0)
    if w is None or w.dst_units is None:
        return float(fallback)
    return float(w.edge_units.sum()) / float(w.dst_units.sum())


def training_shape(options: Sequence[Option]) -> Optional[Tuple[float, float]]:
    """The overlapped path's shape in the baseline's epoch (fb's, else the first option's with a layer on
    that path): its halo rows and its boundary-first rows per computed row (Work.overlap_shape), at which
    compute_rate calibrates the path: a fixed small halo misprices fb where its halo is larger than its own
    rows (the 20,000-vertex demo graph: 1.97 halo rows a row, docs/performance/auto.md).  None where no
    option computes on that path."""
    w = _training_work(options, lambda w: w.overlap_shape is not None)
    return None if w is None else w.overlap_shape


def _terms(p: Dict[str, float]) -> str:
    hidden = p.get("gradient_hidden_s", 0.0)  # the gradient's seconds the backward hides (epoch_time.py)
    inter = f"{p['inter_s']:.3g}" + (f" after {hidden:.3g} of the gradient's hidden by the backward" if hidden else "")
    return (f"compute {p['compute_s']:.3g}, inter-server {inter}, intra-server {p['intra_s']:.3g}, "
            f"fixed {p.get('fixed_s', 0.0):.3g}")


def _margin_text(fastest: Option, base: Option, margin: float, name) -> Tuple[bool, str]:
    """(whether `fastest` beats the baseline by more than `margin`, the sentence that says so)."""
    t_fast, t_base = fastest.predicted["total_s"], base.predicted["total_s"]
    gain = 1.0 - t_fast / t_base if t_base > 0 else 0.0
    said = (f"{name(fastest)} is predicted {gain:.0%} faster than {name(base)} ({t_fast:.3g} s against "
            f"{t_base:.3g} s)")
    if gain > margin:
        return True, f"{said}, more than the {margin:.0%} margin an option must beat {name(base)} by"
    return False, f"{name(base)} is kept, the simplest exact plan: {said}, within the {margin:.0%} margin"


def choose_by_time(options: Sequence[Option], budget_bytes: int, rates: Rates, exact_only: bool = False,
                   margin: float = BASELINE_MARGIN) -> Decision:
    """Among the options whose estimated peak fits the budget (only the exact ones with `exact_only`),
    the one of the shortest predicted epoch (memory_model/epoch_time.py: the additive model less the
    gradient's hidden part); equal predictions go by GraNNDis' order (`preference`).  The baseline (fb) is kept unless
    the fastest is predicted faster by more than `margin` (a share of fb's prediction).  Every option
    is priced, for the table; a dominated one (`drop_dominated`: no less memory, no fewer inter-server
    bytes, and as many rows) is not considered."""
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"the baseline margin must be in [0, 1), got {margin!r}")
    name = _namer(options)
    price(options, rates)
    kept, dominated = drop_dominated(options)
    dropped = ("; not considered: " + ", ".join(dominated)) if dominated else ""
    considered = [o for o in kept if exact(o) or not exact_only]
    ordered = sorted(considered, key=lambda o: (o.predicted["total_s"], preference(o)))
    fits = [o for o in ordered if o.peak <= budget_bytes]
    if not fits:
        return _refusal(sorted(considered, key=preference), budget_bytes, name, dropped, rule="time")
    best, said = fits[0], ""
    base = next((o for o in fits if _baseline(o)), None)
    if base is not None and base is not best:
        beats, said = _margin_text(best, base, margin, name)
        best = best if beats else base
    p = best.predicted
    lead = (f"{name(best)} has the shortest predicted epoch of the options that fit" if best is fits[0]
            else f"{name(best)} is chosen among the options that fit")
    why = (f"{lead} {format_size(budget_bytes)} per GPU: {p['total_s']:.3g} s ({_terms(p)}; the additive model, "
           f"which overlapping the halo exchanges only lowers)")
    if said:
        why += "; " + said
    runner = next((o for o in fits if o is not best), None)
    if runner is not None:
        why += f"; runner-up {name(runner)}: {runner.predicted['total_s']:.3g} s"
    rejected = [o for o in ordered if o.peak > budget_bytes]
    if rejected:
        why += "; over the budget: " + ", ".join(f"{name(r)} ({format_size(r.peak)})" for r in rejected)
    if len(considered) < len(kept):
        why += "; the sampled modes left out (exact options only)"
    return Decision(best, int(budget_bytes), rejected, why + dropped, options=ordered, rule="time",
                    rates={**asdict(rates), "baseline_margin": margin})


def sets_up_cobatches(o: Option) -> bool:
    """Whether the option's predicted epoch includes setting up co-batches (Rates.cobatch_s and cobatch_row_s:
    a batched mode of more than one co-batch an epoch), which --mode auto times only where it can matter."""
    return o.work is not None and o.work.cobatches > 0


def setup_matters(decision: Decision) -> bool:
    """Whether timing the co-batch set-up can change `decision`, made with it priced at zero (a lower bound
    of every option that sets up co-batches; the others' prices do not depend on it).  Only if the chosen
    option sets up co-batches: were it another, a dearer set-up only raises options that lost already
    (choose_by_time's order and its margin against the baseline then pick the same option)."""
    return decision.choice is not None and sets_up_cobatches(decision.choice)


def setup_not_timed(decision: Decision) -> str:
    """Why a decision made with the co-batch set-up at zero (setup_matters False) needs no timing of it, in
    words; "" where no option sets up co-batches."""
    name = _namer(decision.options)
    priced = [o for o in decision.options if sets_up_cobatches(o) and o.predicted]
    if not priced:
        return ""
    fits = [o for o in priced if o.peak <= decision.budget]
    if decision.choice is None or not fits:
        why = "no option that sets up co-batches fits the budget"
    else:
        fastest = min(fits, key=lambda o: o.predicted["total_s"])
        why = (f"with none, {name(fastest)} ({fastest.predicted['total_s']:.3g} s, a lower bound) is already not "
               f"chosen against {name(decision.choice)} ({decision.choice.predicted['total_s']:.3g} s)")
    return (f"co-batch set-up not timed: {why}; the co-batch options' predicted seconds leave it out")


def decision_table(decision: dict) -> List[str]:
    """The options of a Decision's `to_dict`, one line each: label, predicted epoch seconds and its terms
    (with the time rule: compute, inter- and intra-server wire, fixed: the steps' and exchange rounds'),
    estimated peak per GPU, exact or sampled, and which one was chosen."""
    chosen = (decision.get("choice") or {}).get("label"), (decision.get("choice") or {}).get("source")
    head = ("option", "predicted s", "compute", "inter", "intra", "fixed", "peak/GPU", "exact")
    rows = [head + ("",)]
    for o in decision.get("options", []):
        p = o.get("predicted_s") or {}
        terms = tuple(f"{p[k]:.3g}" if k in p else "-"
                      for k in ("total_s", "compute_s", "inter_s", "intra_s", "fixed_s"))
        rows.append((o["label"],) + terms + (format_size(o["peak_bytes"]), "yes" if o.get("exact") else "no",
                                             "<- chosen" if (o["label"], o["source"]) == chosen else ""))
    n = len(head)
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:n], widths)) + ("  " + r[n] if r[n] else "") for r in rows]
