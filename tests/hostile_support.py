"""Support for the hostile-values test: every string setting of StackConfig, a sandbox that runs the
rendered scripts with stub commands, and the injected command that must never run.

The sandbox is a directory with stub executables first on PATH:
  docker    `exec -i NAME CMD...` runs CMD here; `inspect` says running; `start` succeeds
  curl      answers by URL path like the real services (etcd /health, the gateway's kv range and
            put, a rank's /health, the proxy's /healthcheck with the plan's counts and its
            /instances/add listing what it was given, /instances/remove with empty lists)
  vllm, etcd, pip, git, dscli, datasystem_worker, python3   succeed quickly, like the real ones
  hostile   the injected command: appends its arguments to <sandbox>/INJECTED
Scripts run as an unprivileged user when the test runs as root (setpriv), so even a missed
injection cannot touch the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Iterator, Union

from pydantic import BaseModel

from ascend_pd.config import StackConfig

# What every string setting is tried with: command substitution, backticks, both quote kinds, a
# newline, the transport's heredoc delimiter as a line, a leading dash, an empty string; each also
# as a path inside the sandbox (hostile_values(root)) so that path settings get past their
# absolute-path check.
INJECTIONS = (
    "$(hostile dollar)",
    "`hostile backtick`",
    "x'; hostile single; echo '",
    'x"; hostile double; echo "',
    "x\nhostile newline\n",
    "x\nASCEND_PD_SCRIPT\nhostile delimiter",
    "-hostile-dash",
    "",
    "${IFS}hostile${IFS}ifs",
    "x;hostile semicolon;",
)


def hostile_values(root: Path) -> tuple[str, ...]:
    """INJECTIONS as they are, and as paths under <root>/paths (which a value may own and delete)."""
    return tuple(v for h in INJECTIONS for v in (h, f"{root}/paths/{h}"))


def _is_str(tp: Any) -> bool:
    """Whether a field annotation admits text."""
    if tp is str:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _is_str(typing.get_args(tp)[0])
    if origin is Union:
        return any(_is_str(a) for a in typing.get_args(tp))
    return False


def _models(tp: Any) -> list[type[BaseModel]]:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    if origin in (typing.Annotated, Union):
        return [m for a in typing.get_args(tp) for m in _models(a)]
    return []


def string_paths(model: type[BaseModel], data: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place of `data` (a stack's decoded settings) that holds text, by walking the model's
    field types: a new setting is covered as soon as it exists. Dict keys are yielded as
    (..., ("key", k)); list items by index."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        if not isinstance(data, dict) or key not in data:
            continue
        yield from _walk(field.annotation, data[key], path + (key,))


def _walk(tp: Any, value: Any, path: tuple) -> Iterator[tuple]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        yield from _walk(typing.get_args(tp)[0], value, path)
        return
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        models = [m for a in args for m in _models(a)]
        if models and isinstance(value, dict):
            model = next((m for m in models if set(value) <= {f.alias or n for n, f in m.model_fields.items()}),
                         models[0])
            yield from string_paths(model, value, path)
        elif any(_is_str(a) for a in args) and isinstance(value, str):
            yield path
        elif isinstance(value, (dict, list)):
            for a in args:
                if typing.get_origin(a) in (dict, list):
                    yield from _walk(a, value, path)
                    break
        return
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            yield from _walk(item, v, path + (i,))
        return
    if origin is dict and isinstance(value, dict):
        kt, vt = typing.get_args(tp)
        for k, v in value.items():
            if _is_str(kt):
                yield path + (("key", k),)
            yield from _walk(vt, v, path + (k,))
        return
    if _models(tp) and isinstance(value, dict):
        yield from string_paths(_models(tp)[0], value, path)
        return
    if _is_str(tp) and isinstance(value, str):
        yield path


def with_value(data: dict, path: tuple, value: str) -> dict:
    """A deep copy of `data` with the text at `path` (or the dict key) replaced by `value`."""
    import copy

    out = copy.deepcopy(data)
    parent = out
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if isinstance(last, tuple):  # a dict key: keep the value under the new key
        parent[value] = parent.pop(last[1])
    else:
        parent[last] = value
    return out


def setting_prefix(path: tuple) -> str:
    """`ascend-pd:<setting>` as the error names it, up to the last plain key (dict keys and list
    indices are shown with the value itself, which may be the hostile text)."""
    out = ""
    for part in path:
        if isinstance(part, tuple):
            break
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return f"ascend-pd:{out}"


# A stub that must keep its own command line (no exec) and still stop at SIGTERM at once: sh runs a
# trap only after its foreground child exits, so the sleep runs in the background and sh waits.
_SLEEP_TERMINABLE = "trap 'kill $! 2>/dev/null; exit 0' TERM INT\nsleep %d &\nwait\n"

STUBS = {
    "docker": """#!/bin/sh
case "$1" in
  exec) shift; while [ "$1" = -i ] || [ "$1" = -t ]; do shift; done; shift; exec "$@" ;;
  inspect) echo true ;;
  start) echo "$2" ;;
esac
""",
    "curl": """#!/bin/sh
url="" data="" prev=""
for a in "$@"; do
  case "$a" in http://*|https://*) url=$a ;; esac
  [ "$prev" = -d ] && data=$a
  prev=$a
done
case "$url" in
  */v3/kv/range) echo '{"header":{},"kvs":[],"count":"1"}' ;;
  */v3/kv/put) echo '{"header":{}}' ;;
  # An add is answered with what the real proxy then lists: the instances it was given.
  */instances/add) listed=$(printf '%s' "$data" | sed -n 's/.*"instances": *\\(\\[[^]]*\\]\\).*/\\1/p')
    case "$data" in *'"type": "prefill"'*) p=${listed:-[]} d=[] ;; *) p=[] d=${listed:-[]} ;; esac
    printf '{"message": "", "current_prefill_instances": %s, "current_decode_instances": %s}\n' "$p" "$d" ;;
  */instances/*) echo '{"message": "", "current_prefill_instances": [], "current_decode_instances": []}' ;;
  */healthcheck) printf '{"status":"ok","prefill_instances":%s,"decode_instances":%s}\\n' "$STUB_PREFILL" "$STUB_DECODE" ;;
  # etcd answers only while a stub etcd runs, as the real one does (the script refuses a foreign
  # etcd on its port); every other /health (a rank's) answers at once.
  *:2379/health) { [ -n "$STUB_ETCD_CONTAINER" ] || pgrep -f "^/bin/sh $(dirname "$0")/etcd " > /dev/null; } &&
    echo '{"health":"true"}' ;;
  */health) echo '{"health":"true"}' ;;
esac
exit 0
""",
    # Long enough to outlive a slow create on a loaded machine (the deletes stop them).
    "vllm": "#!/bin/sh\nexec sleep 120\n",
    # No exec: curl's /health finds it by its command line. `--version` answers, as install-etcd asks.
    "etcd": "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'etcd Version: 3.5.12'; exit 0; }\n" + _SLEEP_TERMINABLE % 120,
    "pip": "#!/bin/sh\nexit 0\n",
    "git": """#!/bin/sh
for a in "$@"; do case "$a" in rev-parse) echo 0123456789abcdef0123456789abcdef01234567; exit 0 ;; esac; done
exit 0
""",
    "dscli": """#!/bin/sh
[ "$1" = start ] || exit 0
live=""; addr=""; prev=""
for a in "$@"; do
  case "$prev" in --liveness_check_path) live=$a ;; --worker_address) addr=$a ;; esac
  prev=$a
done
[ -n "$live" ] && echo 'liveness check success' > "$live"
setsid datasystem_worker "--worker_address=$addr" > /dev/null 2>&1 < /dev/null &
# Like the real dscli, return once the worker runs (the background fork is not it until it execs).
for _ in 1 2 3 4 5 6 7 8 9 10; do
  pgrep -f -- "datasystem_worker --worker_address=$addr" > /dev/null && exit 0
  sleep 0.1
done
exit 0
""",
    "datasystem_worker": "#!/bin/sh\n" + _SLEEP_TERMINABLE % 20,  # no exec: worker_pids finds it by its command line
    "python3": """#!/bin/sh
case "$1 $3" in
  "-c healthcheck") cat > /dev/null; exit 0 ;;
  "-c smoke") echo "smoke completion ok"; exit 0 ;;
  "-c "*) exit 0 ;;
esac
exec sleep 3
""",
    "hostile": """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../INJECTED"
""",
}


class Sandbox:
    """A directory where rendered scripts run with the stubs above, as an unprivileged user."""

    def __init__(self, root: Path, *, etcd_in_container: bool = False):
        self.root = root
        self.etcd_in_container = etcd_in_container  # image mode: docker's etcd answers, no stub runs
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        for name, text in STUBS.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.injected = root / "INJECTED"
        self.as_root = os.geteuid() == 0
        root.chmod(0o777)
        for sub in ("paths", "home", "work"):
            (root / sub).mkdir(exist_ok=True)
            (root / sub).chmod(0o777)

    def run(self, command: str, *, counts: tuple[int, int], timeout: float = 120) -> subprocess.CompletedProcess:
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.root / "home"), "LC_ALL": "C",
               "STUB_PREFILL": str(counts[0]), "STUB_DECODE": str(counts[1]),
               "STUB_ETCD_CONTAINER": "1" if self.etcd_in_container else ""}
        argv = ["sh", "-c", command]
        if self.as_root:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        return subprocess.run(argv, env=env, cwd=str(self.root / "work"), capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)

    def executions(self) -> str:
        return self.injected.read_text() if self.injected.exists() else ""


def bash_n(text: str, shell_name: str = "bash") -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which(shell_name) or shell_name, "-n"], input=text, capture_output=True,
                          text=True, timeout=30)


__all__ = ["hostile_values", "INJECTIONS", "string_paths", "with_value", "setting_prefix", "Sandbox", "bash_n", "StackConfig", "sys"]
