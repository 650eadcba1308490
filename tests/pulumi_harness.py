"""The test-side names of `ascend_pd.engine.capture`: run the Pulumi program under the SDK's mocks
and record every registration (see that module)."""

from __future__ import annotations

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


def run_program(config: dict[str, str], *, stack: str, secret_keys: Iterable[str] = (),
                expect_error: bool = False) -> Graph:
    return capture(config, stack=stack, secret_keys=secret_keys, expect_error=expect_error)
