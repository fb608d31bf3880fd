"""The device check's MPI program (run by bench/gpu_check_driver.py on every rank): every training mode
with overlap on and off and bf16 halos on the device, against the same run on the CPU.

For each case it trains a few epochs on `--device` (dropout 0, so the runs are comparable; the `exact`
case trains with dropout 0.5, whose keyed masks are the same on both, and compares the parameters too), then counts
the host synchronisations of one steady step per mode (cluster/hostsync.SyncCounter: on a GPU every
call it records really waits), reads the peak reserved and allocated device memory and the epoch
times, and compares the full-graph logits with the same case trained on the CPU (float32 sums in
another order: a relative tolerance; bf16 halos: a looser one).  Rank 0 prints one JSON line per case
and writes them to --out; the exit status is non-zero when any case mismatches, breaks its host-sync rule
or fails.  The rule: one host sync per step (the loss), cob's and mb's per-step graph builds aside; the
`--no-overlap` order waits for each staged exchange's copy on purpose (cluster/staging.wait_event), so its
cases may add those waits and nothing else.

--device cpu (the smoke check of this script's own logic, no GPU needed): the "device" run uses the GPU
code's host staging emulated on the CPU (--host-staging) and is compared with the plain run;
--intra-transport gloo stands in for NCCL there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

from granndis_hpc.mpistart import init_mpi, thread_level_name

# As granndis-train does: this rank's GPU is set from its local rank before MPI starts (mpistart.py).
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--device", default="cuda")
STARTED = init_mpi(_early.parse_known_args()[0].device)

from mpi4py import MPI  # noqa: E402

from granndis_hpc.cluster.hostsync import SyncCounter
from granndis_hpc.options.train import TrainConfig
from granndis_hpc.engine.trainer import Trainer

WORLD = MPI.COMM_WORLD
CASES = [  # (name, TrainConfig overrides)
    ("fb", {"mode": "fb"}),
    ("fb-noovl", {"mode": "fb", "no_overlap": True}),
    ("fb-bf16", {"mode": "fb", "halo_dtype": "bfloat16"}),
    ("fb-precision-bf16", {"mode": "fb", "precision": "bf16"}),  # autocast on the device and on the CPU
    ("flx", {"mode": "flx", "overlap_halos": "all"}),
    ("flx-noovl", {"mode": "flx", "no_overlap": True}),
    ("cob", {"mode": "cob", "batches_per_epoch": 2, "fanout": 5}),
    ("cob-noovl", {"mode": "cob", "batches_per_epoch": 2, "fanout": 5, "no_overlap": True}),
    ("eas", {"mode": "eas"}),  # on --eas-shards
    ("mb", {"mode": "mb", "batches_per_epoch": 2, "fanout": 5}),
    ("exact", {"mode": "fb", "dropout": 0.5}),  # logits and parameters, keyed dropout masks
]
BATCHED = ("cob", "mb")  # a co-batch's graphs are new each step: their matrices are built in it
STAGING_WAIT = "granndis_hpc/cluster/staging.py"


def _config(args, device, overrides, staged=False):
    shards = args.eas_shards if overrides["mode"] == "eas" else args.shards
    cfg = dict(host_staging=staged, share_gpus=args.share_gpus, shards=shards, model="sage", layers=args.layers,
               hidden=64, epochs=args.epochs, lr=0.01,
               dropout=0.0, eval_every=0, ranks_per_server=args.ranks_per_server, quiet=True, device=device,
               intra_transport=args.intra_transport if device != "cpu" or staged else "auto")
    cfg.update(overrides)
    return TrainConfig(**cfg)


def _logits_by_gid(trainer):
    gid = trainer.slice.global_id[: trainer.slice.n_inner]
    with torch.no_grad():
        values = trainer.inner_logits().detach().double().cpu().numpy()
    parts = WORLD.gather((gid, values), root=0)
    if WORLD.rank != 0:
        return None
    out = np.zeros((sum(g.size for g, _ in parts), parts[0][1].shape[1]))
    for g, v in parts:
        out[g] = v
    return out


def _run(args, device, overrides, staged=False):
    """Train; returns (logits on rank 0, facts of this rank)."""
    trainer = Trainer(_config(args, device, overrides, staged))
    cuda = trainer.device.type == "cuda"
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(trainer.device)
        times = [trainer.train_epoch()["time_s"] for _ in range(args.epochs - 1)]
        per_step, step = [], trainer.train_step

        def counted(s):  # the last epoch's steps, counted
            with SyncCounter() as counter:
                out = step(s)
            per_step.append([c for c in counter.calls if not (overrides["mode"] in BATCHED and "nn/graph.py" in c[1])])
            return out
        trainer.train_step = counted
        rec = trainer.train_epoch()
        trainer.train_step = step
        times.append(rec["time_s"])
        facts = {"syncs_per_step": max(len(c) for c in per_step),
                 "other_syncs": sorted({w for c in per_step for n,
                                        w in c if n != "__float__" and STAGING_WAIT not in w}),
                 "loader_stream": _loader_facts(trainer),
                 # the topology's agreed GPU is the one set before MPI started (block placement)
                 "same_gpu_as_before_mpi": (not cuda) or trainer.device.index == STARTED["gpu"],
                 "sync_calls": sorted({w for c in per_step for _, w in c}),
                 "epoch_s": times, "loss": rec["loss"], "bytes": rec["bytes"],
                 "peak_reserved_mib": (torch.cuda.max_memory_reserved(trainer.device) >> 20) if cuda else None,
                 "peak_allocated_mib": (torch.cuda.max_memory_allocated(trainer.device) >> 20) if cuda else None}
        logits = _logits_by_gid(trainer)
        facts["params"] = {k: v.detach().double().cpu().numpy() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    return logits, facts


def _loader_facts(trainer):
    """cob/mb: the co-batch loader's stream (engine/cobstream.py) made every co-batch's tensors in the
    loader thread and each step waited for its event; None in the other modes."""
    batches = getattr(trainer.mode, "batches", None)
    if batches is None:
        return None
    loader = batches.loader
    return {"active": loader.active, "puts": loader.puts, "waits": loader.waits, "held": loader.collect(),
            "in_loader": all(n.startswith("cobatch-loader") for n in loader.put_threads)}


class _Done(Exception):
    """A case whose result is complete."""


def _startup_facts(args):
    """Rank 0: whether every rank set its GPU before MPI started (and still uses it) and MPI gives the
    thread level GPU training needs; None elsewhere."""
    cuda = args.device == "cuda"
    mine = dict(STARTED, current=torch.cuda.current_device() if cuda else None)
    everyone = WORLD.gather(mine, root=0)
    if WORLD.rank != 0:
        return None
    ok = all(not f["already"] and (not cuda or (f["gpu"] is not None and f["current"] == f["gpu"]
                                                and f["thread_level"] >= MPI.THREAD_SERIALIZED)) for f in everyone)
    return {"ok": bool(ok), "gpu_before_mpi": [f["gpu"] for f in everyone],
            "local_rank_from": sorted({f["source"] or "(none)" for f in everyone}),
            "thread_level": sorted({thread_level_name(f["thread_level"]) for f in everyone})}


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _verdict(name, overrides, args, facts_all, dev_logits, cpu_logits, params):
    """Rank 0: the case's result from every rank's facts."""
    tol = 2e-2 if "halo_dtype" in overrides or "precision" in overrides else args.tolerance
    err = _rel(dev_logits, cpu_logits)
    syncs = max(f["syncs_per_step"] for f in facts_all)
    other = sorted({w for f in facts_all for w in f["other_syncs"]})
    noovl = bool(overrides.get("no_overlap"))
    # no overlap: the loss plus the staging waits that order makes on purpose, nothing else
    sync_ok = not other if noovl else syncs <= 1
    same_gpu = all(f["same_gpu_as_before_mpi"] for f in facts_all)
    loader = [f["loader_stream"] for f in facts_all if f["loader_stream"] is not None]
    loader_ok = all(f["active"] and f["waits"] > 0 and f["in_loader"] for f in loader)
    ok = err < tol and sync_ok and np.isfinite(dev_logits).all() and same_gpu and loader_ok
    out = dict(same_gpu_as_before_mpi=same_gpu, loader_stream=loader[:1] or None, logits_rel_err=err, tolerance=tol,
               syncs_per_step=syncs, sync_rule="loss + staging waits (no overlap)" if noovl else "one (the loss)",
               sync_ok=bool(sync_ok), unexpected_syncs=other if noovl else None,
               sync_calls=sorted({w for f in facts_all for w in f["sync_calls"]}),
               epoch_s=facts_all[0]["epoch_s"], loss=facts_all[0]["loss"], bytes=facts_all[0]["bytes"],
               peak_reserved_mib=[f["peak_reserved_mib"] for f in facts_all],
               peak_allocated_mib=[f["peak_allocated_mib"] for f in facts_all])
    if params is not None:
        dev, cpu = params
        out["params_rel_err"] = max(_rel(dev[k], cpu[k]) for k in cpu)
        out["params"] = len(cpu)
        ok = ok and out["params_rel_err"] < tol and set(dev) == set(cpu)
    out["ok"] = bool(ok)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--eas-shards", help="the same graph and shape built with --preload eas (case eas)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ranks-per-server", type=int, default=1)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--intra-transport", default="auto")
    p.add_argument("--share-gpus", action="store_true", help="the ranks may share the GPU(s) (emulated servers)")
    p.add_argument("--cases", default=",".join(n for n, _ in CASES))
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    wanted = args.cases.split(",")
    failures = 0
    for name, overrides in [("startup", None)] + CASES:
        if name not in wanted and name != "startup":
            continue
        shards = args.eas_shards if name == "eas" else args.shards
        result = {"case": name, "shards": os.path.basename(os.path.normpath(shards or "")), "device": args.device}
        try:
            if overrides is None:
                result.update(_startup_facts(args) or {})
                raise _Done
            start = time.perf_counter()
            dev_logits, facts = _run(args, args.device, overrides, staged=args.device == "cpu")
            cpu_logits, cpu_facts = _run(args, "cpu", overrides)
            dev_params, cpu_params = facts.pop("params"), cpu_facts.pop("params")  # replicated: rank 0's
            facts_all = WORLD.gather(facts, root=0)
            if WORLD.rank == 0:
                result.update(_verdict(name, overrides, args, facts_all, dev_logits, cpu_logits,
                                       (dev_params, cpu_params) if name == "exact" else None))
                result["wall_s"] = round(time.perf_counter() - start, 1)
        except _Done:
            pass
        except Exception:  # noqa: BLE001 -- reported as a failed case; the other cases still run
            result.update(ok=False, error=traceback.format_exc(limit=3))
        oks = WORLD.allgather(result.get("ok", False) if WORLD.rank == 0 or "error" in result else True)
        result["ok"] = all(oks)
        failures += not result["ok"]
        if WORLD.rank == 0:
            print(json.dumps(result), flush=True)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(result) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
