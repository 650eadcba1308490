"""The upgrade of a2-8node to vllm-ascend 0.23.0.post1, exactly as docs/changes.md ("Upgrading
vllm-ascend") gives it: the yaml block after `<!-- upgrade-0.23 -->`, read here, so the suites that
deploy a stack on 0.23.0.post1 (the release checks, the real-shell proxy and rollout tests, the real
engine's a2-8node lifecycle) run the documented edit, and the doc cannot drift from what was run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from ascend_pd.loader import cli_config_map

RELEASE = "0.23.0.post1"
CHANGES_MD = Path(__file__).resolve().parents[1] / "docs" / "changes.md"


def edit() -> dict:
    """The settings the doc's block changes (namespace stripped); a null deletes that key."""
    block = re.search(r"<!-- upgrade-0\.23 -->\n```yaml\n(.*?)```", CHANGES_MD.read_text(), re.S)
    assert block, "docs/changes.md has no <!-- upgrade-0.23 --> yaml block"
    return {k.split(":", 1)[1]: v for k, v in yaml.safe_load(block.group(1))["config"].items()}


def merged(base: dict, change: dict) -> dict:
    """`change` laid over `base` key by key, mappings into mappings; a null deletes the key."""
    out = dict(base)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def upgraded(settings: dict) -> dict:
    """A stack's decoded settings, upgraded."""
    return merged(settings, edit())


def settings(stack: str) -> dict:
    """A committed stack's settings, decoded (namespace stripped)."""
    out = {}
    for k, v in cli_config_map(stack).items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def overrides(stack: str) -> dict:
    """The upgrade as the test harnesses' one-level overrides of a committed stack: each changed
    top-level setting with only its changed keys, each of those whole (a changed env is the merged env)."""
    settings_ = settings(stack)
    out = {}
    for key, value in edit().items():
        if isinstance(value, dict) and isinstance(settings_.get(key), dict):
            out[key] = {k: (merged(settings_[key].get(k) or {}, v) if isinstance(v, dict) else v)
                        for k, v in value.items()}
        else:
            out[key] = value
    return out
