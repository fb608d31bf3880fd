"""--resume's rules: which options a resumed run takes from RUN_DIR/config.json and which may be given
again with another value (`granndis-train --resume` and the Python API's ``train(resume=...)``)."""
from __future__ import annotations

import os
from typing import Dict

from granndis_hpc.config import TrainConfig
from granndis_hpc.options import resume_rule, specs

# Options that may be given again with another value together with --resume (TrainConfig's on_resume
# metadata): they change nothing the trajectory depends on, or are checked otherwise (`shards`,
# `ranks_per_server`, `mode` and `preloaded_layers` may differ because they are the checkpoint
# fingerprint's shape: the same shard set, layout and mode, or, in the exact modes, any shard set of
# the same dataset, rundir/checkpoint.py).  `out` is the run directory itself.  "reset" options
# (overwrite_run) are not carried over from the run being resumed.
RESUME_OVERRIDABLE = resume_rule(TrainConfig, "may_change")
RESUME_RESET = resume_rule(TrainConfig, "reset")
# The overridable options that are the checkpoint's shape (may change only as far as it allows).
RESUME_SHAPE = sorted(s.name for s in specs(TrainConfig) if s.meta.get("resume_shape"))


def resume_config(saved: Dict, given: Dict, run_dir: str, defaults: Dict) -> Dict:
    """The options of a resumed run: RUN_DIR/config.json (`saved`), with options given again on the
    command line or in --config (`given`) allowed to differ only where RESUME_OVERRIDABLE says so.
    `defaults` maps every option the trainer takes to its default (what a run whose config.json
    predates an option ran with); other keys, in either dict, are dropped."""
    from granndis_hpc.rundir.checkpoint_files import CheckpointError

    run_dir = os.fspath(run_dir)
    ran_with = {k: (d if k in RESUME_RESET else saved.get(k, d)) for k, d in defaults.items()}
    refused = [f"{k}={given[k]!r} (the run has {ran_with[k]!r})" for k in sorted(given)
               if k in defaults and k not in RESUME_OVERRIDABLE | RESUME_RESET and given[k] != ran_with[k]]
    out = given.get("out")
    if out is not None and os.path.realpath(out) != os.path.realpath(run_dir):
        refused.append(f"out={out!r} (a resumed run writes into the run directory {run_dir!r})")
    if refused:
        raise CheckpointError(
            f"--resume {run_dir} continues that run with its own settings ({os.path.join(run_dir, 'config.json')}); "
            f"these options differ: {', '.join(refused)}.  Only "
            f"{', '.join(sorted(RESUME_OVERRIDABLE - {'resume', 'out'}))} may change on resume "
            f"({', '.join(RESUME_SHAPE[:-1])} and {RESUME_SHAPE[-1]} as far as the checkpoint allows); start a new run "
            f"(another --out) to change anything else")
    merged = dict(ran_with)
    merged.update({k: v for k, v in given.items() if k in defaults})
    merged["out"], merged["resume"] = run_dir, run_dir
    return merged
