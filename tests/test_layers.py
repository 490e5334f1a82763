"""The project's import graph (issue 22 part 5): no import cycle between its modules, and no import from a
lower layer to a higher one (hdl < compiler < host < sim).

Every module of the four packages is parsed with `ast` (nothing is imported), every ``import`` and
``from ... import`` statement counted wherever it stands (in a function, under ``if TYPE_CHECKING``),
relative imports resolved against the importing module's package. An import names the most specific
project module it loads: ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to
``a.b``; ``import a.b.c`` is an edge to ``a.b.c``. Imports by string (``importlib.import_module``) are not
seen.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ("hdl", "compiler", "host", "sim")          # lowest first: a package imports only its own and lower


def project_modules(root: pathlib.Path, packages=LAYERS) -> dict:
    """Dotted module name -> (source path, is a package) for every ``.py`` file under `packages`."""
    mods = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            mods[".".join(parts)] = (path, is_pkg)
    return mods


def import_graph(root: pathlib.Path, packages=LAYERS) -> dict:
    """Module -> {imported project module: first line importing it} (see the module's docstring)."""
    mods = project_modules(root, packages)

    def resolve(name: str):
        # the longest prefix of `name` that is a project module (None: not the project's)
        parts = name.split(".")
        while parts:
            if ".".join(parts) in mods:
                return ".".join(parts)
            parts.pop()
        return None

    graph = {}
    for mod, (path, is_pkg) in mods.items():
        edges = {}
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    assert base, f"{path}:{node.lineno}: a relative import beyond the top-level package"
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module
                targets = [f"{stem}.{a.name}" for a in node.names]
            for t in targets:
                dst = resolve(t)
                if dst is not None:
                    edges.setdefault(dst, node.lineno)
        graph[mod] = edges
    return graph


def strongly_connected(graph: dict) -> list:
    """Tarjan's strongly connected components of `graph` (each a sorted list of modules)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def cycles(graph: dict) -> list:
    """Every component of more than one module, and every module importing itself, with its edges."""
    found = []
    for comp in strongly_connected(graph):
        if len(comp) > 1 or comp[0] in graph.get(comp[0], {}):
            inside = set(comp)
            found.append([f"{a} -> {b} (line {ln})" for a in comp for b, ln in sorted(graph[a].items())
                          if b in inside])
    return found


def upward(graph: dict, layers=LAYERS) -> list:
    """Every import from a module to a module of a higher layer, as ``a -> b (line N)``."""
    rank = {pkg: i for i, pkg in enumerate(layers)}
    return [f"{a} -> {b} (line {ln})" for a, edges in sorted(graph.items()) for b, ln in sorted(edges.items())
            if rank[b.split(".")[0]] > rank[a.split(".")[0]]]


@pytest.mark.timeout(60)
def test_no_import_cycle_between_project_modules():
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles:\n" + "\n".join("  " + "; ".join(c) for c in found)


@pytest.mark.timeout(60)
def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = upward(import_graph(ROOT))
    assert not bad, f"imports against the layers ({' < '.join(LAYERS)}):\n" + "\n".join("  " + b for b in bad)


@pytest.mark.timeout(60)
def test_the_graph_sees_the_imports_it_checks():
    # the parser itself: known edges of each kind are found (a top-level import, one inside a function,
    # a relative one), so that an empty graph cannot pass the two tests above
    g = import_graph(ROOT)
    assert "hdl.isa" in g["compiler.emit"] or "hdl.isa" in set().union(*(g[m] for m in g if m.startswith("compiler")))
    assert "host.tiny_lm" in g["host.agreement"]                       # ``from .tiny_lm import ...``
    assert "host.serving.build" in g["sim.serve"]                       # inside a function
    assert all(m.split(".")[0] in LAYERS for m in g)


@pytest.mark.timeout(60)
def test_a_made_up_cycle_and_upward_import_are_caught(tmp_path):
    # a small tree of its own: a cycle through a relative import and a function-level import, a
    # self-import, and hdl importing sim
    for rel, text in {"hdl/__init__.py": "", "hdl/a.py": "def f():\n    from sim import b\n",
                      "sim/__init__.py": "", "sim/b.py": "from . import c\n", "sim/c.py": "import sim.b\n",
                      "sim/d.py": "from sim.d import f\n", "sim/e.py": "from hdl import a\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = import_graph(tmp_path, ("hdl", "sim"))
    assert [sorted(x) for x in cycles(g)] == [["sim.b -> sim.c (line 1)", "sim.c -> sim.b (line 1)"],
                                              ["sim.d -> sim.d (line 1)"]]
    assert upward(g, ("hdl", "sim")) == ["hdl.a -> sim.b (line 2)"]
