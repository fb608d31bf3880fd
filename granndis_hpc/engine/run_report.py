"""What a run says about itself: the start-up banner (rank 0's first line), the epoch and early-stopping
lines' output, and the summary.json entries on where start-up went, the links the job ran on, how it
communicated and what computed."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from granndis_hpc import link_classes
from granndis_hpc.engine.startup_clock import PHASES, StartupClock
from granndis_hpc.nn import cpu_kernels


def banner(cfg, mode, manifest: Dict, topo) -> str:
    """What this run trains, in one line: mode (auto's choice), exactness, model, protocol, dataset, shape,
    device and epochs."""
    chosen = " (chosen by --mode auto)" if getattr(mode, "decision", None) else ""
    exact = "exact full-graph" if mode.exact(manifest) else "sampled"
    head = f", {cfg.linear_layers} Linear" if cfg.linear_layers else ""
    return (f"granndis train: mode {cfg.mode}{chosen}, {exact} | model {cfg.model} ({cfg.layers} layers{head}, "
            f"hidden {cfg.hidden}) | {'inductive' if cfg.inductive else 'transductive'} | dataset "
            f"{manifest['dataset'].get('name')}{_types_phrase(manifest['dataset'])} | {topo.servers} server(s) x "
            f"{topo.ranks_per_server} rank(s) on "
            f"{topo.device.type} | {cfg.epochs} epochs")


def header(cfg, mode, manifest: Dict, topo, links: Optional[Dict]) -> str:
    """Rank 0's first lines: the banner, the job's layout (which host each server is) and, when the links
    were measured, their verdict."""
    lines = [banner(cfg, mode, manifest, topo), topo.describe()]
    if links is not None:
        lines.append(link_classes.verdict(links))
    return "\n".join(lines)


def _types_phrase(dataset: Dict) -> str:
    """A heterogeneous dataset's types in the banner: " (3 vertex types, 4 relations; target author)"."""
    types = dataset.get("types")
    if not types:
        return ""
    return (f" ({len(types['vertex_types'])} vertex types, {len(types['relations'])} relations; target "
            f"{types['target']})")


def startup_entries(comm, clock: StartupClock, started_s: float) -> Dict:
    """summary.json's startup_s (the slowest rank's seconds per phase, and process creation to the first
    epoch in `total`) and wall_s (process creation to now); collective (a max over the ranks)."""
    slowest = comm.allreduce_scalar(np.array(clock.vector() + [started_s, clock.elapsed()]), "max")
    return {"startup_s": {**{p: round(float(v), 4) for p, v in zip(PHASES, slowest)},
                          "total": round(float(slowest[-2]), 4)},
            "wall_s": round(float(slowest[-1]), 4)}


def links_entry(links: Optional[Dict]) -> Optional[Dict]:
    """summary.json's links: the start-up measurement (cluster/linkcheck.py), its ratio and verdict."""
    if links is None:
        return None
    return {**links, "ratio": link_classes.ratio(links), "verdict": link_classes.verdict(links)}


def compute_entry(device: torch.device) -> Dict:
    """summary.json's compute: the device, threads, and on the CPU which kernels ran (nn/cpu_kernels.py)."""
    cpu = device.type == "cpu"
    return {"device": device.type, "threads_per_rank": torch.get_num_threads(),
            "kernels": cpu_kernels.kernel_name() if cpu else "torch",
            "kernel_dispatch": cpu_kernels.dispatch() if cpu else None,
            "deterministic": torch.are_deterministic_algorithms_enabled()}


def say(line: str, bar) -> None:
    """Print one of rank 0's lines; with a progress bar drawn, on the bar's own stream, which it clears and
    redraws around the line, so that the two never interleave."""
    if bar.disable:
        print(line, flush=True)
    else:
        bar.write(line, file=bar.fp)


def early_stop_line(patience: int, last_epoch: int, trained: int, best: Dict) -> str:
    """--patience ended the run: epochs numbered as the epoch lines and metrics.jsonl number them (from 0)."""
    return (f"early stopping: no better validation metric in the last {patience} evaluations; stopped after "
            f"epoch {last_epoch} ({trained} epochs trained; best: epoch {best['epoch']})")


def communication_entry(cfg, overlap_halo, gradsync, precision, wire_exact: bool) -> Dict:
    """How training communicated (summary.json's plan): overlap, the halo route, and the halo wire dtype, which makes an
    otherwise exact mode inexact when it is narrower than float32."""
    entry = {"overlap": not cfg.no_overlap, "overlap_halos": sorted(overlap_halo), "halo_dtype": cfg.halo_dtype,
             "halo_route": cfg.halo_route, "halo_payload": cfg.halo_payload, **precision.entry()}
    if gradsync is not None:  # the gradient buckets' bytes, in posting order (the first final first)
        entry["gradient_buckets_bytes"] = gradsync.bucket_bytes()
    if not wire_exact and precision.exact:
        entry["exact"] = False
        entry["inexact_because"] = f"--halo-dtype {cfg.halo_dtype}: halo rows are rounded on the wire"
    return entry
