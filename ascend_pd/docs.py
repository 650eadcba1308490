"""The reference page's sections (docs/reference.md), generated from the code so they cannot drift from it.

* **settings**: one row per key of the stack file, walked from `config.StackConfig`: the key as the
  stack file spells it (camelCase, dotted, `[]` for list items), its type in an operator's words
  (the `valuetypes.Kind` of each constrained type, with the field's own bounds), its default and its
  `Field(description=...)`; then a legend of the value types used.
* **derived**: the flags and variables the plan derives and the tuning maps refuse, with the setting
  to use instead (`plan.DERIVED_*`, `errors.DERIVED_PROXY_FLAGS`: the very tables validation uses).
* **deployed**: the start-order diagram of `ascend_pd/components/cluster.py` and one row per component, read
  from the components' source (their type token, their `Per:` and `Runs:` docstring fields, and the
  components they take as arguments, which are what they wait for). The source is parsed, not
  imported, so this module stays free of `import pulumi` like the rest of the package.

Each section sits in docs/reference.md between `<!-- BEGIN GENERATED: <name> ... -->` and
`<!-- END GENERATED: <name> -->`. `python -m ascend_pd docs --write` rewrites them, `--check` exits
1 when one is stale; tests/test_docs.py fails on the same condition.

A new setting, value type or component appears here without any change to this module; one this
module cannot describe (a type without a Kind, a field without a description, a component without
`Per:`/`Runs:`) raises DocsError naming it.
"""

from __future__ import annotations

import ast
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Optional, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from . import plan
from .config import SECRET_KEYS, StackConfig
from .errors import DERIVED_PROXY_FLAGS
from .valuetypes import Kind

PROJECT_DIR = Path(__file__).resolve().parent.parent
REFERENCE = PROJECT_DIR / "docs" / "reference.md"  # the page that holds the generated sections
COMPONENTS_DIR = Path(__file__).resolve().parent / "components"
WRITE_COMMAND = "python -m ascend_pd docs --write"

# The stack-file keys that are not StackConfig fields (config.SECRET_KEYS), documented here.
SECRET_DOCS = {
    "sshPrivateKey": (
        "secret: SSH private key",
        "The private key pulumi-command logs in with, set with `pulumi config set --secret "
        "ascend-pd:sshPrivateKey < key` (encrypted in the stack file, never written to a resource input, output or "
        "log in plain text). Unset: ssh-agent. pulumi-docker never uses it: load the same key into ssh-agent.",
    ),
    "proxyApiKey": (
        "secret: the PD proxy's key",
        "What clients send as `Authorization: Bearer <key>` under `proxy.auth` (required then: `pulumi up` refuses "
        "to deploy without it), set with `pulumi config set --secret ascend-pd:proxyApiKey \"$(openssl rand -hex "
        "32)\"`. It reaches the proxy node as a Pulumi secret on a Command's stdin, into a 0600 file the proxy reads; "
        "a new key restarts the proxy. `status`, `heal` and the exporter send `$ASCEND_PD_PROXY_API_KEY`.",
    ),
}


class DocsError(ValueError):
    """The code holds something the docs cannot describe: fix the code (the message says what)."""


# ---------------------------------------------------------------------------------------------
# Markdown


def cell(text: str) -> str:
    """Text for a markdown table cell: one line, `|` escaped, and outside code spans `<`, `>`
    and `*` escaped so GitHub shows them instead of reading HTML or emphasis."""
    text = " ".join(text.split())
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*"))
    return "".join(out)


def code(value: str) -> str:
    return f"`{value}`" if "`" not in value else f"`` {value} ``"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Types in an operator's words


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """(base type, Annotated metadata, flattened: a pydantic Field inside Annotated adds its own)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        meta += list(tp.__metadata__)
        tp = tp.__origin__
    flat: list[Any] = []
    for m in meta:
        flat += list(m.metadata) if isinstance(m, FieldInfo) else [m]
    return tp, flat


def _kind(meta: list[Any]) -> Optional[Kind]:
    kinds = [m for m in meta if isinstance(m, Kind)]
    return kinds[-1] if kinds else None


def _bounds(meta: list[Any]) -> tuple[Optional[float], Optional[float]]:
    ge = le = None
    for m in meta:
        ge = getattr(m, "ge", ge) if type(m).__name__ in ("Ge", "Interval") else ge
        le = getattr(m, "le", le) if type(m).__name__ in ("Le", "Interval") else le
    return ge, le


# An upper bound this large only guards against overflow: not worth an operator's attention.
UNREMARKABLE_MAX = 2**31


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _range(ge: Optional[float], le: Optional[float]) -> str:
    le = None if le is not None and le >= UNREMARKABLE_MAX else le
    if ge is not None and le is not None:
        return f"{_number(ge)}–{_number(le)}"
    if ge is not None:
        return f"≥ {_number(ge)}"
    if le is not None:
        return f"≤ {_number(le)}"
    return ""


def _models(tp: Any) -> list[type[BaseModel]]:
    """The models a (possibly nested, Optional, list or Union) type holds, in order."""
    tp, _ = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(tp):
        for m in _models(arg):
            if m not in out:
                out.append(m)
    return out


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _object_shape(model: type[BaseModel]) -> str:
    return "{" + ", ".join(f.alias or n for n, f in model.model_fields.items()) + "}"


def describe_type(tp: Any, extra_meta: Iterable[Any] = (), plural: bool = False) -> str:
    """An operator's name for a type: `port`, `seconds (≥ 60)`, `list of node names`,
    `map: env var name → string`. Raises DocsError for a type it has no words for."""
    base, meta = _unwrap(tp)
    meta = meta + list(extra_meta)
    kind = _kind(meta)
    if kind is not None:
        ge, le = _bounds(meta)
        shown = _range(ge if ge != kind.ge else None, le if le != kind.le else None)
        name = kind.names if plural else kind.name
        return f"{name} ({shown})" if shown else name
    if _is_union(base):
        args = [a for a in typing.get_args(base) if a is not type(None)]
        if len(args) == 1:  # Optional[X]: the default column says it may be unset
            return describe_type(args[0], meta, plural)
        models = [m for m in (_unwrap(a)[0] for a in args) if isinstance(m, type) and issubclass(m, BaseModel)]
        if models and len(models) == len(args):
            shapes = " or ".join(f"`{_object_shape(m)}`" for m in models)
            return f"{shapes} objects" if plural else f"object: {shapes}"
        names = [describe_type(a, plural=plural) for a in typing.get_args(base)]
        return ", ".join(names[:-1]) + " or " + names[-1]
    if base is type(None):
        return "null"
    if typing.get_origin(base) is Literal:
        return " or ".join(code(str(v)) for v in typing.get_args(base))
    origin = typing.get_origin(base)
    if origin is list or base is list:
        args = typing.get_args(base)
        if not args:
            return "lists" if plural else "list"
        return f"list of {describe_type(args[0], plural=True)}"
    if origin is dict or base is dict:
        args = typing.get_args(base)
        if not args:
            return "maps" if plural else "map"
        return f"map: {describe_type(args[0])} → {describe_type(args[1])}"
    if isinstance(base, type) and issubclass(base, BaseModel):
        return "objects" if plural else "object"
    ge, le = _bounds(meta)
    shown = _range(ge, le)
    words = {bool: ("boolean", "booleans"), int: ("integer", "integers"), float: ("number", "numbers"),
             str: ("string", "strings")}
    if base in words:
        name = words[base][1 if plural else 0]
        return f"{name} ({shown})" if shown else name
    raise DocsError(f"no operator's name for the type {tp!r}: give it a valuetypes.Kind")


def kinds_used(tp: Any, found: dict[str, Kind]) -> None:
    base, meta = _unwrap(tp)
    kind = _kind(meta)
    if kind is not None:
        found.setdefault(kind.name, kind)
    for arg in typing.get_args(base):
        if not isinstance(arg, (str, int, float, bool)):
            kinds_used(arg, found)


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class Setting:
    keys: tuple[str, ...]  # one per place the field lives: ("prefill.dp", "decode.dp")
    type: str
    default: str
    description: str


def _default(f: FieldInfo) -> str:
    if f.default is PydanticUndefined and f.default_factory is None:
        return "required"
    value = f.default_factory() if f.default_factory is not None else f.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "optional"
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, (list, tuple)):
        return ", ".join(code(str(v)) for v in value) if value else code("[]")
    if isinstance(value, dict):
        return code("{}") if not value else ", ".join(f"{code(str(k))}: {code(str(v))}" for k, v in value.items())
    return code(str(value))


def _description(model: type[BaseModel], name: str, f: FieldInfo) -> str:
    text = (f.description or "").strip()
    if not text:
        raise DocsError(f"{model.__name__}.{name} has no description: add Field(description=...) in config.py")
    return text


def settings(model: type[BaseModel] = StackConfig) -> list[Setting]:
    """Every key of the stack file, depth first in field order. Fields of one model type that
    live side by side (prefill and decode are both a Role) share their rows."""
    out: list[Setting] = []

    def walk(model: type[BaseModel], prefixes: tuple[str, ...]) -> None:
        fields = list(model.model_fields.items())
        done: set[str] = set()
        for name, f in fields:
            if name in done:
                continue
            siblings = [(name, f)]
            models = _models(f.annotation)
            if models:
                siblings += [(n, g) for n, g in fields if n != name and n not in done
                             and g.annotation == f.annotation and _default(g) == _default(f)]
            done.update(n for n, _ in siblings)
            keys = tuple(p + (g.alias or n) for p in prefixes for n, g in siblings)
            descriptions = [_description(model, n, g) for n, g in siblings]
            # Side-by-side fields say which is which in their own descriptions ("The prefill role: ...").
            description = " ".join(dict.fromkeys(descriptions))
            out.append(Setting(keys, describe_type(f.annotation, f.metadata), _default(f), description))
            base = _unwrap(f.annotation)[0]
            args = [a for a in typing.get_args(base) if a is not type(None)] if _is_union(base) else [base]
            container = typing.get_origin(_unwrap(args[0])[0]) if len(args) == 1 else None
            suffix = "[]." if container is list else ".<name>." if container is dict else "."
            for sub in models:
                walk(sub, tuple(k + suffix for k in keys))

    walk(model, ("",))
    return out


def _kinds_of_settings(model: type[BaseModel] = StackConfig) -> dict[str, Kind]:
    found: dict[str, Kind] = {}
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for f in model.model_fields.values():
            kinds_used(typing.Annotated[f.annotation, *f.metadata] if f.metadata else f.annotation, found)
            for sub in _models(f.annotation):
                walk(sub)

    walk(model)
    return found


def settings_section() -> str:
    rows = []
    for s in settings():
        keys = ", ".join(code(k) for k in s.keys)
        rows.append([keys, cell(s.type), cell(s.default), cell(s.description)])
    for key in SECRET_KEYS:
        if key not in SECRET_DOCS:
            raise DocsError(f"the secret key {key} (config.SECRET_KEYS) has no entry in docs.SECRET_DOCS")
        kind, text = SECRET_DOCS[key]
        rows.append([code(key), cell(kind), "unset", cell(text)])
    legend = sorted(_kinds_of_settings().values(), key=lambda k: k.name.lower())
    return (
        table(["setting", "type", "default", "description"], rows)
        + "\n\nValue types:\n\n"
        + table(["type", "accepts"], [[cell(k.name), cell(k.accepts)] for k in legend])
    )


# ---------------------------------------------------------------------------------------------
# Derived flags and variables


def derived_section() -> str:
    roles = ", ".join(code(f"{r}.flags") for r in ("vllm",) + plan.ROLES)
    envs = ", ".join(code(f"{r}.env") for r in ("vllm",) + plan.ROLES)
    rows = [[code(f"--{k}"), roles, cell(v)] for k, v in plan.DERIVED_FLAGS.items()]
    rows += [[code(k), envs, cell(v)] for k, v in plan.DERIVED_ENV.items()]
    rows += [[code(f"--{k}"), code("yuanrong.flags"), cell(v)] for k, v in plan.DERIVED_WORKER_FLAGS.items()]
    rows.append([", ".join(code(f"--{k}") for k in DERIVED_PROXY_FLAGS), code("proxy.flags"),
                 cell("derived from the rank layout and proxy.node/port; proxy.flags takes only the four flags above")])
    return (
        "Derived by the plan, and refused where the stack file would set them a second time (in any spelling: "
        "`tensor_parallel_size` is `--tensor-parallel-size`); the error says which setting to use instead:\n\n"
        + table(["derived", "refused in", "because / use instead"], rows)
    )


# ---------------------------------------------------------------------------------------------
# Components


@dataclass(frozen=True)
class Component:
    name: str
    token: str
    per: str
    runs: str
    after: tuple[str, ...]  # the components it takes as arguments (and so waits for)
    module: str


def _field(doc: str, label: str) -> Optional[str]:
    """The text of a `Label: ...` paragraph of a docstring (continuation lines indented)."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(label + ":"):
            text = [line[len(label) + 1:].strip()]
            for more in lines[i + 1:]:
                if not more.strip() or not more.startswith(" "):
                    break
                text.append(more.strip())
            return " ".join(text)
    return None


def components(directory: Path = COMPONENTS_DIR) -> list[Component]:
    """Every ComponentResource under `directory`, dependencies first (ties by name)."""
    found: dict[str, tuple[ast.ClassDef, str]] = {}
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("ComponentResource") for b in node.bases):
                found[node.name] = (node, path.stem)
    out: dict[str, Component] = {}
    for name, (node, module) in found.items():
        doc = ast.get_docstring(node) or ""
        per, runs = _field(doc, "Per"), _field(doc, "Runs")
        if not per or not runs:
            raise DocsError(f"ascend_pd/components/{module}.py: {name}'s docstring needs a `Per:` and a `Runs:` paragraph "
                            "(docs/reference.md's deployment table is generated from them)")
        token = None
        after: list[str] = []
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                for call in ast.walk(item):
                    if (isinstance(call, ast.Call) and ast.unparse(call.func) == "super().__init__" and call.args
                            and isinstance(call.args[0], ast.Constant)):
                        token = call.args[0].value
                for arg in item.args.kwonlyargs + item.args.args:
                    text = ast.unparse(arg.annotation) if arg.annotation else ""
                    after += [other for other in found if other != name and re.search(rf"\b{other}\b", text)
                              and other not in after]
        if not token:
            raise DocsError(f"ascend_pd/components/{module}.py: {name}.__init__ passes no literal type token to super().__init__")
        out[name] = Component(name, token, per, runs, tuple(after), module)
    ordered: list[Component] = []
    while len(ordered) < len(out):
        ready = sorted(n for n, c in out.items() if c not in ordered and all(out[a] in ordered for a in c.after))
        if not ready:
            raise DocsError(f"components depend on each other in a cycle: {sorted(set(out) - {c.name for c in ordered})}")
        ordered.append(out[ready[0]])
    return ordered


def _start_order(directory: Path = COMPONENTS_DIR) -> str:
    """The indented diagram of cluster.py's module docstring."""
    doc = ast.get_docstring(ast.parse((directory / "cluster.py").read_text(encoding="utf-8")), clean=False) or ""
    block, started = [], False
    for line in doc.splitlines():
        if line.startswith("    ") and line.strip():
            block.append(line[4:])
            started = True
        elif started and line.strip():
            break
        elif started:
            block.append("")
    if not block:
        raise DocsError("ascend_pd/components/cluster.py's docstring has no indented start-order diagram")
    return "\n".join(block).rstrip()


def deployed_section(directory: Path = COMPONENTS_DIR) -> str:
    rows = [[code(c.name), cell(c.per), ", ".join(code(a) for a in c.after) or "—", cell(c.runs)]
            for c in components(directory)]
    return ("```\n" + _start_order(directory) + "\n```\n\n"
            + table(["component (`ascend-pd:index:…`)", "per", "after", "what it runs"], rows))


# ---------------------------------------------------------------------------------------------
# The reference page


SECTIONS = {
    "settings": settings_section,
    "derived": derived_section,
    "deployed": deployed_section,
}


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- BEGIN GENERATED: {name} (edit the code, then run `{WRITE_COMMAND}`) -->",
            f"<!-- END GENERATED: {name} -->")


def render(readme: str) -> str:
    """`readme` with every generated section replaced by what the code says now."""
    for name, make in SECTIONS.items():
        begin, end = _markers(name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if len(pattern.findall(readme)) != 1:
            raise DocsError(f"{REFERENCE.name} needs exactly one pair of markers for the {name!r} section:\n{begin}\n{end}")
        readme = pattern.sub(lambda _m: f"{begin}\n{make()}\n{end}", readme)
    return readme


def stale_sections(readme: str) -> list[str]:
    """The names of the generated sections whose page text differs from the code's."""
    fresh = render(readme)
    out = []
    for name in SECTIONS:
        begin, end = _markers(name)

        def body(text: str) -> str:
            return text.split(begin, 1)[1].split(end, 1)[0]
        if body(readme) != body(fresh):
            out.append(name)
    return out


def main(write: bool = False, check: bool = False, readme_path: Path = REFERENCE) -> int:
    """`docs` prints the sections, `docs --write` rewrites them in docs/reference.md, `docs --check`
    exits 1 when that page is stale. Exit 2 when the code holds something the docs cannot describe."""
    try:
        if not (write or check):
            for name, make in SECTIONS.items():
                print(f"<!-- {name} -->\n{make()}\n")
            return 0
        readme = readme_path.read_text(encoding="utf-8")
        fresh = render(readme)
        stale = stale_sections(readme)
    except DocsError as exc:
        print(f"docs: {exc}", file=sys.stderr)
        return 2
    if not stale:
        print(f"docs: {readme_path.name} is up to date")
        return 0
    if write:
        readme_path.write_text(fresh, encoding="utf-8")
        print(f"docs: rewrote {', '.join(stale)} in {readme_path.name}")
        return 0
    print(f"docs: {readme_path.name} is stale in {', '.join(stale)}: run `{WRITE_COMMAND}`", file=sys.stderr)
    return 1
