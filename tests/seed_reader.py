"""The seed guides' facts as data: tests/seed_facts/<stack>.json, extracted once from the guides.

The fidelity tests compare the plan against what the guides literally say, so a change to a stack
file or to the plan that drops a seed flag or env var fails a test instead of a cluster. The facts
live in the repository (each group names its guide and section) so a plain clone runs the tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FACTS = Path(__file__).resolve().parent / "seed_facts"


@dataclass
class Template:
    env: dict[str, str]  # export NAME=VALUE lines before `vllm serve`
    model: str  # `vllm serve MODEL`
    flags: dict[str, str | dict | None]  # as written: positionals ($2..$7) kept, JSON as objects, None = bare


@dataclass
class Launch:
    dp_size: int
    tp_size: int
    dp_size_local: int
    dp_rank_start: int
    dp_address: str  # a node placeholder: P0_IP, D1_IP
    dp_rpc_port: int
    vllm_start_port: int


@cache
def facts(stack: str) -> dict:
    """The stack's seed facts (`a2-8node` -> seed_facts/a2_8node.json)."""
    return json.loads((FACTS / f"{stack.replace('-', '_')}.json").read_text())


def templates(stack: str) -> dict[str, Template]:
    """{"prefill": Template, "decode": Template} from the guide's run_dp_template.sh blocks."""
    return {role: Template(env=t["env"], model=t["model"], flags=t["flags"])
            for role, t in facts(stack)["templates"].items()}


def launches(stack: str) -> dict[str, list[Launch]]:
    """The per-node `python launch_online_dp.py ...` arguments, by role, in node order."""
    fields = Launch.__dataclass_fields__
    return {role: [Launch(**{k: v for k, v in node.items() if k in fields}) for node in group["nodes"]]
            for role, group in facts(stack)["launches"].items()}


def launch_online_dp(launch: Launch) -> list[dict]:
    """What vllm-ascend's examples/external_online_dp/launch_online_dp.py computes per local rank."""
    return [
        {
            "devices": tuple(range(i * launch.tp_size, (i + 1) * launch.tp_size)),
            "port": launch.vllm_start_port + i,
            "dp_size": launch.dp_size,
            "dp_rank": launch.dp_rank_start + i,
            "dp_address": launch.dp_address,
            "rpc_port": launch.dp_rpc_port,
            "tp": launch.tp_size,
        }
        for i in range(launch.dp_size_local)
    ]


def proxy_lists(stack: str) -> dict:
    """proxy.sh's arguments: port, host and the host/port lists (hosts as node placeholders)."""
    return facts(stack)["proxy"]


def worker_flags(stack: str) -> dict[str, str | None]:
    """run_yr_worker.sh's `dscli start ... -w` flags; dscli's own options (before -w) as `pre:-t`."""
    worker = facts(stack)["worker"]
    return {**worker["flags"], **{f"pre:{k}": v for k, v in worker["dscli"].items()}}


@dataclass
class Correction:
    """A guide's setting the committed stack changes for its release (seed_facts/release_corrections.json)."""

    setting: str  # as the stack file writes it, without the namespace: `decode.connectorModulePath`
    guide: object
    stack: object  # None: gone; {"moved": SECTION}: inside additional-config.SECTION
    release: str
    check: str  # "error" or "warning": what the release checks say of the guide's value
    says: str


def corrections(stack: str) -> list[Correction]:
    data = json.loads((FACTS / "release_corrections.json").read_text())
    return [Correction(**c) for c in data[stack]]


def corrected(stack: str, role: str, template: Template) -> Template:
    """The guide's template of `role` with the stack's release corrections applied: what the ranks run."""
    env, flags = dict(template.env), json.loads(json.dumps(template.flags))
    for c in corrections(stack):
        owner, kind, *path = c.setting.split(".")
        if owner not in ("vllm", role):
            continue
        if kind == "connectorModulePath":
            flags["--kv-transfer-config"]["kv_connector_extra_config"]["connectors"][0].pop("kv_connector_module_path")
        elif kind == "env":
            env.pop(path[0])
        elif kind == "flags":
            value, key = flags[f"--{path[0]}"], path[-1]
            if isinstance(c.stack, dict):
                value.setdefault(c.stack["moved"], {})[key] = value.pop(key)
            else:
                value[key] = c.stack
    return Template(env=env, model=template.model, flags=flags)
