"""A checkpoint is trusted only through a complete, well-formed COMPLETE.json: a damaged one is refused
naming the file and the fix, never skipped (which resumed an older checkpoint or restarted the run
unchecked)."""
import json
import os

import pytest
import torch

from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.rundir import checkpoint as ck
from granndis_hpc.rundir import checkpoint_files as cf
from tests.unit.test_checkpoint import FP, SELF, _save, _trained


def _edit(path, edit):
    marker = os.path.join(path, cf.COMPLETE)
    manifest = json.loads(open(marker).read())
    edit(manifest)
    with open(marker, "w") as f:
        f.write(json.dumps(manifest))


EDITS = {
    "fingerprint [1]": (lambda m: m.update(fingerprint=[1]), "fingerprint is '\\[1\\]'"),
    "fingerprint {}": (lambda m: m.update(fingerprint={}), "fingerprint is '{}'"),
    "files []": (lambda m: m.update(files=[]), "files is '\\[\\]', which does not list state.pt"),
    "files {}": (lambda m: m.update(files={}), "which does not list state.pt"),
    "no fingerprint": (lambda m: m.pop("fingerprint"), "it has no 'fingerprint'"),
    "world_size 0": (lambda m: m.update(world_size=0), "world_size is 0, not a rank count >= 1"),
    "epoch of another directory": (lambda m: m.update(epoch=1), "epoch is 1 in the directory of epoch 2"),
    "no checksum": (lambda m: m["files"]["state.pt"].pop("sha256"), "entry for 'state.pt' is not"),
    "a path as file name": (lambda m: m["files"].update({"../x.pt": {"name": "../x.pt", "bytes": 1,
                                                                     "sha256": "0" * 64}}),
                            "entry for '../x.pt' is not"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_a_damaged_complete_json_is_refused_not_skipped(tmp_path, case):
    model, opt = _trained()
    _save(tmp_path, 1, model, opt)
    path = _save(tmp_path, 2, model, opt)
    edit, expect = EDITS[case]
    _edit(path, edit)
    with pytest.raises(ClusterError, match=r"epoch-000002/COMPLETE\.json is damaged \(.*" + expect
                       + r".*Fix: delete .*epoch-000002 to resume from the checkpoint before it"):
        ck.load_latest(SELF, str(tmp_path), FP)
    fresh, fresh_opt = _trained(seed=1)
    with pytest.raises(ClusterError, match="is damaged"):  # the resume itself stops (was: epoch 1 or 0)
        ck.CheckpointManager(SELF, str(tmp_path), FP, fresh, fresh_opt, torch.device("cpu")).load(max_epoch=5)


def test_a_marker_that_is_not_json_is_refused_and_an_older_damaged_one_is_pruned(tmp_path):
    model, opt = _trained()
    path = _save(tmp_path, 1, model, opt)
    with open(os.path.join(path, cf.COMPLETE), "w") as f:
        f.write("{\"epoch\": 1, ")
    with pytest.raises(cf.CheckpointError, match=r"is damaged \(not readable JSON"):
        cf.latest_complete(str(tmp_path))
    # A newer intact checkpoint is used, and the damaged older one goes with the next pruning.
    _save(tmp_path, 2, model, opt)
    _save(tmp_path, 3, model, opt)
    assert cf.latest_complete(str(tmp_path)).epoch == 3
    assert [e for e, _, _ in cf.list_checkpoints(str(tmp_path))] == [2, 3]


def test_a_checkpoint_with_non_finite_parameters_is_named_as_such(tmp_path):
    """NaN weights in state.pt (checksums recomputed) were resumed and blamed an epoch later on --lr."""
    model, opt = _trained()
    with torch.no_grad():
        model[0].weight[1, 2] = float("nan")
    _save(tmp_path, 1, model, opt)
    with pytest.raises(ClusterError, match=r"state\.pt is not a valid granndis checkpoint \(its model parameter "
                                           r"'0\.weight' holds NaN or infinite values; resume from an earlier"):
        ck.load_latest(SELF, str(tmp_path), FP)
