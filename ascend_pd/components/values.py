"""Small pure helpers of the resource layer (no pulumi import): the shapes pulumi-docker and the
stack outputs want, built from values the plan and the config already hold.

Nothing here derives deployment facts (ranks, ports, addresses, scripts): those are the plan's.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping

from ascend_pd.config import Mount
from ascend_pd.plan import Plan

# Extra options for the local `ssh` that pulumi-docker runs for `ssh://` hosts. The port and user
# are part of the URL; identities come from ssh-agent / ~/.ssh/config, never from here (the
# provider's inputs are stored in the state in plain text).
# BatchMode: fail instead of prompting for a password or passphrase in a non-interactive run.
# ConnectTimeout: same order as pulumi-command's per-dial timeout (15 s).
# ServerAliveInterval: notice a dead node during a long image pull instead of hanging.
DOCKER_SSH_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=30")

def docker_host(user: str, address: str, port: int) -> str:
    """The pulumi-docker provider's `host` for a node reached over SSH."""
    return f"ssh://{user}@{address}:{port}"


def container_envs(env: Mapping[str, str]) -> list[str]:
    """`KEY=VALUE` strings, sorted: the provider keeps envs as a set, so order must not matter."""
    return [f"{k}={v}" for k, v in sorted(env.items())]


def volume_specs(default_mounts: tuple[tuple[str, str, bool], ...], extra: list[Mount]) -> list[dict[str, Any]]:
    """The seeds' mounts plus the stack's extra mounts, as {host, container, read_only}."""
    out = [{"host": h, "container": c, "read_only": ro} for h, c, ro in default_mounts]
    out += [{"host": m.host, "container": m.container, "read_only": m.read_only} for m in extra]
    return out


def rank_rows(plan: Plan) -> list[dict[str, Any]]:
    """The `ranks` stack output: one row per DP rank, in plan order."""
    return [
        {
            "role": r.role,
            "instance": r.instance_name,
            "node": r.node,
            "address": r.address,
            "dpRank": r.dp_rank,
            "port": r.port,
            "devices": list(r.devices),
        }
        for r in plan.ranks
    ]


# A chat completion small enough to be quick, long enough to show the model answers.
SMOKE_MAX_TOKENS = 32


def smoke_test(url: str, served_model: str, timeout_s: int) -> str:
    """A ready-to-paste curl of one chat completion through the proxy."""
    body = {
        "model": served_model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": SMOKE_MAX_TOKENS,
        "temperature": 0,
    }
    return (
        f"curl -sS --max-time {timeout_s} {shlex.quote(url + '/v1/chat/completions')} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    )
