"""No import cycle among the modules of granndis_hpc/, preprocess/ (granndis_hpc.preprocess), emucluster/ and
bench/.

The graph is built statically with ast from every import statement, function-level imports included
(an import inside a function only postpones a cycle; it still ties the two modules together).  An
edge goes to the module imported: `from pkg import name` reaches pkg.name when that is a module, else
pkg itself (its __init__)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# folder -> the dotted name it is imported as (preprocess/ is installed as granndis_hpc.preprocess)
PACKAGES = {"granndis_hpc": "granndis_hpc", "preprocess": "granndis_hpc.preprocess", "emucluster": "emucluster"}
SCRIPT_DIRS = ("bench",)  # scripts importing their neighbours by bare name


def module_files(root: Path = REPO) -> dict:
    """{dotted module name: path} of the packages and the script folders."""
    mods = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [dotted] + list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    for folder in SCRIPT_DIRS:
        for path in sorted((root / folder).glob("*.py")):
            mods[path.stem] = path
    return mods


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(mods: dict) -> dict:
    """{module: set of modules it imports}, restricted to `mods`."""
    graph = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            edges |= {t for t in targets if t in mods and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(import_graph(module_files()))
    assert not found, "import cycles (move the shared helpers down into a module both can import):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_a_function_level_import_closing_a_cycle_is_found(tmp_path):
    pkg = tmp_path / "emucluster"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import emucluster.a\n")
    (pkg / "d.py").write_text("from emucluster import a, b\n")
    graph = import_graph({k: v for k, v in module_files(tmp_path).items() if k.startswith("emucluster")})
    assert graph["emucluster.d"] == {"emucluster.a", "emucluster.b"}
    assert cycles(graph) == [["emucluster.a", "emucluster.b", "emucluster.c"]]
