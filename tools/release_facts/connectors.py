"""The KV connectors a release can run, as vLLM finds them.

vLLM keeps a registry, name -> (module, class): its own connectors are registered at the bottom of
`vllm/distributed/kv_transfer/kv_connector/factory.py`, vllm-ascend's by `register_connector()` in
`vllm_ascend/distributed/kv_transfer/__init__.py` (which pops and re-registers `MultiConnector`).
AscendStoreConnector (the KV pool) loads its storage backend by name from a `backend_map` dict
(`store_backends`): `yuanrong`, the openYuanrong pool, ships from vllm-ascend 0.20 on (seed 003 patches
it into 0.18.0). A `kv_connector_module_path` bypasses the registry: vLLM imports that module and takes the class
named like the connector from it. Whether it does so *before* looking at the registry depends on the
vLLM release (`module_path_first`): read from the branch order of the factory's lookup.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .source import Unexpected, call_name, mentioning, module_ast, module_name, package_files, text

FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
ASCEND_REGISTRY = "vllm_ascend/distributed/kv_transfer/__init__.py"
# Where connector modules live: a module path outside these trees is not checked.
TREES = ("vllm/distributed/kv_transfer", "vllm_ascend/distributed")


def _registrations(body: list[ast.stmt]) -> list[tuple[str, object]]:
    """`register_connector(name, module, class)` and `_registry.pop(name)` in source order, inside
    if/try/else blocks too (vllm-ascend registers one connector only when an import works:
    counted as registered, the import being of vLLM's own module of the same release)."""
    out: list[tuple[str, object]] = []
    calls = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Call)]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):  # source order, not ast.walk's
        args = [text(a) for a in node.args]
        if call_name(node) == "register_connector" and len(args) == 3 and all(args):
            out.append(("register", tuple(args)))
        elif call_name(node) == "pop" and args[:1] and args[0] and "_registry" in ast.unparse(node.func):
            out.append(("pop", args[0]))
    return out


def registry(vllm: Path, ascend: Path) -> dict[str, dict[str, str]]:
    """name -> {"module", "class"}, vLLM's registrations then vllm-ascend's."""
    factory = module_ast(vllm / FACTORY)
    ascend_fn = next((n for n in module_ast(ascend / ASCEND_REGISTRY).body
                      if isinstance(n, ast.FunctionDef) and n.name == "register_connector"), None)
    if ascend_fn is None:
        raise Unexpected(f"{ASCEND_REGISTRY}: no register_connector() function")
    module_level = [s for s in factory.body if not isinstance(s, (ast.ClassDef, ast.FunctionDef))]
    out: dict[str, dict[str, str]] = {}
    for kind, what in _registrations(module_level) + _registrations(ascend_fn.body):
        if kind == "pop":
            out.pop(what, None)
        else:
            name, module, cls = what
            out[name] = {"module": module, "class": cls}
    if "MultiConnector" not in out or len(out) < 5:
        raise Unexpected(f"{FACTORY} and {ASCEND_REGISTRY}: found only {sorted(out)}")
    return out


def module_path_first(vllm: Path) -> bool:
    """Whether vLLM imports an explicit `kv_connector_module_path` before it consults the registry:
    in the factory's lookup, the `if` that chooses between `importlib.import_module(...)` and
    `cls._registry[...]` tests the module path (True) or registry membership (False)."""
    for node in ast.walk(module_ast(vllm / FACTORY)):
        if not isinstance(node, ast.If):
            continue
        branches = ast.unparse(ast.Module(body=node.body, type_ignores=[])), \
            ast.unparse(ast.Module(body=node.orelse, type_ignores=[]))
        if "import_module(" not in "".join(branches) or "_registry[" not in "".join(branches):
            continue
        test = ast.unparse(node.test)
        if "_registry" in test:
            return False
        if "module_path" in test:
            return True
    raise Unexpected(f"{FACTORY}: no `if` choosing between the module path and the registry")


def connector_modules(vllm: Path, ascend: Path) -> dict[str, list[str]]:
    """Every module under TREES -> the classes it defines (what a module path may name)."""
    out: dict[str, list[str]] = {}
    for tree, package in ((vllm, "vllm"), (ascend, "vllm_ascend")):
        for path in package_files(tree, package):
            rel = path.relative_to(tree).as_posix()
            if not any(rel.startswith(t + "/") for t in TREES):
                continue
            out[module_name(tree, path)] = sorted(n.name for n in module_ast(path).body if isinstance(n, ast.ClassDef))
    return dict(sorted(out.items()))


def store_backends(ascend: Path) -> list[str]:
    """The names AscendStoreConnector's `backend` may take: the keys of vllm-ascend's `backend_map`."""
    for path in mentioning(ascend, "vllm_ascend", "backend_map"):
        for node in module_ast(path).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "backend_map"
                                                     for t in node.targets) and isinstance(node.value, ast.Dict):
                return sorted(text(k) for k in node.value.keys if text(k))
    raise Unexpected(f"{ascend}: no `backend_map = {{...}}` of AscendStoreConnector's backends")
