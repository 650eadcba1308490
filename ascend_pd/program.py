"""The Pulumi program: stack config -> plan -> resources -> stack outputs.

It lives in the package (not only in the checkout's `__main__.py`) so that an installed `ascend-pd`
runs the very same program under the SDK's mocks for `diff`; the checkout's `__main__.py`, which the
Pulumi CLI's language host executes, only calls `main()`.

Secret values (ascend_pd/secrets.py): the CLI hands the program a setting that holds a secret
decrypted, and says only that the setting holds one (`is_config_secret`). Which of its values are
secret the stack file says (their `secure:` leaves): those become placeholders before the plan is
built, exactly as `render` and `diff` see them, and their values go to the nodes as Pulumi secrets on
the stdin of the Commands that write them beside the scripts.
"""

import gc
import json
import os
import signal
import sys
from typing import Any

import pulumi
import pulumi.runtime.config

from .components.cluster import deploy
from .config import PROJECT, SECRET_KEYS
from .errors import ConfigError, Problem, setting
from .loader import find_stack, load_config, read_stack_document, whole_secret_problem
from .plan import build_plan
from .secrets import is_secure, mask, reveal


def _file_settings(stack: str) -> dict[str, Any]:
    """The `ascend-pd:` settings of the stack file as written (secure leaves and all)."""
    doc = read_stack_document(find_stack(stack).stack_file)
    config = (doc or {}).get("config") or {}
    return {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith(f"{PROJECT}:")}


def stack_settings() -> tuple[dict[str, str], dict[str, Any]]:
    """Every `ascend-pd:*` key exactly as the CLI passes it (strings; objects as JSON), namespace
    stripped, the top-level secrets left out and the secret values inside settings replaced by their
    placeholders; and those values, by setting path (`vllm.env.HF_TOKEN`). The CLI puts the map in
    PULUMI_CONFIG and also hands it to set_all_config; tests only do the latter: read both."""
    every = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{PROJECT}:"
    out, secret_values, problems, written = {}, {}, [], None
    for key, value in every.items():
        name = key[len(prefix):]
        if not key.startswith(prefix) or name in SECRET_KEYS:
            continue
        if pulumi.runtime.is_config_secret(key):
            written = _file_settings(pulumi.get_stack()) if written is None else written
            in_file = written.get(name)
            masked, leaves = mask(in_file)
            if is_secure(in_file) or not leaves:
                problems.append(whole_secret_problem(name))
                continue
            plain = json.loads(value)
            secret_values.update({".".join(map(str, (name, *p))): v for p, v in reveal(masked, plain).items()})
            for path, ciphertext in leaves:  # the CLI's own (decrypted) value, with the file's placeholders
                target = plain
                for step in path[:-1]:
                    target = target[step]
                target[path[-1]] = mask({"secure": ciphertext})[0]
            value = json.dumps(plain)
        out[name] = value
    if problems:
        raise ConfigError(problems)
    return out, secret_values


# What the model runs (`diff`, the tests) use for a secret the stack does not hold: its graph is the one a
# deploy with the secret set would have (the real program refuses to deploy without it).
MODEL_SECRET = "<not set: a model run>"


def exit_quietly_when_cancelled() -> None:
    """The Python language host interrupts the program (SIGINT) when the engine cancels a run: a
    resource failed, or the operator pressed Ctrl-C. The engine reports why; a KeyboardInterrupt
    traceback of wherever the program happened to wait would end every failed `pulumi up`'s output
    and bury that report. (Not under `diff`'s mocks: nothing cancels those.)"""

    def stop(signum: int, frame: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    signal.signal(signal.SIGINT, stop)


def without_full_collections() -> tuple[int, int, int]:
    """Keep the garbage collector's full collections out of the program's run; returns the thresholds
    to put back. Each full collection traverses every live object of the run (millions of Outputs,
    futures and tasks at 256 nodes): under the mocks, 15 of them took 40% of a 256-node run and found
    0.1% of its garbage. The young generations' collections still reclaim the run's cycles (the same
    peak RSS, measured)."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], max(before[2], 1000))
    return before


def main(*, model: bool = False) -> None:
    """The program; `model`: run under the SDK's mocks by `diff` (engine/capture.py), where a missing
    secret is a stand-in instead of an error."""
    config = pulumi.Config()
    proxy_key = config.get_secret("proxyApiKey")
    try:
        settings, secret_values = stack_settings()
        plan = build_plan(load_config(settings), pulumi.get_stack())
        if plan.cfg.proxy.auth and proxy_key is None and model:
            proxy_key = pulumi.Output.secret(MODEL_SECRET)
        elif plan.cfg.proxy.auth and proxy_key is None:
            raise ConfigError([Problem(setting("proxyApiKey"), "is not set, and proxy.auth requires a key for every "
                                       "client request", "pulumi config set --secret ascend-pd:proxyApiKey "
                                       "\"$(openssl rand -hex 32)\" (clients send it as `Authorization: Bearer`), or "
                                       "set ascend-pd:proxy.auth: false")])
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    for problem in plan.warnings:  # settings the images' release does not read (vllmAscend.strict refuses them)
        pulumi.log.warn(f"{problem}")
    outputs = deploy(plan, private_key=config.get_secret("sshPrivateKey"), proxy_key=proxy_key,
                     secret_values=secret_values)
    for name, value in outputs.items():
        pulumi.export(name, value)
