"""One clear error per problem: where it is written (file and line), the setting as written in the
stack file, what is wrong, the fix. pydantic's own wording never reaches the operator: its errors
are translated here into plain words naming the expected kind of value."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Union

from pydantic import BaseModel, ValidationError

from .config import PROJECT, SECRET_KEYS, StackConfig


@dataclass(frozen=True)
class Problem:
    setting: str  # as the operator writes it: "ascend-pd:prefill.tp"
    message: str
    fix: str
    where: str = ""  # the file (and line) that holds it: "Pulumi.a2-8node.yaml:42"; "" for the CLI's flat map

    def __str__(self) -> str:
        at = f"{self.where}: " if self.where else ""
        return f"{at}{self.setting}: {self.message}. Fix: {self.fix}."


class ConfigError(ValueError):
    """Raised before any resource exists; lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid ascend-pd stack configuration ({len(self.problems)} problem(s)):\n{lines}")


def setting(*path: object) -> str:
    """Render a path like ("prefill", "tp") as `ascend-pd:prefill.tp`; list indices as [i]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return f"{PROJECT}:{out}"


# The last step of a setting's path: `.name` or `[3]`.
_LAST_STEP = re.compile(r"(\[\d+\]|\.[^.\[\]]*)$")


def parent_setting(name: str) -> str | None:
    """`ascend-pd:nodes[3].name` -> `ascend-pd:nodes[3]` -> `ascend-pd:nodes` -> None."""
    ns, sep, path = name.partition(":")
    last = _LAST_STEP.search(path)
    if not sep or not last or last.start() == 0:
        return None
    return f"{ns}:{path[:last.start()]}"


def _spellings(name: str) -> tuple[str, ...]:
    """`name`, then with its last key in the other flag spelling: the plan names a flag
    `prefill.flags.tensor-parallel-size` that the file may spell `tensor_parallel_size`."""
    head, sep, last = name.rpartition(".")
    if not sep:
        return (name,)
    return (name, f"{head}.{last.replace('_', '-')}", f"{head}.{last.replace('-', '_')}")


@dataclass(frozen=True, eq=False)
class Source:
    """Where a stack's settings were read: the stack file, and the file and line of every setting
    (as `setting()` names it) the YAML held. Problems from a file name it, and the line when known."""

    file: str  # the stack file's name: named by every problem, with or without a line
    lines: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def where(self, name: str) -> str:
        """`Pulumi.a2-8node.yaml:42` for the setting's own line; failing that its nearest written
        parent's (a missing `prefill.tp` points at `ascend-pd:prefill`); failing that the file."""
        probe: str | None = name
        while probe:
            for spelling in _spellings(probe):
                if spelling in self.lines:
                    file, line = self.lines[spelling]
                    return f"{file}:{line}"
            probe = parent_setting(probe)
        return self.file

    def locate(self, error: ConfigError) -> ConfigError:
        """The same problems, each naming where it is written. Problems that already name a place,
        or that are about a file as a whole (its syntax, its encoding), stay as they are."""
        return ConfigError([
            dataclasses.replace(p, where=self.where(p.setting))
            if not p.where and p.setting.startswith(f"{PROJECT}:") else p
            for p in error.problems
        ])


# ---------------------------------------------------------------------------------------------
# pydantic's errors in ascend-pd's words

# What a setting must hold, for each of pydantic's type errors.
_EXPECTED = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "text",
    "dict_type": "a mapping (`key: value` lines, or `{key: value}`)",
    "model_type": "a mapping of settings (`key: value` lines, or `{key: value}`)",
    "model_attributes_type": "a mapping of settings (`key: value` lines, or `{key: value}`)",
    "list_type": "a list (`- item` lines, or `[a, b]`)",
}
# The same, short, for a value that may be one of several kinds (an env value: text or a number).
_KIND_WORD = {"int_type": "a whole number", "float_type": "a number", "bool_type": "true/false",
              "string_type": "text", "dict_type": "a mapping", "model_type": "a mapping", "list_type": "a list"}
_BOUNDS = {"greater_than_equal": ("at least", "ge"), "less_than_equal": ("at most", "le"),
           "greater_than": ("more than", "gt"), "less_than": ("less than", "lt")}
# Text that YAML would have read as a number had it not been quoted (`"8088"`).
_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_NUMBER_TEXT = re.compile(r"\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")
_ABSENT = object()


def _shown(value: object) -> str:
    """A value as the operator wrote it in YAML: true/false/null, text quoted."""
    text = json.dumps(value) if isinstance(value, bool) or value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _got(value: object) -> str:
    return "" if value is _ABSENT or isinstance(value, (dict, list)) else f" (got {_shown(value)})"


def _quoted_scalar(kind: str, value: object) -> tuple[str, str] | None:
    """A number or true/false written in quotes: YAML hands over text, the setting wants the value."""
    if not isinstance(value, str):
        return None
    if kind.startswith("int_") and _INT_TEXT.fullmatch(value) or \
            kind.startswith("float_") and _NUMBER_TEXT.fullmatch(value):
        return f"is the text {value!r}, not a number", "write the number without quotes"
    if kind.startswith("bool_") and value.strip().lower() in ("true", "false"):
        return f"is the text {value!r}, not true or false", "write true or false without quotes"
    return None


def _size_words(kind: str, ctx: dict) -> tuple[str, str] | None:
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return ("must not be empty", "write a value") if n == 1 else \
            (f"must have at least {n} characters", "write a longer value")
    if kind == "string_too_long":
        return f"must have at most {ctx.get('max_length')} characters", "write a shorter value"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"must have at least {n} item{'s' if n != 1 else ''}", "add the missing items"
    if kind == "too_long":
        n = ctx.get("max_length")
        return f"must have at most {n} item{'s' if n != 1 else ''}", "remove the extra items"
    return None


def plain_words(err: dict) -> tuple[str, str]:
    """(message, fix) for one pydantic error, in ascend-pd's words."""
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input", _ABSENT)
    if kind == "missing":
        return "required setting is missing", "add it to the stack file"
    if kind in _EXPECTED:
        return _quoted_scalar(kind, given) or (f"must be {_EXPECTED[kind]}{_got(given)}", f"write {_EXPECTED[kind]}")
    if kind in _BOUNDS:
        word, key = _BOUNDS[kind]
        return f"must be {word} {ctx.get(key)}{_got(given)}", "use a value within the stated bounds"
    sized = _size_words(kind, ctx)
    if sized:
        return sized
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}{_got(given)}", "write one of those values"
    # Our validators' own sentences (valuetypes, config), minus pydantic's prefix.
    msg = re.sub(r"^(Value error|Assertion failed), ", "", err["msg"])
    msg = re.sub(r"^Input should be\b", "must be", msg)
    if given is not _ABSENT and not isinstance(given, (dict, list)) and repr(given) not in msg:
        msg += _got(given)
    return msg, "correct the value as the message says" if kind in ("value_error", "assertion_error") else \
        "correct the value"


# ---------------------------------------------------------------------------------------------
# Locations and unions

# Proxy flags the plan derives from the rank layout (ascend-pd:proxy.flags takes only four).
DERIVED_PROXY_FLAGS = ("host", "port", "prefiller-hosts", "prefiller-ports", "decoder-hosts", "decoder-ports")
_SCALAR_TAGS = ("str", "int", "float", "bool", "dict", "list", "none")


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] and Optional[X] -> X."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """Every model class inside a field type (through Optional, list, dict and unions)."""
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def _union_member_names() -> frozenset[str]:
    """The model classes that are members of a union somewhere in the stack file (PipStep,
    PatchStep): pydantic puts their names in error locations."""
    found: set[str] = set()

    def scan(tp: Any) -> None:
        tp = _unwrap(tp)
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (Union, types.UnionType):
            found.update(a.__name__ for a in args if isinstance(a, type) and issubclass(a, BaseModel))
        for a in args:
            scan(a)

    seen: set[type] = set()
    todo = [StackConfig]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for f in model.model_fields.values():
            scan(f.annotation)
            todo.extend(_models_in(f.annotation))
    return frozenset(found)


def _is_tag(part: object) -> bool:
    """Whether a location part names a union member (a type), not a setting."""
    return isinstance(part, str) and (part in _SCALAR_TAGS or part.startswith(("function-", "constrained-"))
                                      or part in _UNION_MEMBERS)


_UNION_MEMBERS = _union_member_names()


def _step(tp: Any, part: object) -> Any:
    """The type one location part below `tp`, or None."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if getattr(a, "__name__", None) == part), None)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return next((f.annotation for n, f in tp.model_fields.items() if part in (n, f.alias)), None)
    if origin is list and isinstance(part, int):
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    return None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model whose fields are the settings at pydantic location `loc` (union members included)."""
    tp: Any = StackConfig
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def did_you_mean(typed: str, names: list[str], cutoff: float = 0.6) -> str | None:
    """The name of `names` that `typed` most likely misspells (case aside), or None."""
    by_lower = {n.lower(): n for n in names}
    match = difflib.get_close_matches(typed.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[match[0]] if match else None


def _unknown_setting_fix(raw_loc: tuple, shown: list) -> str:
    model = _model_at(raw_loc[:-1])
    names = [f.alias or n for n, f in model.model_fields.items()] if model else []
    if model is StackConfig:
        names += list(SECRET_KEYS)
    near = did_you_mean(str(raw_loc[-1]), names)
    return unknown_setting_fix(setting(*shown[:-1], near).split(":", 1)[1] if near else None)


def unknown_setting_fix(meant: str | None) -> str:
    """The fix of an unknown setting, `meant` being the setting it likely misspells (`prefill.tp`)."""
    table = "the README's settings table lists every setting"
    if meant:
        return f"did you mean '{meant}'? Otherwise remove it ({table})"
    return f"remove it or correct its spelling ({table})"


def _shown_loc(raw_loc: tuple) -> list:
    return [p for p in raw_loc if not _is_tag(p)]


def _one_per_union(errors: list[dict]) -> list[dict]:
    """Errors of a value that fits none of a union's members come once per member; keep those of
    the member the value resembles most (fewest errors), or, when every member only refuses the
    value's type, one error naming every kind the setting takes."""
    groups: dict[tuple, dict[object, list[dict]]] = {}
    order: list[object] = []
    for err in errors:
        loc = tuple(err["loc"])
        at = next((i for i, p in enumerate(loc) if _is_tag(p)), None)
        if at is None:
            order.append(err)
            continue
        key = loc[:at]
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key].setdefault(loc[at], []).append(err)
    out: list[dict] = []
    for item in order:
        if isinstance(item, dict):
            out.append(item)
            continue
        members = list(groups[item].values())
        kinds = [e[0]["type"] for e in members if len(e) == 1 and len(e[0]["loc"]) == len(item) + 1]
        if len(kinds) == len(members) and all(k in _KIND_WORD for k in kinds):
            words = list(dict.fromkeys(_KIND_WORD[k] for k in kinds))
            if "a number" in words and "a whole number" in words:
                words.remove("a whole number")
            expected = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
            out.append({**members[0][0], "type": "union_kinds", "ctx": {"expected": expected}})
        else:
            out.extend(min(members, key=len))
    return out


def from_validation_error(exc: ValidationError) -> ConfigError:
    """Translate pydantic's dump into one Problem per error, naming the setting as written."""
    problems = []
    for err in _one_per_union(exc.errors(include_url=False)):
        raw_loc = tuple(err["loc"])
        loc = _shown_loc(raw_loc)
        bad_name = bool(loc) and loc[-1] == "[key]"
        if bad_name:
            loc = loc[:-1]
        if err["type"] == "extra_forbidden" and loc[:2] == ["proxy", "flags"] and \
                str(loc[-1]).lstrip("-") in DERIVED_PROXY_FLAGS:
            problems.append(Problem(setting(*loc), "is derived by ascend-pd from the rank layout and proxy.node/port",
                                    "remove it; only max-retries, retry-delay, max-waiting-retries and "
                                    "waiting-retry-interval are tunable"))
        elif err["type"] == "extra_forbidden":
            problems.append(Problem(setting(*loc), "unknown setting", _unknown_setting_fix(raw_loc, loc)))
        elif err["type"] == "union_kinds":
            given = err.get("input", _ABSENT)
            problems.append(Problem(setting(*loc), f"must be {err['ctx']['expected']}{_got(given)}",
                                    f"write {err['ctx']['expected']}"))
        else:
            msg, fix = plain_words(err)
            problems.append(Problem(setting(*loc), f"bad name: {msg}" if bad_name else msg, fix))
    return ConfigError(problems)
