"""The environment variables a release's Python reads: vLLM's registry (`environment_variables` in
`vllm/envs.py`), vllm-ascend's (`env_variables` in `vllm_ascend/envs.py`), and direct reads anywhere
in either package (`os.getenv("X")`, `os.environ.get("X")`, `os.environ["X"]`, `"X" in os.environ`).
A default is kept when it is a literal (`os.getenv("X", "0")`).

Variables that only KV connectors read (`only_in`): every file besides the two registries that names
the variable lies inside the module (or package) of registered connectors; a stack that runs none of
them sets it for nothing (VLLM_NIXL_ABORT_REQUEST_TIMEOUT is read only by vLLM 0.18's NixlConnector).
`only_in` of a registered variable no other file names is empty: it is read nowhere
(VLLM_RPC_TIMEOUT in vLLM 0.20.2, a leftover of the V0 engine).

Native libraries (CANN, HCCL, torch_npu) read their own variables (HCCL_*, ASCEND_*, ...): they are
not in the sources, so these facts say nothing of them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .source import Unexpected, call_name, literal, mentioning, module_ast, package_files, text

REGISTRIES = (("vllm", "vllm/envs.py", "environment_variables"),
              ("vllm_ascend", "vllm_ascend/envs.py", "env_variables"))
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*[A-Z0-9]")


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _read_default(node: ast.AST) -> tuple[str, object] | None:
    """(name, default) when `node` reads one variable directly."""
    if isinstance(node, ast.Call) and node.args and _ENV_NAME.fullmatch(text(node.args[0]) or ""):
        name = text(node.args[0])
        getenv = call_name(node) == "getenv"
        environ_get = call_name(node) == "get" and isinstance(node.func, ast.Attribute) and _is_environ(node.func.value)
        if getenv or environ_get:
            return name, literal(node.args[1]) if len(node.args) > 1 else None
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load) \
            and _ENV_NAME.fullmatch(text(node.slice) or ""):
        return text(node.slice), None
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _is_environ(node.comparators[0]) and _ENV_NAME.fullmatch(text(node.left) or ""):
        return text(node.left), None
    return None


def _registry(tree: Path, rel: str, dict_name: str) -> dict[str, object]:
    module = module_ast(tree / rel)
    table = next((n.value for n in module.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and isinstance(n.value, ast.Dict)
                  and any(isinstance(t, ast.Name) and t.id == dict_name
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))), None)
    if table is None:
        raise Unexpected(f"{rel}: no `{dict_name} = {{...}}`")
    out = {}
    for key, value in zip(table.keys, table.values):
        name = text(key)
        if name is None:
            continue
        reads = [r for r in map(_read_default, ast.walk(value)) if r and r[0] == name]
        out[name] = reads[0][1] if reads else None
    return out


def _connector_homes(tree: Path, registry: dict[str, dict[str, str]]) -> dict[Path, str]:
    """The file or package directory of every registered connector's module -> its name."""
    out = {}
    for name, where in registry.items():
        base = tree.joinpath(*where["module"].split("."))
        for home in (base.with_suffix(".py"), base):
            if home.exists():
                out[home] = name
    return out


def environment(vllm: Path, ascend: Path, registry: dict[str, dict[str, str]]) -> tuple[dict, dict]:
    """({name: default}, {name: [the connectors that alone read it], or [] when nothing reads it})."""
    env: dict[str, object] = {}
    registries = set()
    for package, rel, dict_name in REGISTRIES:
        tree = vllm if package == "vllm" else ascend
        env.update(_registry(tree, rel, dict_name))
        registries.add(tree / rel)
    if len(env) < 100:
        raise Unexpected(f"only {len(env)} variables in {[r for _, r, _ in REGISTRIES]}")
    files = [(vllm, p) for p in package_files(vllm, "vllm")] + [(ascend, p) for p in package_files(ascend, "vllm_ascend")]
    for tree, package in ((vllm, "vllm"), (ascend, "vllm_ascend")):
        for path in mentioning(tree, package, "environ", "getenv"):
            for node in ast.walk(module_ast(path)):
                read = _read_default(node)
                if read and read[0] not in env:
                    env[read[0]] = read[1]
    homes = {**_connector_homes(vllm, registry), **_connector_homes(ascend, registry)}
    word = re.compile(r"\b(" + "|".join(map(re.escape, sorted(env, key=len, reverse=True))) + r")\b")
    readers: dict[str, set[str | None]] = {}
    for _, path in files:
        if path in registries:
            continue
        owner = next((name for home, name in homes.items() if path == home or home in path.parents), None)
        for name in set(word.findall(path.read_text(encoding="utf-8"))):
            readers.setdefault(name, set()).add(owner)
    only_in = {name: sorted(readers.get(name, ())) for name in sorted(env) if None not in readers.get(name, ())}
    return dict(sorted(env.items())), only_in
