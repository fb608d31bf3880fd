"""The registries of models and modes (granndis_hpc/registry.py): names and capabilities without
torch, the lazy declarations resolving to what they name, and the capabilities that replaced the
lists kept elsewhere (config's checkpointable models, memory_model's model list, mode names compared
as strings in the memory model and in `preprocess plan`)."""
import subprocess
import sys

import pytest

from granndis_hpc import registry
from granndis_hpc.options import ConfigError
from granndis_hpc.options.train import TrainConfig
from tests.pyg_factories import PYG_HETERO_OPTIONS, PYG_OPTIONS


def test_building_the_train_parser_imports_neither_torch_h5py_nor_mpi4py():
    """options/train_groups.py lists the modes from the registry, not the engine, so building the parser loads neither
    torch, h5py nor mpi4py.  In a fresh interpreter: build it, check an option, list sys.modules."""
    code = ("import sys\n"
            "from granndis_hpc.options import build_parser\n"
            "from granndis_hpc.options.train import TrainConfig\n"
            "p = build_parser(TrainConfig)\n"
            "ns = p.parse_args(['--shards', 'x', '--mode', 'auto', '--memory-per-gpu', '1GiB', '--model', 'ressage',"
            " '--checkpoint-activations'])\n"
            "TrainConfig(**{k: v for k, v in vars(ns).items() if k != 'config'})\n"
            "print(sorted(m for m in ('torch', 'h5py', 'mpi4py', 'granndis_hpc.engine') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_lazy_declarations_name_what_they_stand_for():
    from granndis_hpc.engine import modes
    from granndis_hpc.memory_model import stacks
    from granndis_hpc.nn import models
    from tests.hetero_reference import random_typed_graph

    assert modes.MODES is registry.MODES and models.MODELS is registry.MODELS
    for entry in registry.MODES.entries():
        assert entry.load().name == entry.name  # the class registered under its own name
        if entry.get("estimate") is not None:
            assert callable(entry.resolve("estimate"))
    for entry in registry.MODELS.entries():
        if entry.name.startswith("pyg") and not PYG_OPTIONS:
            continue  # (torch_geometric absent)
        kw = dict({"pyg": PYG_OPTIONS, "pyg-hetero": PYG_HETERO_OPTIONS}.get(entry.name, {}))
        kw.update({"types": random_typed_graph(0)[0]} if entry.get("typed") else {})
        model = models.build_model(entry.name, 6, 4, 3, 2, **kw)
        assert model.name == entry.name and isinstance(entry.resolve("estimator"), stacks.ModelEstimate)
    # auto's order, as the entries rank themselves (memory_model.choice.preference reads them).
    assert [e.name for e in registry.auto_modes()] == ["flx", "eas", "cob", "fb"]


def test_model_options_and_mode_needs_are_checked_at_parse_time():
    from tests import recipe_model

    with pytest.raises(ConfigError, match="no extra constructor options"):
        TrainConfig(shards="x", model="sage", model_option=["heads=4"])
    with pytest.raises(ConfigError, match="--memory-per-gpu SIZE"):
        TrainConfig(shards="x", mode="auto")
    with pytest.raises(ConfigError, match="only ressage has"):
        TrainConfig(shards="x", model="gcn", checkpoint_activations=True)
    recipe_model.register()
    try:
        assert TrainConfig(shards="x", model=recipe_model.NAME, model_option=["widen=2"]).model_option
        assert registry.model_options(recipe_model.NAME, ["widen=2"]) == {"widen": 2}
        assert registry.model_options(recipe_model.NAME) == {"widen": 1}
        with pytest.raises(ConfigError, match="widen must be of type int"):
            TrainConfig(shards="x", model=recipe_model.NAME, model_option=["widen=wide"])
        with pytest.raises(ConfigError, match=r"the options widen \(int, default 1\)"):
            TrainConfig(shards="x", model=recipe_model.NAME, model_option=["heads=2"])
        assert not registry.checkpointable(recipe_model.NAME)
    finally:
        recipe_model.unregister()
    assert recipe_model.NAME not in registry.MODELS


def test_a_registered_mode_takes_its_place_in_autos_order():
    """The recipe "add a mode", step 4: a mode class with a rank, a phrase and an estimate is estimated
    by row_groups, ranked by preference and named in choose's reason where its rank puts it."""
    import numpy as np

    from granndis_hpc import memory_model as mm
    from granndis_hpc.engine import modes
    from tests.unit.test_memory_model import _random_plan

    rows, _, _ = _random_plan(np.random.default_rng(3), 3)
    calls = []

    def ranked_rows(s, layers, m, sampling):
        calls.append(s.source)
        return [mm.RowGroup("recipe-ranked", [rows], k=layers, source=s.source)]

    class Ranked(modes.StaticMode):
        name, help = "recipe-ranked", "a mode auto ranks between flx and eas"
        rank, phrase = 0.5, "the recipe's mode"
        estimate = staticmethod(ranked_rows)

    modes.register(Ranked)
    try:
        m = mm.ModelSpec("sage", rows.features, 16, rows.num_classes, 3)
        s = mm.SetArrays([], "full", 3, 3, source="set", world_sent=np.zeros(0, np.int64), sample_cobatches=False)
        groups = [g for g in mm.row_groups(s, 3, m, mm.Sampling()) if g.mode == Ranked.name]
        assert calls == ["set"] and len(groups) == 1
        mine = mm.options(groups, m, 2)[0]
        flx = mm.Option(mode="flx", k=3, peak=mine.peak + 1)
        eas = mm.Option(mode="eas", k=3, peak=1)
        d = mm.choose([eas, flx, mine], mine.peak)
        assert d.choice is mine and [o.label for o in d.rejected] == ["flx k=3"]
        assert "(flx with the largest k, then the recipe's mode, then EAS, then cob" in d.reason
        assert mm.choose([eas, flx, mine], mine.peak + 1).choice is flx
    finally:
        modes.MODES.pop(Ranked.name)
    assert "the recipe's mode" not in mm.order_text()
