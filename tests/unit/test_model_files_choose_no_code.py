"""A model file or a run's config.json records a model's options; it never chooses the code that runs
(docs/reliability.md, "Trust boundary").  `--model pyg`'s module and factory come from the user only:
`granndis predict --model-option`, the run's own options with --init-from / --eval-only, and again with
--resume; what a file records is checked as data, and non-finite parameters are refused.

On one rank in this process (the refusals are the collective ones mpirun's ranks share); the user's
code is a module written into tmp_path that leaves a marker file when it is imported."""
import sys

import pytest
import torch

from granndis_hpc import cli, shards
from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.engine.model_source import ModelSourceError, model_provenance, read_model_source
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.nn.graph import LayerGraph
from granndis_hpc.nn.models import build_model
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")

ARCH = {"model": "sage", "hidden": 8, "layers": 2, "norm": False, "dropout": 0.0, "input_dropout": 0.0,
        "model_option": None}
PYG = ["module=tests.pyg_factories", "factory=gatv2"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("trust")
    graph = make_graph(n=200, m=800)
    build(graph, base / "shards", servers=1, gpus_per_server=1)
    return base, graph, shards.read_manifest(str(base / "shards"))


def save_model(toy, run, net, **config):
    """RUN/best-model.pt of `net`'s parameters, recording ARCH with `config` on top."""
    base, _, manifest = toy
    run.mkdir(exist_ok=True)
    prov = model_provenance(dict(ARCH, shards=str(base / "shards"), **config), manifest)
    torch.save({"epoch": 1, "model": net.state_dict(), "provenance": prov}, run / "best-model.pt")
    return run


def sage():
    torch.manual_seed(1)
    return build_model("sage", 7, 8, 5, 2, dropout=0.0, norm=False)


def predict(toy, run, out, *extra):
    base = toy[0]
    return cli.run_predict(["--model", str(run), "--shards", str(base / "shards"), "--out", str(out),
                            "--ranks-per-server", "1", "--quiet", *map(str, extra)])


def train(toy, out, *extra):
    return cli.run_training(["--shards", str(toy[0] / "shards"), "--ranks-per-server", "1", "--layers", "2",
                             "--hidden", "8", "--mode", "fb", "--out", str(out), "--quiet", *map(str, extra)])


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """(name, marker): an importable module that creates `marker` when it is imported."""
    name = f"user_code_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                  f"def build(*args):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    yield name, marker
    sys.modules.pop(name, None)


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_an_edited_model_file_naming_code_imports_nothing(toy, tmp_path, marker_module):
    """best-model.pt edited to say model=pyg, module=M, factory=F: predict, --init-from and --eval-only
    refuse it, naming what it records and the options to add; M is never imported."""
    name, marker = marker_module
    run = save_model(toy, tmp_path / "edited", sage(), model="pyg", model_option=[f"module={name}", "factory=build"])
    flags = f"--model-option module={name} --model-option factory=build"
    with pytest.raises(ClusterError) as info:
        predict(toy, run, tmp_path / "p.h5")
    assert f"records --model pyg with code to import ({flags})" in one_line(info)
    assert f"a file never chooses the code that runs: if you trust that code, name it yourself: add {flags}" \
        in str(info.value)
    for extra in ([], ["--eval-only"]):
        with pytest.raises(ClusterError, match=rf"--init-from {run}: .* add {flags}") as info:
            train(toy, tmp_path / f"run{len(extra)}", "--model", "pyg", "--init-from", run, *extra)
        one_line(info)
    assert not marker.exists() and not (tmp_path / "p.h5").exists()


def test_resume_imports_only_the_code_named_again(toy, tmp_path, marker_module):
    """A run's config.json edited to name a module: --resume refuses it until the user names the code."""
    name, marker = marker_module
    run = tmp_path / "run"
    train(toy, run, "--epochs", "1", "--checkpoint-every", "1")
    config = (run / "config.json").read_text()
    (run / "config.json").write_text(config.replace('"model": "sage"', '"model": "pyg"').replace(
        '"model_option": null', f'"model_option": ["module={name}"]'))
    with pytest.raises(ClusterError) as info:
        cli.run_training(["--resume", str(run), "--epochs", "2", "--quiet"])
    assert f"--resume {run}: {run}/config.json records --model pyg with code to import (--model-option " \
           f"module={name} --model-option factory=build)" in one_line(info)
    assert info.value.exit_code == 2 and not marker.exists()


def test_predict_init_from_and_resume_with_the_code_named_again(toy, tmp_path):
    """The code named as the file records it (in any order, factory's default written or not) rebuilds the
    model: predict gives the whole-graph forward's logits, --eval-only evaluates it, --resume continues;
    other code is refused with both named."""
    pytest.importorskip("torch_geometric")
    base, graph, _ = toy
    torch.manual_seed(2)
    model = build_model("pyg", 7, 8, 5, 2, dropout=0.0, norm=False, module="tests.pyg_factories",
                        factory="gatv2").eval()
    run = save_model(toy, tmp_path / "pyg", model, model="pyg", model_option=PYG)
    predict(toy, run, tmp_path / "p.h5", "--model-option", PYG[1], "--model-option", PYG[0])
    got, _ = read_output(str(tmp_path / "p.h5"))
    whole = LayerGraph.from_csr(torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices), 200)
    with torch.no_grad():
        want = model(torch.from_numpy(graph.features), [whole, whole])
    torch.testing.assert_close(torch.from_numpy(got["logits"]), want, rtol=1e-4, atol=1e-5)
    other = "--model-option module=tests.pyg_factories --model-option factory=attention"
    with pytest.raises(ClusterError) as info:
        predict(toy, run, tmp_path / "q.h5", *other.split())
    assert f"the code you name ({other}) is not the code {run}/best-model.pt records " \
           f"(--model-option module=tests.pyg_factories --model-option factory=gatv2)" in one_line(info)
    summary = train(toy, tmp_path / "eval", "--model", "pyg", "--model-option", PYG[1], "--model-option", PYG[0],
                    "--init-from", run, "--eval-only")
    assert summary["epochs"] == 0 and summary["init_from"]["model_path"] == str(run / "best-model.pt")
    with pytest.raises(ClusterError, match=r"the code you name .*factory=attention\) is not the code"):
        train(toy, tmp_path / "e2", "--model", "pyg", *other.split(), "--init-from", run, "--eval-only")
    resumed = tmp_path / "resumed"
    train(toy, resumed, "--model", "pyg", *[w for o in PYG for w in ("--model-option", o)], "--epochs", "1",
          "--checkpoint-every", "1")
    with pytest.raises(ClusterError, match=r"records --model pyg with code to import"):
        cli.run_training(["--resume", str(resumed), "--epochs", "2", "--quiet"])
    summary = cli.run_training(["--resume", str(resumed), "--epochs", "2", "--quiet", "--model-option", PYG[0],
                                "--model-option", PYG[1]])
    assert summary["epochs"] == 2


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_parameters_are_refused(toy, tmp_path, value):
    """An all-NaN (or infinite) best-model.pt would predict NaN logits and class 0 everywhere with exit 0."""
    model = sage()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    run = save_model(toy, tmp_path / "bad", model)
    with pytest.raises(ClusterError) as info:
        predict(toy, run, tmp_path / "p.h5")
    assert "its model parameter 'convs.0.lin_self.weight' holds NaN or infinite values" in one_line(info)
    with pytest.raises(ClusterError, match="holds NaN or infinite values, so it cannot be used") as info:
        train(toy, tmp_path / "run", "--init-from", run, "--eval-only")
    one_line(info)
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("edit, message", [
    ({"model": "evil"}, r"its recorded option 'model': 'evil' is not one of the allowed values: 'sage'"),
    ({"model_option": "module=os"}, r"its recorded option 'model_option': expected a list"),
    ({"hidden": "8"}, r"its recorded option 'hidden': expected an integer, got '8'"),
    ({"model": "pyg", "model_option": ["module=..x"]}, r"its recorded --model-option 'module=..x': module must be"),
    ({"model": "pyg", "model_option": ["module=m", "exec=print"]}, r"--model-option 'exec=print': model 'pyg' has"),
    ({"model": None}, r"records no 'model' option"),
])
def test_recorded_options_are_checked_as_data(toy, tmp_path, edit, message):
    run = save_model(toy, tmp_path / "edited", sage(), **edit)
    with pytest.raises(ModelSourceError, match=message) as info:
        read_model_source(str(run))
    one_line(info)
