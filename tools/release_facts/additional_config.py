"""The `--additional-config` keys a vllm-ascend release reads, and where.

`--additional-config` is a free-form JSON object: vLLM hands it to the platform, and vllm-ascend reads
what it knows of it (mostly in `ascend_config.py`, some elsewhere) and silently ignores the rest. The
keys are read from every file of the package:

- a *root* is the object itself: a name `additional_config`, an attribute `.additional_config`, or
  `getattr(x, "additional_config", ...)`;
- a key is read from a root by `.get("k", default)`, `["k"]`, `"k" in root`, `.setdefault("k", ...)`,
  `.pop("k")`, or by `_get_config_value(root, "k", "ENV_NAME", ...)`, the helper that reads a key and
  falls back to an environment variable it replaces (those pairs are `env_moved`);
- a *section* is a key whose value is itself read: `x = root.get("sec", {})` (a local or `self.x`),
  then `x.get("k")`; or `root.get("sec", {}).get("k")`; or handed to a class, `Cls(**x)` (the keys are
  `Cls.__init__`'s parameters and what it reads from its `**kwargs`) or `Cls(x, ...)` (what `__init__`
  reads from that parameter, or the keys of a `*defaults*` dict it checks them against).

A key's default is kept when every read gives the same literal one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from .source import Unexpected, call_name, find_class, literal, mentioning, module_ast, text

_UNKNOWN = object()  # a default that is not one literal


class _Keys:
    def __init__(self):
        self.defaults: dict[str, dict[str, object]] = defaultdict(dict)  # section ("" = top) -> key -> default
        self.handed: list[tuple[str, str, str, ast.Module]] = []  # (section, class, "kwargs"/"positional", module)
        self.env_moved: dict[str, str] = {}

    def known(self, section: str, key: str) -> None:
        """A key the release writes (the platform fills some in): known, its default untouched."""
        self.defaults[section].setdefault(key, _UNKNOWN)
        if section:
            self.defaults[""].setdefault(section, None)

    def read(self, section: str, key: str, default: object = None) -> None:
        seen = self.defaults[section]
        if key in seen and seen[key] != default:
            seen[key] = _UNKNOWN
        else:
            seen.setdefault(key, default)
        if section:
            self.defaults[""].setdefault(section, None)


def _is_root(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "additional_config"
    if isinstance(node, ast.Attribute):
        return node.attr == "additional_config"
    if isinstance(node, ast.Call) and call_name(node) == "getattr" and len(node.args) >= 2:
        return text(node.args[1]) == "additional_config"
    if isinstance(node, ast.BoolOp):  # `vllm_config.additional_config or {}`
        return any(_is_root(v) for v in node.values)
    if isinstance(node, ast.IfExp):  # `x.additional_config if x.additional_config is not None else {}`
        return _is_root(node.body) or _is_root(node.orelse)
    return False


def _target(node: ast.AST) -> str | None:
    """The name a section is kept under: `x` or `self.x`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return "self." + node.attr
    return None


class _Scope(ast.NodeVisitor):
    """One module: which names hold a root or a section, then every read through them."""

    def __init__(self, keys: _Keys, module: ast.Module):
        self.keys, self.module = keys, module
        self.sections: dict[str, str] = {}  # name or self.attr -> section
        self.roots: set[str] = set()

    def _section_of(self, node: ast.AST) -> str | None:
        """The section a read-from expression is: a tracked name, or `root.get("sec", ...)` inline."""
        name = _target(node)
        if name is not None and name in self.sections:
            return self.sections[name]
        if isinstance(node, ast.Call) and call_name(node) in ("get", "setdefault") and isinstance(node.func, ast.Attribute) \
                and self._root(node.func.value) and node.args and text(node.args[0]):
            return text(node.args[0])
        if isinstance(node, ast.Subscript) and self._root(node.value) and text(node.slice):
            return text(node.slice)
        return None

    def _root(self, node: ast.AST) -> bool:
        return _is_root(node) or (_target(node) in self.roots)

    def _where(self, node: ast.AST) -> str | None:
        """"" when `node` is the root, the section name when it is a section, else None."""
        if self._root(node):
            return ""
        return self._section_of(node)

    def _assigned(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        for tgt in targets:
            name = _target(tgt)
            if name is None or value is None:
                continue
            if self._root(value):
                self.roots.add(name)
            else:
                section = self._section_of(value)
                if section is not None:
                    self.sections[name] = section

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # `self.x: dict = root.get(...)`
        self._assigned([node.target], node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = call_name(node)
        func = node.func
        if isinstance(func, ast.Attribute) and name in ("get", "setdefault", "pop") and node.args and text(node.args[0]):
            where = self._where(func.value)
            if where is not None and name == "setdefault":
                self.keys.known(where, text(node.args[0]))
            elif where is not None:
                default = literal(node.args[1]) if len(node.args) > 1 else None
                if len(node.args) > 1 and default is None and not isinstance(node.args[1], ast.Constant):
                    default = _UNKNOWN
                self.keys.read(where, text(node.args[0]), default)
        if name == "_get_config_value" and len(node.args) >= 3 and self._root(node.args[0]) and text(node.args[1]):
            self.keys.read("", text(node.args[1]), _UNKNOWN)
            if text(node.args[2]):
                self.keys.env_moved[text(node.args[2])] = text(node.args[1])
        for arg in node.args:  # Cls(section, ...)
            section = self._section_of(arg)
            if section is not None and name[:1].isupper():
                self.keys.handed.append((section, name, "positional", self.module))
        for kw in node.keywords:  # Cls(**section)
            section = self._section_of(kw.value) if kw.arg is None else None
            if section is not None:
                self.keys.handed.append((section, name, "kwargs", self.module))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        where = self._where(node.value)
        if where is not None and text(node.slice):
            if isinstance(node.ctx, ast.Store):
                self.keys.known(where, text(node.slice))
            else:
                self.keys.read(where, text(node.slice), _UNKNOWN)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:  # "k" in root
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) and text(node.left):
            where = self._where(node.comparators[0])
            if where is not None:
                self.keys.read(where, text(node.left), _UNKNOWN)
        self.generic_visit(node)


def _class_keys(cls: ast.ClassDef, how: str) -> dict[str, object]:
    """The keys a config class takes from its section."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        raise Unexpected(f"class {cls.name} has no __init__")
    params = [a for a in init.args.args[1:]]
    out: dict[str, object] = {}
    if how == "kwargs":
        defaults = [None] * (len(params) - len(init.args.defaults)) + list(init.args.defaults)
        out.update({p.arg: literal(d) for p, d in zip(params, defaults)})
        out.update({a.arg: literal(d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)})
        carrier = init.args.kwarg.arg if init.args.kwarg else None
    else:
        carrier = params[0].arg if params else None
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and call_name(node) == "get" and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == carrier and text(node.args[0]):
            out.setdefault(text(node.args[0]), literal(node.args[1]) if len(node.args) > 1 else None)
    for stmt in cls.body:  # a dict of the keys it accepts, checked against (EplbConfig._defaults)
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict) and any(
                isinstance(t, ast.Name) and "default" in t.id.lower() for t in stmt.targets):
            out.update({text(k): literal(v) for k, v in zip(stmt.value.keys, stmt.value.values) if text(k)})
    return out


def additional_config(ascend: Path) -> dict:
    """{"keys": {key: default}, "sections": {section: {key: default}}, "env_moved": {ENV: key}}."""
    keys = _Keys()
    for path in mentioning(ascend, "vllm_ascend", "additional_config"):
        module = module_ast(path)
        _Scope(keys, module).visit(module)
    for section, cls_name, how, module in keys.handed:
        cls = find_class(module, cls_name)
        if cls is None:
            continue  # a function named like a class, or imported: nothing it reads is a key here
        for key, default in _class_keys(cls, how).items():
            keys.read(section, key, default)
    top = keys.defaults.get("", {})
    if "ascend_compilation_config" not in top or len(top) < 10:
        raise Unexpected(f"{ascend}: found only {sorted(top)} as additional-config keys")

    def clean(d: dict) -> dict:
        return {k: (None if v is _UNKNOWN else v) for k, v in sorted(d.items())}

    sections = {s: clean(d) for s, d in sorted(keys.defaults.items()) if s}
    return {"keys": clean(top), "sections": sections, "env_moved": dict(sorted(keys.env_moved.items()))}
