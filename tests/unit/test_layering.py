"""The layering docs/design.md §3 and docs/architecture.md state, checked on every import statement.

The imports of every module of granndis_hpc/ and preprocess/ (granndis_hpc.preprocess) are read with
ast, module-level and function-level alike: an import inside a function still ties the two modules
together whenever it runs.  A rule names what a set of modules must not import; the exceptions below are
the ones the docs state, each with where they state it.  A failure names the importing module (file and
line), the module imported and the rule."""
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.test_import_cycles import _resolve, module_files

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # the module imported (`from pkg import name`: pkg.name when that is a module, else pkg)
    where: str  # path:line
    in_function: bool


def imports(mods: dict, root: Path = REPO) -> list:
    out = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            out += [Import(name, t, where, id(node) in in_function) for t in targets]
    return out


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@dataclass(frozen=True)
class Rule:
    text: str
    importers: tuple  # the modules the rule binds (prefixes)
    forbidden: tuple  # what they must not import (prefixes)
    exempt: tuple = ()  # importers outside the rule's reach (prefixes)

    def breaches(self, found: list, exceptions=()) -> list:
        out = []
        for imp in found:
            if not within(imp.importer, *self.importers) or within(imp.importer, *self.exempt):
                continue
            if not within(imp.imported, *self.forbidden):
                continue
            if any(e.admits(imp) for e in exceptions):
                continue
            out.append(f"{imp.where} ({imp.importer}) imports {imp.imported}"
                       f"{' inside a function' if imp.in_function else ''}: {self.text}")
        return out


@dataclass(frozen=True)
class Allowed:
    importer: str
    imported: str  # prefix
    in_function_only: bool
    stated: str  # where the docs state it

    def admits(self, imp: Import) -> bool:
        return (imp.importer == self.importer and within(imp.imported, self.imported)
                and (imp.in_function or not self.in_function_only))


NN = Rule("granndis_hpc/nn knows neither MPI nor files nor the engine's exchange (docs/design.md §3)",
          ("granndis_hpc.nn",), ("mpi4py", "h5py", "granndis_hpc.cluster", "granndis_hpc.engine",
                                 "granndis_hpc.shards", "granndis_hpc.preprocess"))
MPI = Rule("cluster is the only package that imports mpi4py (docs/design.md §3)",
           ("granndis_hpc",), ("mpi4py",), exempt=("granndis_hpc.cluster",))
CLUSTER = Rule("cluster knows no graphs and imports nothing else of granndis_hpc (docs/design.md §3)",
               ("granndis_hpc.cluster",), ("granndis_hpc",), exempt=())
PREPROCESS = Rule("preprocess never imports the engine (docs/design.md §3)",
                  ("granndis_hpc.preprocess",), ("granndis_hpc.engine",))
OFFLINE = Rule("nothing in granndis_hpc imports preprocess but cli.py and api/ (docs/design.md §3)",
               ("granndis_hpc",), ("granndis_hpc.preprocess",),
               exempt=("granndis_hpc.preprocess", "granndis_hpc.cli", "granndis_hpc.api"))
# What cluster/topology.py and cluster/selfcheck.py read of the options package, with the package and the
# framework modules importing it runs: the standard library and one another only (tomli: Python < 3.11's
# TOML reader, pyproject.toml).
CLUSTER_OPTIONS = ("granndis_hpc.options", "granndis_hpc.options.declare", "granndis_hpc.options.parser",
                   "granndis_hpc.options.toml", "granndis_hpc.options.startup", "granndis_hpc.options.selfcheck")
REGISTRY = "registry.py imports the standard library only (docs/design.md §3: building the parser loads no torch)"

EXCEPTIONS = (
    Allowed("granndis_hpc.cli", "mpi4py", True,
               "docs/design.md §3: cli.py's checks before the topology exists, and its log lines' rank"),
    Allowed("granndis_hpc.mpistart", "mpi4py", True,
               "docs/design.md §3: mpistart.py starts MPI once the GPU is set"),
    Allowed("granndis_hpc.cluster.topology", "granndis_hpc.mpistart", False, "docs/design.md §3"),
    Allowed("granndis_hpc.cluster.topology", "granndis_hpc.options.startup", False, "docs/design.md §3"),
    Allowed("granndis_hpc.cluster.selfcheck", "granndis_hpc.options.selfcheck", False, "docs/design.md §3"),
    Allowed("granndis_hpc.cluster.selfcheck", "granndis_hpc.options.parser", False, "docs/design.md §3"),
)


@pytest.fixture(scope="module")
def found():
    return imports(module_files())


def _check(rule, found, exceptions=EXCEPTIONS):
    breaches = rule.breaches(found, exceptions)
    assert not breaches, "layering broken:\n" + "\n".join(breaches)


def test_nn_imports_neither_mpi_nor_files_nor_the_engine(found):
    _check(NN, found)


def test_cluster_is_the_only_package_importing_mpi4py(found):
    _check(MPI, found)


def test_cluster_imports_nothing_else_of_granndis_hpc(found):
    _check(CLUSTER, [i for i in found if not within(i.imported, "granndis_hpc.cluster")])


def test_nothing_but_cli_and_api_imports_preprocess(found):
    _check(OFFLINE, found)


def test_registry_imports_the_standard_library_only(found):
    breaches = [f"{i.where} ({i.importer}) imports {i.imported}: {REGISTRY}" for i in found
                if i.importer == "granndis_hpc.registry" and i.imported.split(".")[0] not in sys.stdlib_module_names]
    assert not breaches, "layering broken:\n" + "\n".join(breaches)


def test_the_options_cluster_reads_import_the_standard_library_only(found):
    rule = "the option modules the cluster layer reads import the standard library only (docs/design.md §3)"
    breaches = [f"{i.where} ({i.importer}) imports {i.imported}: {rule}" for i in found
                if i.importer in CLUSTER_OPTIONS and i.imported not in CLUSTER_OPTIONS
                and i.imported.split(".")[0] not in (*sys.stdlib_module_names, "tomli")]
    assert not breaches, "layering broken:\n" + "\n".join(breaches)
    assert {i.imported for i in found if i.importer.startswith("granndis_hpc.cluster.")
            and within(i.imported, "granndis_hpc.options")} == {"granndis_hpc.options.startup",
                                                                "granndis_hpc.options.selfcheck",
                                                                "granndis_hpc.options.parser"}


def test_preprocess_never_imports_the_engine(found):
    _check(PREPROCESS, found)


def test_the_rules_see_function_level_imports_and_name_the_modules(tmp_path):
    pkg = tmp_path / "granndis_hpc"
    (pkg / "nn").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "nn" / "__init__.py"):
        init.write_text("")
    (pkg / "nn" / "bad.py").write_text("import torch\n\ndef f():\n    from ..engine import modes\n"
                                       "    from mpi4py import MPI\n")
    found = imports(module_files(tmp_path), tmp_path)
    breaches = NN.breaches(found, EXCEPTIONS)
    assert len(breaches) == 2, breaches
    assert breaches[0].startswith("granndis_hpc/nn/bad.py:4 (granndis_hpc.nn.bad) imports granndis_hpc.engine "
                                  "inside a function: granndis_hpc/nn knows neither MPI")
    assert "imports mpi4py inside a function" in breaches[1]
    # a documented exception admits only its own importer, and (where it says so) only inside a function
    assert MPI.breaches([Import("granndis_hpc.cli", "mpi4py", "x:1", False)], EXCEPTIONS)
    assert MPI.breaches([Import("granndis_hpc.report.command", "mpi4py", "x:1", True)], EXCEPTIONS)
    assert not MPI.breaches([Import("granndis_hpc.cli", "mpi4py", "x:1", True)], EXCEPTIONS)
