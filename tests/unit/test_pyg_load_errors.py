"""Every way the user's `--model pyg` code can fail to give a model is one line, raised on every rank
together (the collective error main_guard prints once, without a traceback, exiting non-zero): a module
that cannot be found or raises (SystemExit included) at import, a name that is not a module path, a
factory that is missing, raises, exits or returns no convolutions, a convolution of the wrong width.
Uncaught, each would be a traceback on every rank and MPI_ABORT, and SystemExit(0) would end the job
with status 0.

granndis-train in this process on a 1x1 set (tests/launch/test_model_code_under_mpirun.py runs one
under mpirun)."""
import re
import sys

import pytest

from granndis_hpc import cli
from granndis_hpc.cluster.errors import ClusterError
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")
pytest.importorskip("torch_geometric")

WIDE = "from torch_geometric.nn import SAGEConv\ndef build(i, h, o, n):\n    return [SAGEConv(3, h), SAGEConv(h, o)]\n"
CASES = {  # name: (the module's source or None, the factory, what the error says)
    "missing module": (None, "build", r"no module named '{m}' can be imported; give --model-option module=NAME"),
    "raises at import": ("raise RuntimeError('boom\\nsecond line')\n", "build",
                         r"importing {m} raised RuntimeError: boom second line; fix it"),
    "imports a missing module": ("import no_such_dependency_xyz\n", "build",
                                 r"importing {m} raised ModuleNotFoundError: No module named 'no_such_dependency"),
    "SystemExit(0) at import": ("import sys\nsys.exit(0)\n", "build", r"importing {m} raised SystemExit: 0;"),
    "no such factory": ("x = 1\n", "nope", r"module '{m}' has no function 'nope'; give --model-option factory="),
    "factory not callable": ("build = 1\n", "build", r"module '{m}' has no function 'build' \(it is a int\)"),
    "factory raises": ("def build(*a):\n    raise ValueError('bad widths')\n", "build",
                       r"{m}\.build\(7, 8, 5, 2\) raised ValueError: bad widths"),
    "factory exits": ("import sys\ndef build(*a):\n    sys.exit(3)\n", "build", r"{m}\.build\(7, 8, 5, 2\) raised "
                                                                                r"SystemExit: 3"),
    "factory returns a string": ("def build(*a):\n    return 'conv'\n", "build", r"returned a str, not a list of"),
    "factory returns numbers": ("def build(*a):\n    return [1, 2]\n", "build",
                                r"returned a list holding a int at position 0, not a torch_geometric convolution"),
    "conv of the wrong width": (WIDE, "build", r"convolution 0 \(SAGEConv\) on 7 input features raised RuntimeError"),
}


@pytest.fixture(scope="module")
def one_rank_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("pygset") / "set"
    build(make_graph(n=120, m=400), out, servers=1, gpus_per_server=1)
    return out


def train(shards, run, *extra):
    return cli.run_training(["--shards", str(shards), "--ranks-per-server", "1", "--layers", "2", "--hidden", "8",
                             "--mode", "fb", "--epochs", "1", "--model", "pyg", "--out", str(run), "--quiet",
                             *map(str, extra)])


@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_of_the_users_code_is_one_collective_line(one_rank_set, tmp_path, monkeypatch, case):
    source, factory, message = CASES[case]
    module = "user_stack_" + re.sub(r"\W", "_", case)
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ClusterError) as info:
            train(one_rank_set, tmp_path / "run", "--model-option", f"module={module}", "--model-option",
                  f"factory={factory}")
    finally:
        sys.modules.pop(module, None)
    text = str(info.value)
    assert info.value.collective and "\n" not in text and "Traceback" not in text, text
    assert text.startswith("rank 0: ModelCodeError: --model pyg"), text
    assert len(text) < 600, text
    assert re.search(message.format(m=module), text), text


def test_a_module_name_that_is_no_module_path_is_an_option_error(one_rank_set, tmp_path):
    """`module=..x` (a relative import) and `factory=a.b` are refused with the options (exit status 2)."""
    for option, kind in (("module=..x", "module name"), ("factory=a.b", "Python identifier")):
        with pytest.raises(ClusterError) as info:
            train(one_rank_set, tmp_path / "run", "--model-option", option)
        assert info.value.exit_code == 2 and f"must be of type {kind}, got" in str(info.value)


def test_a_module_in_the_working_directory_says_how_to_reach_it(tmp_path, monkeypatch):
    """The documented `--model pyg` example with its module beside the job: the ranks do not search the
    working directory, and the error says how to put it on their path."""
    from granndis_hpc.nn.pyg import ModelCodeError, _import

    (tmp_path / "mystack_beside.py").write_text("def build(*a):\n    return []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(ModelCodeError, match=r"mystack_beside\.py is in the working directory, which the ranks do "
                                             r"not search: run with PYTHONPATH=\$PWD, and under mpirun add -x "
                                             r"PYTHONPATH"):
        _import("mystack_beside")
    with pytest.raises(ModelCodeError) as elsewhere:
        _import("mystack_nowhere")
    assert "working directory" not in str(elsewhere.value)
