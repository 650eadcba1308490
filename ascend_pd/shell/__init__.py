"""The shell vocabulary: the one place where values become shell text.

Every script ascend-pd renders is built from these pieces:

* `q(value)`: the only way a value enters a script (a single shell word, whatever it holds);
* `params(...)`: the quoted `name=value` assignments at the top of a script, which the static
  library functions and the script's messages read as `"$name"` (a value expanded inside double
  quotes is never parsed again, so a message cannot run what it prints);
* `library(...)`: the static bash in `*.sh` files beside this module (linted by shellcheck as is);
* `background(...)`, `managed_start(...)`: the `setsid nohup env ... CMD` lines that start services,
  each value quoted in place so a preview or golden diff shows the changed flag on its own line;
* `heredoc(...)`: every embedded document, refusing a text that holds its delimiter as a line;
* `in_container(...)`, `on_host(...)`: the transport wrappers Pulumi runs on a node (a container
  script holds its `Lock` while it runs: two runs of one script on one node never overlap).

Script modules (`ascend_pd.scripts.*`) and the probes import this module and never each other.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

HERE = Path(__file__).resolve().parent

# Every heredoc delimiter ascend-pd writes starts with this prefix; the config model refuses any
# value containing it, so no value can end a document early.
RESERVED_PREFIX = "ASCEND_PD_"
SCRIPT_DELIMITER = RESERVED_PREFIX + "SCRIPT"  # the transport wrappers
PROBE_DELIMITER = RESERVED_PREFIX + "PROBE"  # probe files written by the probe installer
PYTHON_DELIMITER = RESERVED_PREFIX + "PY"  # embedded Python helpers

LOG_TAIL = 50  # lines of a log shown when something fails
# Every probe of a service this program started talks to a node address directly. Container env
# often carries http_proxy (ascend-pd:container.env, for pip): curl and urllib would send the probe
# to that proxy, never see the service healthy, and stop it at the deadline.
CURL = "curl --noproxy '*'"


@dataclass(frozen=True)
class Script:
    """One managed thing on one node: the text that creates it and the text that deletes it.

    `identity` holds the values that decide WHICH processes and files the delete acts on (state
    dir, addresses, ports, data dirs). Pulumi runs an update with the new create only, never the old
    delete, so the components put `identity` into `triggers`: a change is then a replacement whose
    old delete (with the old values) runs first.
    """

    name: str  # stable identity on its node: "worker", "launch", "pip-transformers"
    node: str
    where: str  # "host" or "container"
    create: str
    delete: str
    identity: tuple[str, ...] = field(default=())
    # Host commands the delete runs (over SSH, outside the container) before the container part:
    # what only the node's docker can do (stopping another container that holds a port).
    delete_on_host_first: str = ""
    # Preparation steps run one after another (two pip installs in one environment at once corrupt
    # it); a step that touches nothing the others do (the etcd binary) runs beside them.
    chained: bool = True
    # The long-running processes the create keeps, each with the fingerprint it is started with
    # (pid file name without `.pid` -> fingerprint). A re-run of the create (an update) restarts
    # exactly those whose fingerprint changed; `python -m ascend_pd diff` reads this to say which.
    processes: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.where not in ("host", "container"):
            raise ValueError(f"{self.name}: where must be host or container, not {self.where!r}")


class UnsafeText(ValueError):
    """A text cannot be embedded safely (it holds its heredoc delimiter, or a control character
    where a single line is needed)."""


def q(value: object) -> str:
    """One shell word holding exactly `value` (single-quoted unless plainly safe)."""
    return shlex.quote(str(value))


def one_line(text: object) -> str:
    """`text` for a comment or a message line: control characters (newline included) shown as
    `\\xNN` escapes, so a value can never start a new line of the script."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def comment(text: object) -> str:
    return "# " + one_line(text) + "\n"


def say(text: object, *, err: bool = False) -> str:
    """`echo` of a fixed message (values and all), as one quoted word."""
    return f"echo {q(one_line(text))}" + (" >&2" if err else "")


_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def params(**values: object) -> str:
    """`name=value` lines, each value quoted: the parameter block at the top of a script."""
    lines = []
    for name, value in values.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"parameter name {name!r} is not a lower-case shell identifier")
        lines.append(f"{name}={q(value)}")
    return "\n".join(lines) + ("\n" if lines else "")


def library(*names: str) -> str:
    """The static bash libraries `<name>.sh` beside this module, without their header comment (the
    file documents itself; a script stays lean: pulumi-command prints it whole on failure)."""
    out = []
    for n in names:
        lines = (HERE / f"{n}.sh").read_text().splitlines(keepends=True)
        while lines and lines[0].startswith("#"):
            lines.pop(0)
        out.append("".join(lines).lstrip("\n"))
    return "".join(out)


def static_file(name: str) -> str:
    """A static helper program (Python) beside this module, whole."""
    return (HERE / name).read_text()


def heredoc(delimiter: str, text: str) -> str:
    """`<<'DELIM'\\n<text>DELIM\\n`: a quoted heredoc (nothing in it is expanded). Refuses a text
    with the delimiter as a line, which would end the document early and run the rest as code."""
    if not text.endswith("\n"):
        text += "\n"
    if delimiter in text.splitlines():
        raise UnsafeText(f"the text holds its heredoc delimiter {delimiter} as a line")
    return f"<<'{delimiter}'\n{text}{delimiter}\n"


def header(stack: str, node: str, what: str, *, converge: int = 0) -> str:
    """Shebang, what and where (a comment), strict mode. A service script carries the stack's
    `ascend-pd:converge` generation when it is set: changing it changes the script, so the next
    `pulumi up` runs the script again (an update), which restarts whatever is dead."""
    gen = comment(f"ascend-pd:converge {converge}") if converge else ""
    return f"#!/usr/bin/env bash\n{comment(f'ascend-pd {stack}: {what} on {node}')}{gen}set -euo pipefail\n"


def source_env_files(files: Sequence[str]) -> str:
    """Source the container's environment scripts (CANN's set_env.sh) when present, leniently:
    they are not `set -u` clean."""
    if not files:
        return ""
    text = "# The environment an interactive shell in this container has (CANN's set_env.sh files).\nset +eu\n"
    text += "".join(f"# shellcheck source=/dev/null\nif [ -f {q(f)} ]; then . {q(f)}; fi\n" for f in files)
    return text + "set -eu\n"


def fingerprint(*texts: str) -> str:
    """A short hash of command texts: a running process recorded with another one is restarted."""
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


_ENV_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def env_value(value: str) -> str:
    """A double-quoted env value in which `$NAME`/`${NAME}` stay references (as in the seeds'
    `LD_PRELOAD=...:$LD_PRELOAD`), made safe under `set -u`; everything else is literal."""
    out, pos = [], 0
    for m in _ENV_REF.finditer(value):
        out.append(re.sub(r'(["\\`$])', r"\\\1", value[pos : m.start()]))
        out.append("${%s:-}" % (m.group(1) or m.group(2)))
        pos = m.end()
    out.append(re.sub(r'(["\\`$])', r"\\\1", value[pos:]))
    return '"' + one_line("".join(out)) + '"'


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _argv_lines(argv: Sequence[str], head: int) -> list[str]:
    """The first `head` words on one line, then one flag (with its value) per line."""
    lines = [" ".join(q(a) for a in argv[:head])]
    rest, i = list(argv[head:]), 0
    while i < len(rest):
        if rest[i].startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            lines.append(f"{q(rest[i])} {q(rest[i + 1])}")
            i += 2
        else:
            lines.append(q(rest[i]))
            i += 1
    return lines


def command(argv: Sequence[str], *, head: int = 1, env: Iterable[tuple[str, str]] = (),
            unset: Sequence[str] = (), prefix: str = "") -> str:
    """`[prefix]env -u X K="v" ARGV...`: one continued line per env var and per flag (with its
    value), every word quoted, so a diff shows a changed value on the line that holds it."""
    words = _argv_lines(argv, head)
    env = list(env)
    pre: list[str] = []
    if env or unset:
        pre.append(prefix + "env")
        if unset:
            pre.append(" ".join(f"-u {q(u)}" for u in unset))
        for k, v in env:
            if not _ENV_NAME.fullmatch(k):
                raise UnsafeText(f"environment name {k!r} is not a shell identifier")
            pre.append(f"{k}={env_value(v)}")
    elif prefix:
        words[0] = prefix + words[0]
    return " \\\n    ".join(pre + words)


def background(argv: Sequence[str], log: str, *, env: Iterable[tuple[str, str]] = (),
               unset: Sequence[str] = (), head: int = 1) -> str:
    """`setsid nohup env ... CMD > LOG 2>&1 < /dev/null &`: its own session and process group, so
    it outlives the `docker exec` that started it and can be stopped as a group; stdin/stdout
    detached, or the exec would wait on them."""
    return command(argv, head=head, env=env, unset=unset, prefix="setsid nohup ") + \
        f" \\\n    > {q(log)} 2>&1 < /dev/null &"


def managed_start(name: str, run_dir: str, log: str, start: str, grace: int, *, spec: str = "") -> str:
    """Start `start` (a `background` line) unless it already runs with the same fingerprint (by
    default the command's own); a running process with another one is stopped first. Leaves the
    pid in <run_dir>/<name>.pid."""
    pidfile = f"{run_dir}/{name}.pid"
    spec = spec or fingerprint(start)
    return (f"if needs_start {q(pidfile)} {spec} {grace}; then\n"
            f"  rotate_log {q(log)}\n"
            f"  {start.replace(chr(10), chr(10) + '  ')}\n"
            f"  started {q(pidfile)} {spec} $!\n"
            f"fi\n")


# ---------------------------------------------------------------------------------------------
# Transport: what Pulumi (pulumi-command over SSH) runs on the node


FOLLOWS_ENV = "ASCEND_PD_FOLLOWS"  # in the container: the ids of the resources a create follows
LOCK_TIMEOUT_EXIT = 75  # flock's exit when the lock stayed held (EX_TEMPFAIL; no script exits with it)


@dataclass(frozen=True)
class Lock:
    """The file one script's runs on one node take turns on, and how long a run waits for it."""

    path: str
    wait_s: int


@dataclass(frozen=True)
class Locks:
    """Where a node container's scripts keep their locks (one per script name: create and delete of
    the same script share it), and the longest wait (the longest a legitimate run can take)."""

    dir: str
    wait_s: int

    def of(self, name: str) -> Lock:
        return Lock(f"{self.dir.rstrip('/')}/{name}.lock", self.wait_s)


# Run the script on stdin holding its lock ($0, waiting up to $1 s). `flock -o` keeps the lock in the
# flock process, not in the script's descriptors: the services the script starts (setsid nohup) do
# not inherit it, so the lock ends with the run, not with the ranks. A second run of the same script
# (the script of a `pulumi up` killed mid-run still running here, a `heal`, the next `up`) waits for
# the first and then finds what it started, instead of starting it a second time.
_LOCKED_RUN = f"""if ! command -v flock >/dev/null 2>&1; then
  echo "ascend-pd: this container has no flock (util-linux), which keeps two runs of one script apart: add util-linux to the image" >&2
  exit 1
fi
mkdir -p "${{0%/*}}"
if ! flock -n "$0" true; then echo "another run of this script holds $0: waiting for it (at most $1 s)"; fi
flock -o -E {LOCK_TIMEOUT_EXIT} -w "$1" "$0" bash -s && exit 0
rc=$?
if [ "$rc" = {LOCK_TIMEOUT_EXIT} ]; then
  echo "ascend-pd: another run of this script held $0 for $1 s (a pulumi up killed mid-run, or a heal, still running it on this node): see it with: pgrep -af 'flock.*$0'; run again once it has ended" >&2
fi
exit "$rc"
"""


def in_container(container: str, script: str, *, lock: Optional[Lock], delete: bool = False, host_first: str = "",
                 follows: str = "") -> str:
    """The script, whole and literal, on `docker exec -i <container> bash -s`'s stdin.

    A stopped container (a reboot, `docker stop`) is started first: its processes are gone either
    way, and the scripts converge from there (a create restarts what is dead; a delete cleans up
    files). A delete finds nothing to do when the container no longer exists.

    follows: the ids of resources on other nodes this create follows (components.transport), given
    to the script as $ASCEND_PD_FOLLOWS: a script can tell that one of them was replaced since it
    last ran (the worker: the etcd it joined).

    lock: the script's lock on this node (Locks.of(script name)); None only for a one-line step
    that needs none (a secret file's removal)."""
    name = q(container)
    env = f"-e {FOLLOWS_ENV}={q(follows)} " if follows else ""
    if delete:
        gone = f"{say(f'container {container} is gone: nothing to do')}; exit 0"
    else:
        gone = f"{say(f'container {container} does not exist on this node: run pulumi refresh, then pulumi up', err=True)}; exit 1"
    return host_first + (
        f"state=$(docker inspect --type container --format '{{{{.State.Running}}}}' {name} 2>&1) || case \"$state\" in\n"
        f"  *'No such'*) state=missing ;;\n"
        f"  *) echo {q(f'docker inspect {one_line(container)}:')} \"$state\" >&2; exit 1 ;;\n"
        f"esac\n"
        f"case \"$state\" in\n"
        f"  true) ;;\n"
        f"  missing) {gone} ;;\n"
        f"  *) {say(f'container {container} is stopped: starting it')}; docker start {name} >/dev/null ;;\n"
        f"esac\n"
        + (f"docker exec -i {env}{name} bash -c {q(_LOCKED_RUN)} {q(lock.path)} {int(lock.wait_s)} " if lock
           else f"docker exec -i {env}{name} bash -s ")
        + heredoc(SCRIPT_DELIMITER, script)
    )


def on_host(script: str) -> str:
    """A host script (huge pages) on `bash -s`'s stdin."""
    return f"bash -s {heredoc(SCRIPT_DELIMITER, script)}"


__all__ = [
    "Script", "UnsafeText", "q", "one_line", "comment", "say", "params", "library", "static_file", "heredoc",
    "header", "source_env_files", "fingerprint", "env_value", "command", "background", "managed_start",
    "in_container", "on_host", "Lock", "Locks", "LOCK_TIMEOUT_EXIT", "RESERVED_PREFIX", "SCRIPT_DELIMITER", "PROBE_DELIMITER", "PYTHON_DELIMITER",
    "LOG_TAIL", "CURL",
]
