"""Read a stack's configuration the way the Pulumi CLI hands it to the program.

The CLI gives the program a flat map of namespaced keys (`ascend-pd:nodes`) whose structured values
arrive as JSON text. `render` and `status` have no CLI, so they read `Pulumi.<stack>.yaml` (and the
project's config defaults in `Pulumi.yaml`) into that same flat map; `__main__` builds it from
`pulumi.Config`. Both then go through `load_config`, so validation is identical.

The CLI parses YAML 1.2 (`yes` is a string, `2026-01-01` is a string, `010` is ten); PyYAML speaks
YAML 1.1 by default, so the files are read with a YAML 1.2 core-schema loader. Every way a file
can be unreadable (encoding, syntax, shape) is a `ConfigError` like any invalid setting.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from .config import PROJECT, SECRET_KEYS, StackConfig
from .errors import ConfigError, Problem, from_validation_error, setting
from .valuetypes import unsafe_reason

PROJECT_DIR = Path(__file__).resolve().parent.parent


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars (what the Pulumi CLI's Go parser
    reads): booleans are only true/false, no timestamps, no sexagesimal or 0-prefixed octal ints."""


_Yaml12Loader.yaml_implicit_resolvers = {}
for _tag, _regex, _first in (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     "-+0123456789."),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
):
    _Yaml12Loader.add_implicit_resolver(_tag, re.compile(_regex), list(_first))


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    return int(text[2:], 8) if text.startswith("0o") else int(text, 0) if text.startswith("0x") else int(text, 10)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
    dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if dup is not None:
        raise yaml.constructor.ConstructorError(None, None, f"key {dup!r} appears twice", node.start_mark)
    return loader.construct_mapping(node)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _read_yaml(path: Path) -> Any:
    where = path.name
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(where, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                   f"{exc.start})", "save the file as UTF-8")]) from None
    except OSError as exc:
        raise ConfigError([Problem(where, f"cannot be read: {exc.strerror}", "check the file")]) from None
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a safe loader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([Problem(where, f"is not valid YAML{at}: {what}",
                                   "fix the syntax (indent with spaces, never tabs; quote values with ': ' or '#')")]) from None


def _check_raw(value: Any, path: tuple, problems: list[Problem]) -> None:
    """Refuse what no setting may hold, wherever it is (keys included): values YAML types that JSON
    cannot carry (dates, binary), non-string keys, control characters and the reserved prefix."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(Problem(setting(*path, str(k)), f"the key {k!r} is not text",
                                        "write keys as text (quote them)"))
                continue
            why = unsafe_reason(k)
            if why:
                problems.append(Problem(setting(*path, k.encode("unicode_escape").decode()), f"the key {why}",
                                        "write a plain key"))
                continue
            _check_raw(v, path + (k,), problems)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_raw(v, path + (i,), problems)
    elif isinstance(value, str):
        why = unsafe_reason(value)
        if why:
            problems.append(Problem(setting(*path), why, "write the value on one line, without control characters"))
    elif isinstance(value, float) and not math.isfinite(value):
        problems.append(Problem(setting(*path), f"{value} is not a number a setting can hold", "write a finite number"))
    elif not (value is None or isinstance(value, (bool, int, float))):
        problems.append(Problem(setting(*path), f"a {type(value).__name__} value is not supported",
                                "write text, a number, true/false, a list or a mapping"))


def _config_section(doc: Any, where: str) -> dict:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([Problem(where, f"holds a {type(doc).__name__}, not a mapping", "start it with `config:`")])
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError([Problem(f"{where} config", f"is a {type(config).__name__}, not a mapping",
                                   "write `config:` followed by indented `ascend-pd:<setting>: value` lines")])
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        raise ConfigError([Problem(f"{where} config", f"the key {k!r} is not text",
                                   "write keys as `ascend-pd:<setting>`") for k in bad])
    return config


def _strip_namespace(key: str) -> str | None:
    """`ascend-pd:nodes` -> `nodes`; bare keys belong to the project; other namespaces -> None."""
    if ":" not in key:
        return key
    ns, _, name = key.partition(":")
    return name if ns == PROJECT else None


def cli_config_map(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, str]:
    """The `ascend-pd:*` map the CLI would pass for `stack`: project defaults overlaid by the stack
    file, every value serialised as the CLI does (strings as-is, everything else as JSON).
    Secure (encrypted) values are left out: only `pulumi` can decrypt them."""
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.is_file():
        known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))
        raise ConfigError(
            [Problem(f"--stack {stack}", f"no stack file {stack_file.name}", f"use one of {known}")]
        )
    merged: dict[str, Any] = {}
    project = _read_yaml(project_dir / "Pulumi.yaml")
    for key, decl in _config_section(project, "Pulumi.yaml").items():
        name = _strip_namespace(key)
        if name is None:
            continue
        if isinstance(decl, dict) and ("default" in decl or "value" in decl):
            merged[name] = decl.get("value", decl.get("default"))
        elif not isinstance(decl, dict):
            merged[name] = decl
    for key, value in _config_section(_read_yaml(stack_file), stack_file.name).items():
        name = _strip_namespace(key)
        if name is None:
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            merged.pop(name, None)
            continue
        merged[name] = value
    problems: list[Problem] = []
    for name, value in merged.items():
        _check_raw(value, (name,), problems)
    if problems:
        raise ConfigError(problems)
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in merged.items()}


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain string value, exactly as `pulumi config set` stores it


# Flag maps whose keys two spellings reach (vLLM and the worker treat `_` and `-` alike).
_FLAG_MAPS = {("vllm", "flags"): "-", ("prefill", "flags"): "-", ("decode", "flags"): "-", ("yuanrong", "flags"): "_"}


def _same_flag_twice(data: dict) -> list[Problem]:
    out = []
    for (section, key), sep in _FLAG_MAPS.items():
        flags = (data.get(section) or {}).get(key) if isinstance(data.get(section), dict) else None
        if not isinstance(flags, dict):
            continue
        seen: dict[str, str] = {}
        for k in flags:
            if not isinstance(k, str):
                continue
            norm = k.replace("_" if sep == "-" else "-", sep)
            if norm in seen:
                out.append(Problem(setting(section, key, k), f"is the same flag as {seen[norm]!r}",
                                   "keep one of the two spellings"))
            seen.setdefault(norm, k)
    return out


def load_config(raw: Mapping[str, str]) -> StackConfig:
    """Validate the flat CLI-style map into a StackConfig or raise ConfigError."""
    data = {k: _decode(v) for k, v in raw.items() if k not in SECRET_KEYS}
    problems: list[Problem] = []
    for name, value in data.items():
        _check_raw(value, (name,), problems)
    problems += _same_flag_twice(data)
    if problems:
        raise ConfigError(problems)
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def load_stack(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return load_config(cli_config_map(stack, project_dir))


__all__ = ["cli_config_map", "load_config", "load_stack", "setting"]
