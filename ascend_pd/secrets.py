"""Values a stack keeps secret (`pulumi config set --secret`), kept out of every script, argv and log.

A secret value inside a setting (`pulumi config set --secret --path 'ascend-pd:vllm.env.HF_TOKEN' ...`)
is a `{secure: <ciphertext>}` leaf in the stack file. Wherever the settings are read (render, diff, the
program under Pulumi), such a leaf becomes a *placeholder*: `secret:sha256:<digest of the ciphertext>`,
so the plan and every script see that a value is secret and which one changed (a new ciphertext is a
new placeholder), never the value. Only the program holds the decrypted values, and hands them to the
node as a Pulumi secret on a Command's stdin, written to a file of mode 0600 in the container
(`<stateDir>/run/secrets/`) that the process reads.

Where a secret may be: a rank's environment (`vllm.env`, `prefill.env`, `decode.env`), and the top-level
secrets `sshPrivateKey` and `proxyApiKey`. Anywhere else it would reach argv (`ps`), a container's
configuration (`docker inspect`) or a script: refused, with where to put it instead.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

PLACEHOLDER_PREFIX = "secret:sha256:"
ENV_SECTIONS = ("vllm", "prefill", "decode")  # <section>.env.<NAME> may be secret
RUN_SUBDIR = "secrets"  # <run dir>/secrets: what the program delivers beside the scripts
PROXY_KEY_FILE = "proxy-api-key"
# What `status`, `heal` and the exporter send to a proxy that requires its key (proxy.auth).
PROXY_KEY_ENV = "ASCEND_PD_PROXY_API_KEY"


def placeholder(ciphertext: str) -> str:
    return PLACEHOLDER_PREFIX + hashlib.sha256(ciphertext.encode()).hexdigest()[:16]


def is_placeholder(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX)


def is_secure(value: object) -> bool:
    """A `{secure: <ciphertext>}` leaf of a stack file."""
    return isinstance(value, dict) and set(value) == {"secure"} and isinstance(value["secure"], str)


def mask(value: Any) -> tuple[Any, list[tuple[tuple, str]]]:
    """`value` with every secure leaf replaced by its placeholder, and (path, ciphertext) of each."""
    found: list[tuple[tuple, str]] = []

    def walk(v: Any, path: tuple) -> Any:
        if is_secure(v):
            found.append((path, v["secure"]))
            return placeholder(v["secure"])
        if isinstance(v, dict):
            return {k: walk(x, path + (k,)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, path + (i,)) for i, x in enumerate(v)]
        return v

    return walk(value, ()), found


def placeholders(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every placeholder in a decoded setting."""
    if is_placeholder(value):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from placeholders(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from placeholders(v, path + (i,))


def env_allowed(path: tuple) -> bool:
    """Whether a secret may be at `path` (top-level setting first): a rank's environment variable."""
    return len(path) == 3 and path[0] in ENV_SECTIONS and path[1] == "env"


def reveal(masked: Any, plain: Any) -> dict[tuple, Any]:
    """Path -> decrypted value of every placeholder of `masked`, taken at the same path of `plain`
    (the setting as the Pulumi CLI hands it to the program, decrypted)."""
    out = {}
    for path in placeholders(masked):
        v = plain
        for step in path:
            v = v[step]
        out[path] = v
    return out
