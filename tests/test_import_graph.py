"""The house is a one-way stack (issue 29): settings -> plan -> scripts -> components -> program and commands.

The import graph of `ascend_pd/` is read with `ast` (module-level, function-level, `TYPE_CHECKING` and relative
imports alike) and must have no loop: a loop is where "one way down" breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ascend_pd"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its body."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        base = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[:len(base) - (node.level - 1)]
                    stem = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from . import x` / `from .pkg import mod`: x may be a module of its own
                targets = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # importing a.b.c runs a/b/__init__.py first: an edge to every package on the way that is
                # not one of the importer's own (those are running already)
                own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
                while target:
                    if target not in own:
                        graph[name].add(target)
                    target = target.rpartition(".")[0]
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_loop_in_ascend_pd():
    loops = _loops(import_graph())
    assert loops == [], "import loops in ascend_pd/ (each a set of modules that import each other): " + "; ".join(
        " <-> ".join(loop) for loop in loops)


def test_the_loop_finder_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n    return x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\nx = 1\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert _loops(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("x = 1\n")
    assert _loops(import_graph(pkg)) == []
    # a package's __init__ runs on the way to any of its modules: a -> sub.b -> sub/__init__ -> a is a loop
    (pkg / "sub" / "b.py").write_text("x = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    assert _loops(import_graph(pkg)) == [["pkg.a", "pkg.sub"]]
