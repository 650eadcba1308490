"""Read a stack's configuration the way the Pulumi CLI hands it to the program.

The CLI gives the program a flat map of namespaced keys (`ascend-pd:nodes`) whose structured values
arrive as JSON text. `render` and `status` have no CLI, so they read `Pulumi.<stack>.yaml` (and the
project's config defaults in `Pulumi.yaml`) into that same flat map; `__main__` builds it from
`pulumi.Config`. Both then go through `load_config`, so validation is identical.

The CLI parses YAML 1.2 (`yes` is a string, `2026-01-01` is a string, `010` is ten); PyYAML speaks
YAML 1.2 by default, so the files are read with a YAML 1.2 core-schema loader. Every way a file
can be unreadable (encoding, syntax, shape) is a `ConfigError` like any invalid setting.

A problem found in a file names the file and the line of the setting (`Pulumi.a2-8node.yaml:42:
ascend-pd:prefill.tp: ...`): the loader keeps the line of every key it reads (a `Source`). The
flat map the Pulumi CLI hands over has no file, so its problems name the setting alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

import yaml
from pydantic import ValidationError

from .config import PROJECT, SECRET_KEYS, StackConfig, setting_names
from .errors import (ConfigError, Problem, Source, did_you_mean, from_validation_error, setting,
                     unknown_setting_fix)
from .secrets import is_secure, mask
from .valuetypes import unsafe_reason
from .vllm_flags import closest_flag, known_flags, releases_label

if TYPE_CHECKING:
    from .plan import Plan

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


def _parse(text: str) -> tuple[Any, Optional[yaml.Node]]:
    """The document and its node tree (the nodes know their lines)."""
    loader = _Yaml12Loader(text)
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


def read_stack_document(path: Path) -> Any:
    """A stack file's document as written (the program reads which values are `secure:` there)."""
    return _read_yaml(path)[0]


def _read_yaml(path: Path) -> tuple[Any, Optional[yaml.Node]]:
    where = path.name
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(where, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                   f"{exc.start})", "save the file as UTF-8")]) from None
    except OSError as exc:
        raise ConfigError([Problem(where, f"cannot be read: {exc.strerror}", "check the file")]) from None
    try:
        return _parse(text)
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


# ---------------------------------------------------------------------------------------------
# Which files: the stack file and the project file

STACK_FILE = re.compile(r"Pulumi\.(?P<name>.+)\.ya?ml")


@dataclass(frozen=True)
class StackFiles:
    """The files a stack is read from."""

    name: str  # the stack's name: `a2-8node` for Pulumi.a2-8node.yaml
    stack_file: Path
    project_file: Optional[Path]  # Pulumi.yaml, whose `config:` holds project defaults; None: no defaults


def _project_file(stack_dir: Path, project_dir: Optional[Path]) -> Optional[Path]:
    """Pulumi.yaml beside the stack file, else the project's (an installed ascend-pd has none)."""
    for d in (stack_dir, project_dir or PROJECT_DIR):
        if (d / "Pulumi.yaml").is_file():
            return d / "Pulumi.yaml"
    return None


def _search_dirs(project_dir: Optional[Path]) -> list[tuple[Path, str]]:
    """Where a stack name is looked up: the current directory first (an installed ascend-pd run
    beside the stack files), then the checkout this module belongs to (when it is one: an installed
    package has no Pulumi.yaml). Another project dir given on purpose (a test's copy, a git base
    that `diff` reads) is the only place looked in."""
    if project_dir is not None and Path(project_dir).resolve() != PROJECT_DIR.resolve():
        return [(Path(project_dir), str(project_dir))]
    dirs = [(Path.cwd(), f"{Path.cwd()} (the current directory)")]
    if (PROJECT_DIR / "Pulumi.yaml").is_file() and PROJECT_DIR.resolve() != Path.cwd().resolve():
        dirs.append((PROJECT_DIR, f"{PROJECT_DIR} (the project)"))
    return dirs


def _named_file(stack: Optional[str], stack_file: Path, project_dir: Optional[Path]) -> StackFiles:
    where = f"--stack-file {stack_file}"
    if not stack_file.is_file():
        raise ConfigError([Problem(where, "no such file", "give the path of the stack's Pulumi.<stack>.yaml")])
    named = STACK_FILE.fullmatch(stack_file.name)
    if named and stack and named["name"] != stack:
        raise ConfigError([Problem(f"--stack {stack}", f"differs from the stack {stack_file.name} is named for "
                                   f"({named['name']})", "give only --stack-file, or make the two agree")])
    if not named and not stack:
        raise ConfigError([Problem(where, "is not named Pulumi.<stack>.yaml, so it names no stack",
                                   "rename it Pulumi.<stack>.yaml, or give the stack's name with --stack too")])
    return StackFiles(stack or named["name"], stack_file, _project_file(stack_file.parent, project_dir))


def find_stack(stack: Optional[str] = None, project_dir: Optional[Path] = None, *,
               stack_file: Optional[Path] = None) -> StackFiles:
    """The files of a stack: `stack_file` when given (the stack is named after it), else
    `Pulumi.<stack>.yaml` in the current directory, then in the project (`_search_dirs`). Its
    `Pulumi.yaml` is the one beside it, else the project's, else none (no defaults)."""
    if stack_file is not None:
        return _named_file(stack, Path(stack_file), project_dir)
    if not stack:
        raise ConfigError([Problem("--stack", "no stack given", "give --stack NAME or --stack-file PATH")])
    if "/" in stack or stack.startswith("."):
        raise ConfigError([Problem(f"--stack {stack}", "is a path (or an org/project/stack name), not the name of "
                                   "a stack file", "give the file with --stack-file PATH, or the stack's own name "
                                   "(NAME of Pulumi.NAME.yaml)")])
    name = f"Pulumi.{stack}.yaml"
    dirs = _search_dirs(project_dir)
    for d, _ in dirs:
        if (d / name).is_file():
            return StackFiles(stack, d / name, _project_file(d, project_dir))
    known = sorted({m["name"] for d, _ in dirs for p in d.glob("Pulumi.*.yaml") if (m := STACK_FILE.fullmatch(p.name))})
    looked = " nor in ".join(label for _, label in dirs)
    fix = f"use one of {known}, or give the file's path with --stack-file" if known else \
        "give the file's path with --stack-file, or run from the directory that holds it"
    raise ConfigError([Problem(f"--stack {stack}", f"no stack file {name} in {looked}", fix)])


# ---------------------------------------------------------------------------------------------
# Reading the files into the CLI's map, with the line of every key

# The keys Pulumi reads at the top of a stack file (its ProjectStack): anything else is a mistake.
STACK_FILE_KEYS = ("config", "environment", "secretsprovider", "encryptedkey", "encryptionsalt")


def _mapping_items(node: Optional[yaml.Node]) -> Iterator[tuple[yaml.Node, yaml.Node]]:
    return iter(node.value) if isinstance(node, yaml.MappingNode) else iter(())


def _at(file: str, node: yaml.Node) -> str:
    return f"{file}:{node.start_mark.line + 1}"


def _key_lines(node: yaml.Node, path: tuple, file: str, out: dict[str, tuple[str, int]], seen: set[int]) -> None:
    """The line of every key and list item under `node`, by setting name. Each node is walked once:
    YAML aliases share nodes, and a file of nested aliases would otherwise take exponential time."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [(path + (k.value,), k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
    elif isinstance(node, yaml.SequenceNode):
        children = [(path + (i,), v, v) for i, v in enumerate(node.value)]
    else:
        return
    for here, marker, value in children:
        out.setdefault(setting(*here), (file, marker.start_mark.line + 1))
        _key_lines(value, here, file, out, seen)


def _top_level_problems(root: Optional[yaml.Node], file: str) -> list[Problem]:
    """Keys at the top of a stack file that Pulumi does not read: a misspelt `config:` would
    otherwise leave every setting unset, and report each as missing."""
    out = []
    for key, _ in _mapping_items(root):
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name in STACK_FILE_KEYS:
            continue
        near = did_you_mean(str(name).strip(), list(STACK_FILE_KEYS), cutoff=0.7) if name is not None else None
        if near == "config":
            out.append(Problem(str(name), "is not a key of a stack file: the settings go under `config:`",
                               "write `config:`", _at(file, key)))
        elif near:
            out.append(Problem(str(name), "is not a key of a stack file", f"write `{near}:`", _at(file, key)))
        else:
            out.append(Problem(str(name), "is not a key of a stack file (Pulumi reads only "
                               f"{', '.join(STACK_FILE_KEYS)})",
                               f"remove it, or write it under `config:` as `{PROJECT}:<setting>`", _at(file, key)))
    return out


def _config_section(doc: Any, root: Optional[yaml.Node], where: str) -> tuple[dict, Optional[yaml.Node]]:
    if doc is None:
        return {}, None
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
    node = next((v for k, v in _mapping_items(root) if isinstance(k, yaml.ScalarNode) and k.value == "config"), None)
    return config, node


def _strip_namespace(key: str) -> str | None:
    """`ascend-pd:nodes` -> `nodes`; bare keys belong to the project; other namespaces -> None."""
    if ":" not in key:
        return key
    ns, _, name = key.partition(":")
    return name if ns == PROJECT else None


def _edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def near_namespace(ns: str) -> bool:
    """Whether `ns` is a misspelling of `ascend-pd` (`ascend_pd`, `AscendPD`, `ascend-pd `,
    `acsend-pd`), not another provider's namespace (`aws`, `docker`), which Pulumi allows."""
    norm, target = re.sub(r"[\s._-]", "", ns.lower()), PROJECT.replace("-", "")
    return ns != PROJECT and (norm == target or _edit_distance(norm, target) <= 2)


def whole_secret_problem(name: str, where: str = "") -> Problem:
    """A structured setting encrypted as a whole: its scripts cannot be rendered, nor its secret parts known."""
    return Problem(setting(name), "is encrypted as a whole: ascend-pd renders every node's scripts from it and "
                   "cannot read it, nor tell which of its values are secret",
                   f"keep it in plain text and encrypt only the secret values, e.g. `pulumi config set --secret "
                   f"--path '{PROJECT}:vllm.env.HF_TOKEN' ...` (docs/deploying.md, \"Security\")", where)


@dataclass
class _Settings:
    """The project's settings read so far, each top-level one with the lines of its keys."""

    values: dict[str, Any]
    lines: dict[str, dict[str, tuple[str, int]]]
    problems: list[Problem]


def _read_section(path: Path, settings: _Settings, *, stack_file: bool) -> None:
    """Overlay the `ascend-pd:` settings of one file; a setting replaces the earlier file's whole."""
    file = path.name
    doc, root = _read_yaml(path)
    if stack_file:
        wrong_keys = _top_level_problems(root, file)
        if wrong_keys:
            raise ConfigError(wrong_keys)
    config, node = _config_section(doc, root, file)
    key_nodes = {k.value: (k, v) for k, v in _mapping_items(node) if isinstance(k, yaml.ScalarNode)}
    for key, value in config.items():
        key_node, value_node = key_nodes.get(key, (None, None))
        ns = key.partition(":")[0] if ":" in key else PROJECT
        name = _strip_namespace(key)
        if name is None:
            if near_namespace(ns):
                settings.problems.append(Problem(
                    key, f"the namespace {ns!r} is not {PROJECT!r}, so ascend-pd would ignore this setting",
                    f"write `{PROJECT}:{key.partition(':')[2]}`", _at(file, key_node) if key_node else file))
            continue
        if not stack_file and isinstance(value, dict):
            # A project's config declaration: its `value` or `default` is the setting; one without
            # either only declares a type or a description.
            field = "value" if "value" in value else "default" if "default" in value else None
            if field is None:
                continue
            value = value[field]
            key_node, value_node = next(((k, v) for k, v in _mapping_items(value_node)
                                         if getattr(k, "value", None) == field), (key_node, None))
        settings.values.pop(name, None)
        settings.lines.pop(name, None)
        if is_secure(value):
            # Encrypted: only `pulumi` can decrypt it. Validation never sees it, so check its name here.
            if name not in SECRET_KEYS and name not in setting_names():
                near = did_you_mean(name, setting_names() + list(SECRET_KEYS))
                settings.problems.append(Problem(setting(name), "unknown setting", unknown_setting_fix(near),
                                                 _at(file, key_node) if key_node else file))
            elif name not in SECRET_KEYS:
                settings.problems.append(whole_secret_problem(name, _at(file, key_node) if key_node else file))
            continue
        if name in SECRET_KEYS:
            # The key's text is never echoed: the problem names the setting and the file only.
            settings.problems.append(Problem(
                setting(name), f"is a secret, but {file} holds it in plain text",
                f"set it with `pulumi config set --secret {PROJECT}:{name} < KEYFILE` and remove it from {file}",
                _at(file, key_node) if key_node else file))
            continue
        # A secret inside a setting (`config set --secret --path`): its placeholder (ascend_pd/secrets.py).
        settings.values[name] = mask(value)[0]
        lines: dict[str, tuple[str, int]] = {}
        if key_node is not None:
            lines[setting(name)] = (file, key_node.start_mark.line + 1)
        if value_node is not None:
            _key_lines(value_node, (name,), file, lines, set())
        settings.lines[name] = lines


def _read_stack(files: StackFiles) -> tuple[dict[str, Any], Source, list[Problem]]:
    """The stack's settings (project defaults overlaid by the stack file), where each was written,
    and the problems of the files beyond their values (a misspelt namespace, a plain-text secret),
    located. Values that no setting may hold are refused here, with those problems."""
    settings = _Settings({}, {}, [])
    if files.project_file is not None:
        _read_section(files.project_file, settings, stack_file=False)
    _read_section(files.stack_file, settings, stack_file=True)
    source = Source(files.stack_file.name, {k: v for lines in settings.lines.values() for k, v in lines.items()})
    unsafe: list[Problem] = []
    for name, value in settings.values.items():
        _check_raw(value, (name,), unsafe)
    if unsafe:
        raise source.locate(ConfigError(settings.problems + unsafe))
    return settings.values, source, source.locate(ConfigError(settings.problems)).problems


def _serialised(values: Mapping[str, Any]) -> dict[str, str]:
    """Every value as the CLI passes it: strings as they are, everything else as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def cli_config_map(stack: Optional[str] = None, project_dir: Optional[Path] = None, *,
                   stack_file: Optional[Path] = None) -> dict[str, str]:
    """The `ascend-pd:*` map the CLI would pass for the stack (see `find_stack` for which files):
    project defaults overlaid by the stack file, every value serialised as the CLI does (strings
    as-is, everything else as JSON). Secure (encrypted) values are left out: only `pulumi` can
    decrypt them."""
    return located_config_map(stack, project_dir, stack_file=stack_file)[0]


def located_config_map(stack: Optional[str] = None, project_dir: Optional[Path] = None, *,
                       stack_file: Optional[Path] = None) -> tuple[dict[str, str], Source]:
    """`cli_config_map` and where each setting was written: problems found later in the values
    (load_config, the plan) name the file and line with it, as `render` does."""
    values, source, problems = _read_stack(find_stack(stack, project_dir, stack_file=stack_file))
    if problems:
        raise ConfigError(problems)
    return _serialised(values), source


# ---------------------------------------------------------------------------------------------
# Validation

def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain string value, exactly as `pulumi config set` stores it


# Flag maps whose keys two spellings reach (vLLM and the worker treat `_` and `-` alike).
_FLAG_MAPS = {("vllm", "flags"): "-", ("prefill", "flags"): "-", ("decode", "flags"): "-", ("yuanrong", "flags"): "_"}
_VLLM_FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")  # = valuetypes.FlagKey: other keys are refused there


def _part(data: dict, section: str, key: str) -> Any:
    block = data.get(section)
    return block.get(key) if isinstance(block, dict) else None


def _same_flag_twice(data: dict) -> list[Problem]:
    out = []
    for (section, key), sep in _FLAG_MAPS.items():
        flags = _part(data, section, key)
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


def _unknown_vllm_flags(data: dict) -> list[Problem]:
    """Tuning flags `vllm serve` would refuse at every rank's start (after the deploy), unless the
    stack allows them by name (`vllm.allowUnknownFlags`)."""
    listed = _part(data, "vllm", "allowUnknownFlags")
    allowed = {f.replace("_", "-") for f in listed if isinstance(f, str)} if isinstance(listed, list) else set()
    out = []
    for section in ("vllm", "prefill", "decode"):
        flags = _part(data, section, "flags")
        for key in flags if isinstance(flags, dict) else ():
            name = key.replace("_", "-") if isinstance(key, str) else ""
            if not _VLLM_FLAG_NAME.fullmatch(name) or name in known_flags() or name in allowed:
                continue
            near = closest_flag(name)
            guess = f"did you mean '{near}'? If" if near else "check the spelling (`vllm serve --help` lists the " \
                "flags); if"
            out.append(Problem(setting(section, "flags", key), f"is not a flag of `vllm serve` ({releases_label()})",
                               f"{guess} the flag is right (a newer vLLM, a plugin), allow it with "
                               f"`{PROJECT}:vllm.allowUnknownFlags: [{name}]`"))
    return out


def _validate(data: dict) -> StackConfig:
    problems: list[Problem] = []
    for name, value in data.items():
        _check_raw(value, (name,), problems)
    if problems:
        raise ConfigError(problems)
    problems = _same_flag_twice(data) + _unknown_vllm_flags(data)
    try:
        config = StackConfig.model_validate(data)
    except ValidationError as exc:
        problems = from_validation_error(exc).problems + problems
    if problems:
        raise ConfigError(problems)
    return config


def load_config(raw: Mapping[str, str], source: Optional[Source] = None) -> StackConfig:
    """Validate the flat CLI-style map into a StackConfig or raise ConfigError. With the `source`
    the map was read from, every problem names its file and line."""
    data = {k: _decode(v) for k, v in raw.items() if k not in SECRET_KEYS}
    try:
        return _validate(data)
    except ConfigError as exc:
        raise (source.locate(exc) if source else exc) from None


@dataclass(frozen=True)
class Stack:
    """A stack read from its files: its name, its validated settings and where each was written."""

    name: str
    files: StackFiles
    config: StackConfig
    source: Source

    def build_plan(self) -> Plan:
        """The plan, or a ConfigError whose problems name the file and line of the settings at fault
        (the plan's own checks, across settings, know nothing of files)."""
        from .plan import build_plan

        try:
            plan = build_plan(self.config, self.name)
        except ConfigError as exc:
            raise self.source.locate(exc) from None
        return dataclasses.replace(plan, warnings=tuple(self.source.locate(ConfigError(list(plan.warnings))).problems))


def open_stack(stack: Optional[str] = None, project_dir: Optional[Path] = None, *,
               stack_file: Optional[Path] = None) -> Stack:
    """Find (`find_stack`), read and validate a stack; every problem names its file and line."""
    files = find_stack(stack, project_dir, stack_file=stack_file)
    values, source, problems = _read_stack(files)
    try:
        config = load_config(_serialised(values), source)
    except ConfigError as exc:
        raise ConfigError(problems + exc.problems) from None
    if problems:
        raise ConfigError(problems)
    return Stack(files.name, files, config, source)


def load_stack(stack: Optional[str] = None, project_dir: Optional[Path] = None, *,
               stack_file: Optional[Path] = None) -> StackConfig:
    return open_stack(stack, project_dir, stack_file=stack_file).config


__all__ = ["PROJECT_DIR", "Stack", "StackFiles", "cli_config_map", "find_stack", "load_config", "load_stack",
           "located_config_map", "open_stack", "setting"]
