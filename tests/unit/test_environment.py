"""Every GRANNDIS_* environment variable the product reads is declared (granndis_hpc/options/environment.py,
rendered into docs/configuration.md), and every declared one is read."""
import ast
import pathlib
import re

from granndis_hpc.options import environment

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bGRANNDIS_[A-Z0-9_]*[A-Z0-9]\b")

DECLARATIONS = "granndis_hpc/options/environment.py"


def names_in_code(root=REPO):
    """{name: [file, ...]} for every GRANNDIS_ name in a string constant of the product's code (where it is
    read, given to os.environ, or named in a message) but the declarations; comments and docstrings are
    not code."""
    found = {}
    for package in ("granndis_hpc", "preprocess"):
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).as_posix() == DECLARATIONS:
                continue
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    for name in NAME.findall(node.value):
                        found.setdefault(name, []).append(path.relative_to(root).as_posix())
    return found


def test_every_variable_read_is_declared_and_every_declared_one_is_read():
    found = names_in_code()
    declared = set(environment.declared_names())
    undeclared = {n: f for n, f in found.items() if n not in declared}
    assert not undeclared, f"declare these in {DECLARATIONS} (or make them options): {undeclared}"
    unread = sorted(declared - set(found))
    assert not unread, f"declared but read nowhere (remove them): {unread}"
    for var in environment.ENVIRONMENT:
        assert (REPO / var.read_by).is_file() and var.name in (REPO / var.read_by).read_text(), var
        assert var.help and var.values and var.default, var


def test_the_scan_sees_a_planted_variable(tmp_path):
    (tmp_path / "granndis_hpc").mkdir()
    (tmp_path / "preprocess").mkdir()
    (tmp_path / "granndis_hpc" / "knob.py").write_text(
        '"""GRANNDIS_IN_A_DOCSTRING"""\nimport os\nX = os.environ.get("GRANNDIS_PLANTED")\n')
    assert names_in_code(tmp_path) == {"GRANNDIS_PLANTED": ["granndis_hpc/knob.py"]}
