"""The Pulumi program: stack config -> plan -> resources -> stack outputs.

It lives in the package (not only in the checkout's `__main__.py`) so that an installed `ascend-pd`
runs the very same program under the SDK's mocks for `diff`; the checkout's `__main__.py`, which the
Pulumi CLI's language host executes, only calls `main()`.
"""

import pulumi
import pulumi.runtime.config

from .components.cluster import deploy
from .config import PROJECT, SECRET_KEYS
from .errors import ConfigError
from .loader import load_config
from .plan import build_plan


def stack_settings() -> dict[str, str]:
    """Every `ascend-pd:*` key exactly as the CLI passes it (strings; objects as JSON), namespace
    stripped, secrets left out. The CLI puts the map in PULUMI_CONFIG and also hands it to
    set_all_config; tests only do the latter: read both."""
    every = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{PROJECT}:"
    out = {}
    for key, value in every.items():
        if not key.startswith(prefix) or key[len(prefix):] in SECRET_KEYS:
            continue
        if pulumi.runtime.is_config_secret(key):
            # The plan writes config values literally into commands, which are not secret.
            pulumi.log.warn(f"{key} is set as a secret, but ascend-pd uses it in plain-text commands")
        out[key[len(prefix):]] = value
    return out


def main() -> None:
    try:
        plan = build_plan(load_config(stack_settings()), pulumi.get_stack())
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    for problem in plan.warnings:  # settings the images' release does not read (vllmAscend.strict refuses them)
        pulumi.log.warn(f"{problem}")
    for name, value in deploy(plan, private_key=pulumi.Config().get_secret("sshPrivateKey")).items():
        pulumi.export(name, value)
