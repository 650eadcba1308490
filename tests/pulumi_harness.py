"""The test-side names of `ascend_pd.engine.capture`: run the Pulumi program under the SDK's mocks
and record every registration (see that module)."""

from __future__ import annotations

import json
from typing import Iterable, Optional

from ascend_pd.engine.capture import (COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, MAIN, PROJECT,  # noqa: F401
                                      PROJECT_DIR, Graph, Reg, capture, plain, stack_output, unwrap)
from ascend_pd.loader import cli_config_map

Run = Graph


def stack_config(stack: str, overrides: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The flat map the CLI hands the program for `stack`: `ascend-pd:<key>` -> string/JSON."""
    raw = {f"{PROJECT}:{k}": v for k, v in cli_config_map(stack).items()}
    raw.update(overrides or {})
    return raw


TEST_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAscendPdTestOnlyHostKeyOfANodeTheTestAdds"


def with_host_keys(config: dict[str, str]) -> dict[str, str]:
    """`config` with ssh.hostKeys following its nodes, as an operator edits them beside a node change: a
    renamed node's key moves to its new name (its former name's key), a node the test adds gets a key."""
    nodes = json.loads(config[f"{PROJECT}:nodes"])
    ssh = json.loads(config.get(f"{PROJECT}:ssh", "{}"))
    keys = ssh.get("hostKeys", {})
    ssh["hostKeys"] = {n["name"]: next((keys[k] for k in [n["name"], *n.get("formerNames", [])] if k in keys),
                                      TEST_HOST_KEY) for n in nodes}
    return {**config, f"{PROJECT}:ssh": json.dumps(ssh)}


def run_program(config: dict[str, str], *, stack: str, secret_keys: Iterable[str] = (),
                expect_error: bool = False, model: bool = True) -> Graph:
    return capture(config, stack=stack, secret_keys=secret_keys, expect_error=expect_error, model=model)
