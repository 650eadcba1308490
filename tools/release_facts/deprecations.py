"""Values vLLM accepts but warns are deprecated, with what replaces them.

`SpeculativeConfig.__post_init__` (vllm/config/speculative.py) rewrites every MTP model type to
`mtp` with a warning on every rank: `if self.method in get_args(MTPModelTypes) and self.method !=
"mtp": logger.warning("method `%s` is deprecated and replaced with mtp.", ...)`. The deprecated
values are the members of that Literal other than the replacement.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .source import Unexpected, module_ast, text

SPECULATIVE = "vllm/config/speculative.py"


def _literal_members(module: ast.Module, name: str) -> list[str]:
    """The strings of `name = Literal["a", "b", ...]` (nested Literals and aliases followed)."""
    value = next((n.value for n in module.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)), None)
    if value is None:
        raise Unexpected(f"{SPECULATIVE}: no `{name} = Literal[...]`")
    out = []
    items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
    for item in items:
        if text(item) is not None:
            out.append(text(item))
        elif isinstance(item, ast.Name):
            out += _literal_members(module, item.id)
    return out


def deprecated_values(vllm: Path) -> dict[str, dict[str, dict[str, str]]]:
    """{flag: {key: {deprecated value: replacement}}}: `--speculative-config`'s `method`."""
    module = module_ast(vllm / SPECULATIVE)
    for node in ast.walk(module):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and len(node.test.values) == 2):
            continue
        member, other = node.test.values
        if not (isinstance(member, ast.Compare) and isinstance(member.ops[0], ast.In)
                and "self.method" == ast.unparse(member.left) and isinstance(other, ast.Compare)
                and isinstance(other.ops[0], ast.NotEq) and text(other.comparators[0])):
            continue
        warns = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "deprecated" in n.value
                    for n in ast.walk(node))
        group = member.comparators[0]
        if not (warns and isinstance(group, ast.Call) and group.args and isinstance(group.args[0], ast.Name)):
            continue
        replacement = text(other.comparators[0])
        values = [v for v in _literal_members(module, group.args[0].id) if v != replacement]
        return {"speculative-config": {"method": {v: replacement for v in sorted(values)}}}
    raise Unexpected(f"{SPECULATIVE}: no deprecation of speculative methods found")
