"""The memory model's inputs from shard sets on disk: reading each rank's slice, and --mode auto's
choice over the sets it is given (`choose_shard_sets`), estimated by the modes' own `estimate`
(memory_model/mode_estimates.py) and ranked by `choose` (memory_model/choice.py), as `preprocess plan` does.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from granndis_hpc import shards
from granndis_hpc.graph.hetero import GraphTypes

from .arrays import ServerArrays, gpu_arrays_from_slice
from .choice import (Decision, choose, choose_by_time, exact, headroom_note, training_degree, training_shape,
                     usable_budget)
from .epoch_time import Rates
from .estimate import MemoryModelError, ModelSpec, estimate
from .induced_sets import InductiveSetArrays
from .mode_estimates import Sampling, SetArrays, options, row_groups
from .payload import refusal_note, with_payloads


def read_shard_set(path: str) -> Tuple[dict, List[ServerArrays]]:
    """The manifest and every server's ServerArrays of a shard set (reads each rank's slice); an
    inductive set's with the split codes and train-induced hops its induced views are counted from."""
    manifest = shards.read_manifest(path)
    out = []
    for s in range(int(manifest["servers"])):
        gpus, sl = [], None
        for g in range(int(manifest["gpus_per_server"])):
            sl = shards.read_rank_slice(path, manifest, s, g)
            gpus.append(gpu_arrays_from_slice(sl, **_induced_fields(sl)))
        assert sl is not None  # (a server has at least one GPU: the manifest's checks)
        out.append(ServerArrays(s, sl.server_hop.astype(np.int64), sl.server_offsets.astype(np.int64), gpus,
                                train_hop=sl.server_train_hop))
    return manifest, out


def _induced_fields(sl) -> dict:
    """An inductive set's slice: the split code of its inner rows and of its world sources, and its size."""
    if sl.w_src_split is None:
        return {}
    n = int(sl.n_inner)
    return dict(own_split=shards.split_code(sl.train_mask[:n], sl.val_mask[:n], sl.test_mask[:n]),
                w_src_split=sl.w_src_split, slice_size=(int(sl.num_rows), int(np.asarray(sl.indices).shape[0])))


def model_for(manifest: dict, name: str, hidden: int, layers: int, **kw) -> ModelSpec:
    ds = manifest["dataset"]
    kw.setdefault("multilabel", ds.get("multilabel") is True)
    if "types" in ds:  # a heterogeneous set: the relational models' memory grows with the relations
        types = GraphTypes.from_record(ds["types"])
        kw.setdefault("relations", types.num_relations)
        kw.setdefault("relation_rows", types.relations_per_vertex())
        kw.setdefault("type_widths", tuple(types.width_of(int(ds["num_features"]))))
        kw.setdefault("type_counts", tuple(types.count(t) for t in types.names))
    return ModelSpec(name, int(ds["num_features"]), int(hidden), int(ds["num_classes"]), int(layers), **kw)


def set_arrays(path: str, manifest: dict, servers: List[ServerArrays], inductive: bool = False) -> SetArrays:
    """A shard set on disk as the modes' estimates read it (co-batches sample its server graphs); for an
    --inductive run, its induced graphs' views (memory_model/induced_sets.py), and without the
    train-induced hops only fb and cob (flx and eas refuse such a set)."""
    pre = manifest["preload"]
    args = (servers, pre["kind"], int(pre["hops"]), int(manifest["layers"]))
    kw: Dict[str, Any] = dict(source=path, server_graph=lambda a: shards.read_server_graph(path, manifest, a.server))
    if not inductive:
        return SetArrays(*args, **kw)
    if not shards.is_inductive(manifest):
        raise MemoryModelError(f"{path} is built without --inductive, which an --inductive run needs")
    ds = manifest["dataset"]
    return InductiveSetArrays(*args, **kw, modes=None if shards.has_train_hop(manifest) else ("fb", "cob"),
                              multilabel_classes=int(ds["num_classes"]) if ds.get("multilabel") is True else 0)


def estimate_shard_set(path: str, model: str, hidden: int, layers: Optional[int] = None, k: Optional[int] = None,
                       device: str = "cpu", **model_kw) -> List[dict]:
    """Per-rank estimates (`estimate`'s dicts) for a shard set on disk.  k defaults to the set's
    preload (min(hops, L)) for a full set, L (all layers on the EAS server view) for an EAS set."""
    manifest, servers = read_shard_set(path)
    L = int(layers or manifest["layers"])
    pre = manifest["preload"]
    if k is None:
        k = L if pre["kind"] == "eas" else min(int(pre["hops"]), L)
    if pre["kind"] == "full" and k > int(pre["hops"]):
        raise MemoryModelError(f"{path} preloads {pre['hops']} hop(s), which cannot run k = {k} preloaded layers")
    if not 0 <= int(k) <= L:
        raise MemoryModelError(f"k = {k} preloaded layers is outside 0..L = 0..{L}")
    m = model_for(manifest, model, hidden, L, **model_kw)
    rows = set_arrays(path, manifest, servers, m.inductive).rows(L, int(k), m)
    return [estimate(r, m, device) for r in rows]


def choose_shard_sets(paths: Sequence[str], model: str, hidden: int, layers: int, budget_bytes: int,
                      device: str = "cpu", batches: Sequence[int] = (2, 4, 8, 16, 32, 64), fanout: int = -1,
                      sampler: str = "sage", seed: int = 0, job: Optional[Tuple[int, int]] = None,
                      inductive: bool = False, rates_for: Optional[Callable[[ModelSpec, float], Rates]] = None,
                      exact_only: bool = False, device_memory: Optional[Tuple[int, int]] = None,
                      input_dropout: float = 0.0, **model_kw) -> Decision:
    """`--mode auto`: the options the shard sets offer (every mode's `estimate` on every set: full
    sets give fb and flx k <= hops, EAS sets eas, sets of L hops or EAS cob with each co-batch count
    in `batches`), estimated, and the choice for the budget.  inductive: the induced graphs' views of
    each inductive set (memory_model/induced_sets.py); a set without train-induced hops offers fb and
    cob only, named in the reason.

    rates_for: the time rule (`choose_by_time`): called once with the model and the in-degree of the graph
    the run trains on (choice.training_degree), it returns the measured Rates; None is the memory rule
    (GraNNDis' order, `choose`).
    exact_only: only the exact full-graph options (fb, flx) are considered.
    device_memory: (free, total) bytes of the GPU measured at start-up (usable_budget); None: not measured.
    input_dropout: the run's --input-dropout (the partial payloads refuse it: memory_model/payload.py; the
    reason says why where the model or the run refuses them).

    Reads every rank's slice of every set (features included) and samples the first co-batch on
    the calling process: call it on one rank and broadcast the Decision.  device="cuda" for a GPU
    run (bool dropout masks).  shard_set_options and ShardSetOptions.decide are its two halves (auto
    decides twice on the same options where it times the co-batch set-up)."""
    found = shard_set_options(paths, model, hidden, layers, budget_bytes, device, batches, fanout, sampler, seed, job,
                              inductive, exact_only, device_memory, input_dropout, **model_kw)
    return found.decide(rates_for)


@dataclasses.dataclass
class ShardSetOptions:
    """Every option of the shard sets, estimated (shard_set_options), and what a decision on them says beside."""

    found: list  # [Option]
    m: ModelSpec
    degree: float  # in-edges per row of the graph the run trains on (choice.training_degree)
    budget_bytes: int
    device: str
    exact_only: bool
    device_memory: Optional[Tuple[int, int]]
    left_out: List[str]
    skipped: List[str]
    # the overlapped path's (halo, boundary) rows per computed row in the baseline's epoch, where compute_rate
    # calibrates that path (choice.training_shape; None: no option computes on it)
    shape: Optional[Tuple[float, float]] = None

    def decide(self, rates_for: Optional[Callable[[ModelSpec, float], Rates]] = None) -> Decision:
        """The choice among the options (choose_shard_sets' rates_for); may be called again with other rates."""
        fits_in = usable_budget(self.budget_bytes, self.device, self.device_memory)
        found, exact_only, m = self.found, self.exact_only, self.m
        if rates_for is not None:
            decision = choose_by_time(found, fits_in, rates_for(m, self.degree), exact_only)
        else:
            decision = choose([o for o in found if exact(o) or not exact_only], fits_in)
            if exact_only and not all(exact(o) for o in found):
                decision = dataclasses.replace(decision, reason=decision.reason
                                               + "; the sampled modes left out (exact options only)")
        if self.device == "cuda":  # the context, NCCL's buffers and fragmentation first (choice.py)
            decision = dataclasses.replace(decision, reason=decision.reason + headroom_note(
                self.budget_bytes, fits_in, self.device_memory))
        if m.payload_refusal:
            decision = dataclasses.replace(decision, reason=decision.reason + refusal_note(m))
        if self.left_out:
            decision = dataclasses.replace(decision, reason=decision.reason + "; options not considered: "
                                           + "; ".join(self.left_out))
        if self.skipped:
            decision = dataclasses.replace(decision,
                                           reason=decision.reason + "; sets not considered: " + "; ".join(self.skipped))
        return decision


def shard_set_options(paths: Sequence[str], model: str, hidden: int, layers: int, budget_bytes: int,
                      device: str = "cpu", batches: Sequence[int] = (2, 4, 8, 16, 32, 64), fanout: int = -1,
                      sampler: str = "sage", seed: int = 0, job: Optional[Tuple[int, int]] = None,
                      inductive: bool = False, exact_only: bool = False,
                      device_memory: Optional[Tuple[int, int]] = None, input_dropout: float = 0.0,
                      **model_kw) -> ShardSetOptions:
    """choose_shard_sets' options, estimated, without the decision (its arguments, less rates_for)."""
    manifests = {path: shards.read_manifest(path) for path in paths}
    usable, skipped = fitting_sets(manifests, layers, job, inductive)
    if not usable:
        raise MemoryModelError("--mode auto: none of the shard sets can run this job: " + "; ".join(skipped))
    sampling = Sampling(tuple(batches), fanout, sampler, seed)
    found: list = []
    left_out: List[str] = []
    degree = 1.0
    m: Any = None
    for path in usable:
        manifest, servers = read_shard_set(path)
        ds = manifest["dataset"]
        types = GraphTypes.from_record(ds["types"]) if "types" in ds else None  # (a typed model is built with them)
        m = with_payloads(model_for(manifest, model, hidden, layers, inductive=inductive, **model_kw), input_dropout,
                          types)
        degree = int(ds.get("num_edges") or 0) / max(1, int(ds.get("num_vertices") or 1))
        s = set_arrays(path, manifest, servers, inductive)
        found += options(row_groups(s, layers, m, sampling), m, int(manifest["servers"]), device)
        if s.modes is not None:  # an inductive set built before graph/train_hop existed
            left_out.append(f"flx and eas on {path}, which holds no train-induced hops (graph/train_hop: built by an "
                            f"earlier version); rebuild it with `granndis preprocess build ... --inductive --out "
                            f"{path} --overwrite` to offer them")
    return ShardSetOptions(found, m, training_degree(found, m, degree), int(budget_bytes), device, exact_only,
                           device_memory, left_out, skipped, training_shape(found))


def fitting_sets(manifests: Dict[str, dict], layers: int, job: Optional[Tuple[int, int]],
                 inductive: bool = False) -> Tuple[list, list]:
    """(the shard sets --mode auto may choose among, why each other one is left out).  Every set must
    hold the same dataset (one content digest: otherwise a list of a CiteSeer and a Cora set
    would train one of them silently), else MemoryModelError; a set built for another S x G than the job's is
    left out (it would be picked and then refused)."""
    def dataset(m):
        ds = m["dataset"]
        return ds.get("content_sha256") or f"name {ds.get('name')!r}"
    kinds: Dict[str, Any] = {}
    for path, m in manifests.items():
        kinds.setdefault(dataset(m), []).append(f"{path} ({m['dataset'].get('name')})")
    if len(kinds) > 1:
        raise MemoryModelError("--mode auto: --shards lists sets of different datasets (content digests differ: "
                               + " vs ".join(", ".join(v) for v in kinds.values())
                               + "); give sets built from one dataset")
    usable, skipped = [], []
    for path, m in manifests.items():
        S, G = int(m["servers"]), int(m["gpus_per_server"])
        if job is not None and (S, G) != tuple(job):
            skipped.append(f"{path} is built for {S} servers x {G} GPUs, this job runs {job[0]} x {job[1]}")
        elif inductive and not shards.is_inductive(m):
            skipped.append(f"{path} is built without --inductive, which this job trains with")
        else:
            usable.append(path)
    return usable, skipped
