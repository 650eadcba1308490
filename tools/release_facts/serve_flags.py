"""The long options `vllm serve` accepts, read from a vLLM source tree with `ast`, never imported.

From the serve subcommand's `subparser_init` (vllm/entrypoints/cli/serve.py) the walk follows each call
handed a parser (or group) or a `get_kwargs` result into its definition, through imports, class bases and
`super()`: `make_arg_parser`, `FrontendArgs.add_cli_args`, `AsyncEngineArgs.add_cli_args`, ... Each
`add_argument` met, on any variable, gives its `--` names: literals, or `f"--{key.replace('_', '-')}"`
in the frontend's loop over `get_kwargs(cls).items()`, unrolled over the dataclass's fields (inherited
ones too). Every branch of an `if` counts (`--model` is registered unless `serve --help`).

A name also has its `--no-` form when the action is `argparse.BooleanOptionalAction`: written out, set by
an edit (`kwargs["field"]["action"] = ...`), or given by `get_kwargs(SomeConfig)` (`_compute_kwargs`) to
a field whose type hints (the members of `|`/`Union`/`Optional`, through `Annotated`, string annotations
and module-level aliases) include `bool` but are not exactly {bool, str, None} (an optional-valued flag).
Short aliases (`-tp`) are left out, and so is what the platform's `pre_register_and_update` hook adds.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .source import Unexpected, call_name, find_function, module_ast, text

SERVE = "vllm/entrypoints/cli/serve.py"
# Handed the parser, but what it does depends on the platform that runs, which the source does not say.
_NOT_FOLLOWED = {"pre_register_and_update"}
# One option of each registration path: a path the walk lost would otherwise go unnoticed.
_ANCHORS = {"model", "port", "tensor-parallel-size", "no-enable-log-requests"}
_PARSER = object()  # a parser or argument group
_BOOLEAN_ACTION = object()  # argparse.BooleanOptionalAction


@dataclass(frozen=True)
class _Class:
    node: ast.ClassDef
    path: Path


@dataclass(eq=False)
class _Kwargs:
    """What one `get_kwargs(cls)` call returned (argparse kwargs per field), with the edits made to it."""
    cls: _Class
    edits: dict[tuple[str, str], object] = field(default_factory=dict)  # (field, kwarg) -> value


@dataclass(frozen=True)
class _Field:
    kwargs: _Kwargs
    name: str


@lru_cache(maxsize=None)
def _definition(root: Path, path: Path, name: str) -> tuple[ast.stmt, Path] | None:
    """The statement defining `name` as the module at `path` sees it, following imports within the tree."""
    for node in module_ast(path).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node, path
        targets = getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(getattr(t, "id", None) == name for t in targets):
            return node, path
        alias = next((a for a in getattr(node, "names", []) if (a.asname or a.name) == name), None)
        if isinstance(node, ast.ImportFrom) and alias:
            base = (path.parents[node.level - 1] if node.level else root).joinpath(*(node.module or "").split("."))
            source = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            return _definition(root, source, alias.name) if source else None
    return None


def _class(root: Path, path: Path, name: ast.expr) -> _Class | None:
    found = _definition(root, path, name.id) if isinstance(name, ast.Name) else None
    return _Class(*found) if found and isinstance(found[0], ast.ClassDef) else None


def _mro(root: Path, cls: _Class) -> list[_Class]:
    """`cls`, then its bases found in the tree (the others, pydantic's or typing's, hold nothing that matters)."""
    return [cls, *(c for b in cls.node.bases if (base := _class(root, cls.path, b)) for c in _mro(root, base))]


def _origin(node: ast.expr) -> str:  # `Optional` of `Optional[...]` and of `typing.Optional[...]`
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)


@lru_cache(maxsize=None)
def _fields(root: Path, cls: _Class) -> dict[str, tuple[ast.expr, Path]]:
    """The dataclass fields of `cls`, inherited ones included: name -> (annotation, its module)."""
    found: dict[str, tuple[ast.expr, Path]] = {}
    for c in reversed(_mro(root, cls)):
        for node in c.node.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                wrapper = node.annotation.value if isinstance(node.annotation, ast.Subscript) else node.annotation
                if _origin(wrapper) not in ("ClassVar", "InitVar"):  # not fields to dataclasses.fields()
                    found[node.target.id] = (node.annotation, c.path)
    return found


def _hints(root: Path, node: ast.expr, path: Path) -> set[str]:
    """The type hints `get_type_hints` in arg_utils.py makes of an annotation, by name."""
    if isinstance(node, ast.Constant):
        return {"None"} if node.value is None else _hints(root, ast.parse(node.value, mode="eval").body, path)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _hints(root, node.left, path) | _hints(root, node.right, path)
    if isinstance(node, ast.Subscript):
        origin = _origin(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin in ("Optional", "Union"):
            return set().union(*(_hints(root, a, path) for a in args), {"None"} if origin == "Optional" else ())
        return _hints(root, args[0], path) if origin == "Annotated" else {origin}
    found = _definition(root, path, node.id) if isinstance(node, ast.Name) else None
    if found and isinstance(found[0], (ast.Assign, ast.AnnAssign)) and found[0].value is not None:
        return _hints(root, found[0].value, found[1])  # a type alias
    return {ast.unparse(node)}


def _field_action(root: Path, fld: _Field) -> object:
    """The action `get_kwargs` (and the edits since) give the field; None if none."""
    if (fld.name, "action") in fld.kwargs.edits:
        return fld.kwargs.edits[fld.name, "action"]
    cls = fld.kwargs.cls
    fields = _fields(root, cls)
    if fld.name not in fields:
        raise Unexpected(f"{cls.path}: get_kwargs({cls.node.name})[{fld.name!r}] is used, but no such field is found")
    hints = _hints(root, *fields[fld.name])
    return _BOOLEAN_ACTION if "bool" in hints and hints != {"bool", "str", "None"} else None


@dataclass
class _Walk:
    """A run of one function: its module, its variables and, for a method, its class."""
    root: Path
    path: Path
    flags: set[str]  # what every run found
    env: dict[str, object] = field(default_factory=dict)
    owner: _Class | None = None  # the class the method was called on: its `cls` (or `self`)
    defining: _Class | None = None  # the class the method is written in, for `super()`

    def block(self, body: list[ast.stmt]) -> object:
        """Run the statements; what the last `return` met gives."""
        returned = None
        for stmt in body:
            if isinstance(stmt, ast.Return):
                returned = self._eval(stmt.value)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                value = self._eval(stmt.value)
                for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                    self._assign(target, value)
            elif isinstance(stmt, ast.For):
                self._for(stmt)
            elif isinstance(stmt, (ast.If, ast.With, ast.Try)):  # every branch: options may hang on argv
                for part in (stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", []),
                             *(h.body for h in getattr(stmt, "handlers", []))):
                    returned = self.block(part) or returned
            elif isinstance(stmt, (ast.Expr, ast.AugAssign)):
                self._eval(stmt.value)
        return returned

    def _assign(self, target: ast.expr, value: object) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, ast.Tuple):
            for t, v in zip(target.elts, value if isinstance(value, (tuple, list)) else [None] * len(target.elts)):
                self._assign(t, v)
        elif isinstance(target, ast.Subscript) and text(target.slice):
            edited = self._eval(target.value)
            if isinstance(edited, _Field):  # kwargs["field"]["action"] = ...
                edited.kwargs.edits[edited.name, text(target.slice)] = value

    def _for(self, stmt: ast.For) -> None:
        items = self._eval(stmt.iter)
        # A loop over what the walk does not track runs once, its variables unknown: add_argument
        # refuses an option name built from them.
        for item in items if isinstance(items, list) else [None]:
            self._assign(stmt.target, item)
            self.block(stmt.body)

    def _eval(self, node: ast.expr | None) -> object:
        """The value the walk tracks for an expression (None: not tracked), running the calls in it."""
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id]
        if isinstance(node, (ast.Name, ast.Attribute)) and _origin(node).endswith("BooleanOptionalAction"):
            return _BOOLEAN_ACTION
        if isinstance(node, ast.Name):
            return _class(self.root, self.path, node)
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, (ast.JoinedStr, ast.List, ast.Tuple)):
            parts = [self._eval(v.value if isinstance(v, ast.FormattedValue) else v)
                     for v in getattr(node, "values", getattr(node, "elts", []))]
            if not all(isinstance(p, str) for p in parts):
                return None
            return "".join(parts) if isinstance(node, ast.JoinedStr) else parts
        if isinstance(node, ast.Subscript):
            kwargs, key = self._eval(node.value), text(node.slice)
            return _Field(kwargs, key) if isinstance(kwargs, _Kwargs) and key else None
        for child in ast.iter_child_nodes(node) if node else ():
            if isinstance(child, ast.expr):
                self._eval(child)
        return None

    def _call(self, node: ast.Call) -> object:
        name, func, where = call_name(node), node.func, f"{self.path}:{node.lineno}"
        receiver = self._eval(func.value) if isinstance(func, ast.Attribute) else None
        if name == "add_argument":
            return self._add_argument(node)
        if name in ("add_parser", "add_argument_group", "add_mutually_exclusive_group"):
            return _PARSER
        args = [self._eval(a) for a in node.args]
        keywords = {k.arg: self._eval(k.value) for k in node.keywords if k.arg}
        if name == "get_kwargs":
            if not args or not isinstance(args[0], _Class):
                raise Unexpected(f"{where}: the class of `{ast.unparse(node)}` is not found")
            return _Kwargs(args[0])
        if isinstance(receiver, str) and name == "replace" and all(isinstance(a, str) for a in args):
            return receiver.replace(*args)  # an option name from a field name: key.replace("_", "-")
        if isinstance(receiver, _Kwargs) and name == "items":  # the frontend's loop over its fields
            return [(f, _Field(receiver, f)) for f in _fields(self.root, receiver.cls)]
        if isinstance(receiver, _Field) and name in ("get", "pop"):  # value.pop("flags", [])
            return receiver.kwargs.edits.get((receiver.name, text(node.args[0])), args[1] if len(args) > 1 else None)
        handed = any(a is _PARSER or isinstance(a, (_Kwargs, _Field)) for a in (*args, *keywords.values()))
        if not handed or receiver is _PARSER or isinstance(receiver, (_Kwargs, _Field)):
            return None
        callee = self._callee(func)
        if callee is None and name not in _NOT_FOLLOWED:
            raise Unexpected(f"{where}: `{ast.unparse(func)}`, handed a parser or kwargs, is not found")
        if callee is None:
            return None
        fn, inner = callee
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if inner.owner is not None and not any(_origin(d) == "staticmethod" for d in fn.decorator_list):
            inner.env[params.pop(0)] = inner.owner
        inner.env.update(zip(params, args), **keywords)
        return inner.block(fn.body)

    def _callee(self, func: ast.expr) -> tuple[ast.FunctionDef, _Walk] | None:
        """The function a call runs, and a run of it (its arguments still to bind)."""
        if isinstance(func, ast.Name):
            found = _definition(self.root, self.path, func.id)
            if found and isinstance(found[0], ast.FunctionDef):
                return found[0], _Walk(self.root, found[1], self.flags)
            return None
        if not isinstance(func, ast.Attribute):
            return None
        if isinstance(func.value, ast.Call) and call_name(func.value) == "super" and self.defining:
            owner, classes = self.owner, _mro(self.root, self.defining)[1:]
        else:
            owner = self._eval(func.value)
            classes = _mro(self.root, owner) if isinstance(owner, _Class) else []
        for cls in classes:
            for fn in cls.node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == func.attr:
                    return fn, _Walk(self.root, cls.path, self.flags, owner=owner, defining=cls)
        return None

    def _add_argument(self, node: ast.Call) -> None:
        names = []
        for arg in node.args:
            starred = isinstance(arg, ast.Starred)
            value = self._eval(arg.value if starred else arg)
            values = value if starred else [value]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise Unexpected(f"{self.path}:{node.lineno}: cannot read the option name `{ast.unparse(arg)}`")
            names += [v[2:] for v in values if v.startswith("--")]
        if names and self._action([(k.arg, k.value) for k in node.keywords]) is _BOOLEAN_ACTION:
            names += ["no-" + n for n in names]
        self.flags.update(names)

    def _action(self, keywords) -> object:
        """The action (key, value) keyword arguments give: `action=`, `**kwargs["field"]`, `**{**...}`."""
        action = None
        for key, value in keywords:
            given = None
            if key == "action":
                given = self._eval(value)
            elif key is None and isinstance(value, ast.Dict):  # **{**kwargs["field"], "default": None}
                given = self._action(zip(map(text, value.keys), value.values))
            elif key is None:
                spread = self._eval(value)
                if not isinstance(spread, _Field):
                    raise Unexpected(f"{self.path}:{value.lineno}: `**{ast.unparse(value)}`: not a get_kwargs field")
                given = _field_action(self.root, spread)
            action = given or action
        return action


def serve_flags(vllm_root: Path) -> list[str]:
    """Every long option of `vllm serve` in the vLLM source tree at `vllm_root`, without `--`, sorted."""
    path = vllm_root / SERVE
    entry = find_function(module_ast(path), "subparser_init")
    if entry is None:
        raise Unexpected(f"{path}: no subparser_init (the serve subcommand's parser) to start from")
    walk = _Walk(vllm_root, path, set())
    walk.block(entry.body)
    if missing := _ANCHORS - walk.flags:
        raise Unexpected(f"{path}: the walk from it lost a registration path: no {sorted(missing)}")
    return sorted(walk.flags)
