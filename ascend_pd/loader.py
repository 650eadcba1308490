"""Read a stack's configuration the way the Pulumi CLI hands it to the program.

The CLI gives the program a flat map of namespaced keys (`ascend-pd:nodes`) whose structured values
arrive as JSON text. `render` and `status` have no CLI, so they read `Pulumi.<stack>.yaml` (and the
project's config defaults in `Pulumi.yaml`) into that same flat map; `__main__` builds it from
`pulumi.Config`. Both then go through `load_config`, so validation is identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from .config import PROJECT, SECRET_KEYS, StackConfig
from .errors import ConfigError, Problem, from_validation_error, setting

PROJECT_DIR = Path(__file__).resolve().parent.parent


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
    project = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
    for key, decl in (project.get("config") or {}).items():
        name = _strip_namespace(key)
        if name is None:
            continue
        if isinstance(decl, dict) and ("default" in decl or "value" in decl):
            merged[name] = decl.get("value", decl.get("default"))
        elif not isinstance(decl, dict):
            merged[name] = decl
    for key, value in ((yaml.safe_load(stack_file.read_text()) or {}).get("config") or {}).items():
        name = _strip_namespace(key)
        if name is None:
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            merged.pop(name, None)
            continue
        merged[name] = value
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in merged.items()}


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain string value, exactly as `pulumi config set` stores it


def load_config(raw: Mapping[str, str]) -> StackConfig:
    """Validate the flat CLI-style map into a StackConfig or raise ConfigError."""
    data = {k: _decode(v) for k, v in raw.items() if k not in SECRET_KEYS}
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def load_stack(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return load_config(cli_config_map(stack, project_dir))


__all__ = ["cli_config_map", "load_config", "load_stack", "setting"]
