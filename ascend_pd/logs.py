"""`ascend-pd logs --stack S`: every selected log of the stack (logsources.py), read on all nodes at once.

One SSH run per node (ascend_pd/ssh.py: doctor's and heal's transport, connection settings and
deadline): a host script that reads the files inside the NPU container (`docker exec`, where the
launch scripts write them) and etcd's own container with `docker logs`. Every line comes back
tagged with its source's index (`<i> L <line>`; `<i> M`: no log yet; `<i> E <why>`), so the
operator side can prefix it with the rank (or service) and node, colour it per source on a terminal,
and filter `--since` by the lines' own timestamps.

`-f` follows every selected source at once. Each layer (the ssh session's shell, the shell in the
container) writes a heartbeat line every second and stops its followers when that write fails: when
the operator presses Ctrl-C (ssh is killed), nothing keeps running on a node or in a container, even
for a log that never gets another line (`docker exec` does not stop the process it started when its
client dies).
"""

from __future__ import annotations

import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Optional, Sequence, TextIO

from . import ssh
from .logsources import Source
from .plan import Plan
from .shell import q

MARK = "@@apd"
DEFAULT_TIMEOUT_S = 20.0  # one node's whole read, connection included (doctor's is 30 for its checks)
SINCE_MAX_LINES = 10000  # lines per source read to filter --since when no --tail is given
HEARTBEAT_S = 1
PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green",
           "bright_yellow", "bright_blue", "red", "bright_red")
_LINE = re.compile(r"^(\d+) ([LME])(?: (.*))?$")


def screenful() -> int:
    """A screenful: the terminal's height less the prompt, 24 lines when there is none."""
    return max(5, shutil.get_terminal_size((80, 26)).lines - 2)


# ---------------------------------------------------------------------------------------------
# The scripts a node runs


def _file_reader(i: int, path: str, tail: int, grep: str, follow: bool) -> str:
    tag = f'sed -u "s/^/{i} L /"'
    f = q(path)
    if not follow:
        body = (f"grep -a -E -e {q(grep)} -- {f} | tail -n {tail}" if grep else f"tail -n {tail} -- {f}")
        return f"if [ -e {f} ]; then {{ {body}; }} 2>&1 | {tag}; else echo '{i} M'; fi\n"
    first = f"grep -a -E -e {q(grep)} -- {f} | tail -n {tail} | {tag}; " if grep else ""
    follow_cmd = (f"tail -n 0 -F -- {f} 2>/dev/null | grep --line-buffered -a -E -e {q(grep)} | {tag}" if grep
                  else f"tail -n {tail} -F -- {f} 2>/dev/null | {tag}")
    inner = f"{first}{follow_cmd}"
    return (f"[ -e {f} ] || echo '{i} M'\n"
            f"setsid bash -c {q(inner)} </dev/null & pids+=($!)\n")


def _supervise(follow: bool) -> str:
    """Follow mode: a heartbeat until the reader is gone, then every follower's process group ends."""
    if not follow:
        return ""
    # Also on TERM/HUP: a layer stopped by a signal (the one above it ending) stops its followers too.
    return ("stop_all() { for p in \"${pids[@]}\"; do kill -- \"-$p\" 2>/dev/null; done; exit 0; }\n"
            "trap stop_all TERM HUP INT\n"
            f"while printf '{MARK} hb\\n' 2>/dev/null; do sleep {HEARTBEAT_S}; done\n"
            "stop_all\n")


def node_script(plan: Plan, picked: Sequence[tuple[int, Source]], *, tail: int, grep: str = "",
                follow: bool = False) -> str:
    """The host script for one node: `picked` are (index, source) of that node."""
    container = plan.cfg.container.name
    files = [(i, s) for i, s in picked if not s.docker]
    inner = "trap '' PIPE\npids=()\n" + "".join(_file_reader(i, s.path, tail, grep, follow) for i, s in files) \
        + _supervise(follow)
    out = [f"trap '' PIPE\npids=()\necho '{MARK} hello'\n"]
    if files:
        idx = " ".join(str(i) for i, _ in files)
        out.append(
            f"state=$(docker inspect --type container --format '{{{{.State.Running}}}}' {q(container)} 2>&1) "
            f"|| state=\"absent\"\n"
            f"if [ \"$state\" = true ]; then\n"
            + (f"  setsid docker exec -i {q(container)} bash -c {q(inner)} </dev/null & pids+=($!)\n" if follow
               else f"  docker exec -i {q(container)} bash -c {q(inner)} </dev/null\n")
            + f"else\n  for i in {idx}; do echo \"$i E container {container} is not running ($state): its logs are "
            f"inside it (docker start {container}, or pulumi up)\"; done\nfi\n")
    for i, s in picked:
        if s.docker:
            grep_part = f" | grep --line-buffered -a -E -e {q(grep)}" if grep else ""
            cmd = (f"docker logs --tail {tail}{' -f' if follow else ''} {q(s.path)} 2>&1{grep_part} | sed -u \"s/^/{i} L /\"")
            out.append(f"if docker inspect --type container {q(s.path)} >/dev/null 2>&1; then\n"
                       + (f"  setsid bash -c {q(cmd)} </dev/null & pids+=($!)\n" if follow else f"  {cmd}\n")
                       + f"else echo '{i} E container {s.path} does not exist on this node'; fi\n")
    out.append(_supervise(follow))
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Reading the answers


@dataclass
class SourceLog:
    source: Source
    lines: list[str] = field(default_factory=list)
    missing: bool = False  # the file does not exist yet
    notes: list[str] = field(default_factory=list)  # why it could not be read


@dataclass
class Fetched:
    logs: list[SourceLog]
    unreachable: dict[str, str]  # node -> why
    elapsed_s: float


def parse_into(text: str, logs: dict[int, SourceLog]) -> None:
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or int(m.group(1)) not in logs:
            continue
        log = logs[int(m.group(1))]
        kind, payload = m.group(2), m.group(3) or ""
        if kind == "L":
            log.lines.append(payload)
        elif kind == "M":
            log.missing = True
        else:
            log.notes.append(payload)


def _by_node(picked: Sequence[Source]) -> dict[str, list[tuple[int, Source]]]:
    nodes: dict[str, list[tuple[int, Source]]] = {}
    for i, s in enumerate(picked):
        nodes.setdefault(s.node, []).append((i, s))
    return nodes


def fetch(plan: Plan, picked: Sequence[Source], targets: dict[str, ssh.Target], *, tail: int, grep: str = "",
          timeout_s: float = DEFAULT_TIMEOUT_S) -> Fetched:
    """The last `tail` lines (matching `grep`) of every picked source, the nodes as many at once as
    `--parallel` lets through, all within timeout_s."""
    start = time.monotonic()
    nodes = _by_node(picked)
    scripts = {n: node_script(plan, items, tail=tail, grep=grep) for n, items in nodes.items()}
    results = ssh.run_on_nodes(targets, scripts, timeout_s=timeout_s, deadline_s=timeout_s)
    logs = {i: SourceLog(s) for i, s in enumerate(picked)}
    unreachable = {}
    for n, r in results.items():
        parse_into(r.stdout, logs)
        if r.error:
            unreachable[n] = r.error
        elif r.rc not in (0, None) and f"{MARK} hello" not in r.stdout:
            unreachable[n] = f"the read failed (exit {r.rc}): {r.stderr.strip()[-200:]}"
    return Fetched([logs[i] for i in range(len(picked))], unreachable, time.monotonic() - start)


# ---------------------------------------------------------------------------------------------
# --since: by the lines' own timestamps


_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)?")
_VLLM = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")  # INFO 12-05 12:44:28 [api_server.py:1] ...
_GLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)")  # I1205 12:44:28.123456 (openYuanrong)


def line_time(line: str, now: datetime) -> Optional[datetime]:
    """The time a log line says it was written (aware; a time without zone is the operator's local time),
    or None when it says none (a traceback line)."""
    head = line[:80]
    m = _ISO.search(head)
    if m:
        y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
        zone = m.group(7)
        try:
            if zone:
                z = zone.replace(":", "")
                tz = timezone.utc if z == "Z" else timezone(timedelta(hours=int(z[:3]), minutes=int(z[0] + z[3:5])))
                return datetime(y, mo, d, h, mi, s, tzinfo=tz)
            return datetime(y, mo, d, h, mi, s).astimezone()
        except ValueError:
            return None
    m = _GLOG.match(head) or _VLLM.search(head)
    if not m:
        return None
    mo, d, h, mi, s = (int(x) for x in m.groups())
    try:
        t = datetime(now.year, mo, d, h, mi, s).astimezone()
    except ValueError:
        return None
    return t.replace(year=now.year - 1) if t > now + timedelta(days=1) else t  # no year: December's line in January


_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now: Optional[datetime] = None) -> datetime:
    """`--since`: a duration ago (90s, 10m, 2h, 1d) or a time (2026-12-05T12:00, a zone optional)."""
    now = now or datetime.now().astimezone()
    m = _AGO.match(text.strip())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text}: not a duration (90s, 10m, 2h, 1d) or a time (2026-12-05T12:00)") from None
    return t if t.tzinfo else t.astimezone()


def since_filter(lines: list[str], cutoff: datetime, now: Optional[datetime] = None) -> list[str]:
    """The lines written at or after `cutoff`; a line without a time goes with the line before it (a
    traceback with its message), and lines before the first timed one are kept (nothing dates them)."""
    now = now or datetime.now().astimezone()
    keep, out = True, []
    for line in lines:
        t = line_time(line, now)
        if t is not None:
            keep = t >= cutoff
        if keep:
            out.append(line)
    return out


# ---------------------------------------------------------------------------------------------
# Output


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def printable(text: str) -> str:
    """A log line as text: its control characters (a colour code vLLM wrote, a stray escape) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class Printer:
    """Prefixed lines, one colour per source on a terminal (rich, NO_COLOR honoured), plain when piped."""

    def __init__(self, picked: Sequence[Source], out: TextIO, force_terminal: Optional[bool] = None):
        from . import term

        self.out = out
        self.width = max((len(s.label) for s in picked), default=0)
        self.colour = {s.label: PALETTE[i % len(PALETTE)] for i, s in enumerate(picked)}
        self.con = term.console(out, True if force_terminal is None else force_terminal) \
            if term.is_terminal(out, force_terminal) else None

    def line(self, s: Source, text: str) -> None:
        prefix = f"{s.label:<{self.width}} |"
        if self.con is None:
            self.out.write(f"{prefix} {printable(text)}\n")
            return
        from rich.text import Text

        self.con.print(Text(prefix, style=self.colour[s.label]) + Text(" " + printable(text)))

    def note(self, s: Source, text: str) -> None:
        self.line(s, f"-- {text}")

    def flush(self) -> None:
        self.out.flush()


def show(fetched: Fetched, printer: Printer, err: TextIO, *, since: Optional[datetime] = None, grep: str = "") -> int:
    """Print what was read: every source's lines together, in the plan's order; an unreachable node is
    one line on stderr. 1 when a node could not be read."""
    for log in fetched.logs:
        if log.source.node in fetched.unreachable and not (log.lines or log.missing or log.notes):
            continue
        for note in log.notes:
            printer.note(log.source, note)
        if log.missing:
            printer.note(log.source, f"no log yet ({log.source.path} does not exist: not started since the container was)")
            continue
        lines = since_filter(log.lines, since) if since else log.lines
        for ln in lines:
            printer.line(log.source, ln)
        if not lines and not log.notes:
            printer.note(log.source, "no line since " + since.strftime("%Y-%m-%d %H:%M:%S") if since and log.lines
                         else "no line matches --grep" if grep else "the log is empty")
    printer.flush()
    for node, why in sorted(fetched.unreachable.items()):
        names = [log.source.name for log in fetched.logs if log.source.node == node]
        err.write(f"{node}: {why}; not shown: {', '.join(names)}\n")
    return 1 if fetched.unreachable else 0


# ---------------------------------------------------------------------------------------------
# -f


def follow(plan: Plan, picked: Sequence[Source], targets: dict[str, ssh.Target], printer: Printer, err: TextIO, *,
           tail: int, grep: str = "", timeout_s: float = DEFAULT_TIMEOUT_S, stop: Optional[threading.Event] = None,
           since: Optional[datetime] = None) -> int:
    """Follow every picked source until Ctrl-C (or `stop`): lines as they come, from every node at once.
    A node that does not answer within timeout_s is named on stderr and the others go on."""
    nodes = _by_node(picked)
    index = dict(enumerate(picked))
    events: queue.Queue = queue.Queue()
    procs: dict[str, subprocess.Popen] = {}
    stop = stop or threading.Event()

    def reader(node: str, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b""):
            events.put((node, raw.decode("utf-8", "replace").rstrip("\n")))
        proc.wait()
        events.put((node, None))

    started = time.monotonic()
    for node, items in nodes.items():
        proc = subprocess.Popen(targets[node].argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        procs[node] = proc
        try:
            proc.stdin.write(node_script(plan, items, tail=tail, grep=grep, follow=True).encode())
            proc.stdin.close()
        except OSError:
            pass
        threading.Thread(target=reader, args=(node, proc), daemon=True).start()
    hello: set[str] = set()
    gone: set[str] = set()
    keep: dict[str, bool] = {}  # --since: per source, whether its last timed line was recent
    code = 0

    def drop(node: str, why: str) -> None:
        nonlocal code
        gone.add(node)
        code = 1
        names = ", ".join(s.name for _, s in nodes[node])
        err.write(f"{node}: {why}; not followed: {names}\n")
        err.flush()

    try:
        while len(gone) < len(nodes) and not stop.is_set():
            try:
                node, line = events.get(timeout=0.2)
            except queue.Empty:
                node, line = None, None
            if node is not None and line is None and node not in gone:
                p = procs[node]
                why = (p.stderr.read().decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
                drop(node, f"ssh ended (exit {p.returncode}): {why}")
            elif node is not None:
                if line == f"{MARK} hello":
                    hello.add(node)
                elif not line.startswith(MARK):
                    m = _LINE.match(line)
                    if m and int(m.group(1)) in index:
                        s = index[int(m.group(1))]
                        kind = m.group(2)
                        if kind == "L" and (since is None or _recent(keep, s, m.group(3) or "", since)):
                            printer.line(s, m.group(3) or "")
                        elif kind == "M":
                            printer.note(s, f"no log yet ({s.path}): following it until it appears")
                        else:
                            printer.note(s, m.group(3) or "")
                        printer.flush()
            if time.monotonic() - started > timeout_s:
                for n in set(nodes) - hello - gone:
                    _kill(procs[n])
                    drop(n, f"no answer within {timeout_s:g} s (ssh {targets[n].user}@{targets[n].address}:{targets[n].port})")
                    hello.add(n)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs.values():
            _kill(p)
    return code


def _recent(keep: dict[str, bool], s: Source, line: str, since: datetime) -> bool:
    """since_filter one line at a time: a line without a time goes with the one before it."""
    t = line_time(line, datetime.now().astimezone())
    if t is not None:
        keep[s.label] = t >= since
    return keep.get(s.label, True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        import os

        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


# ---------------------------------------------------------------------------------------------
# The command


def run(plan: Plan, picked: Sequence[Source], targets: dict[str, ssh.Target], *, tail: Optional[int] = None,
        since: Optional[str] = None, grep: str = "", follow_: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
        out: Optional[TextIO] = None, err: Optional[TextIO] = None, force_terminal: Optional[bool] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    cutoff = parse_since(since) if since else None
    n = tail if tail is not None else (SINCE_MAX_LINES if cutoff else screenful())
    printer = Printer(picked, out, force_terminal)
    if follow_:
        return follow(plan, picked, targets, printer, err, tail=n, grep=grep, timeout_s=timeout_s, since=cutoff)
    return show(fetch(plan, picked, targets, tail=n, grep=grep, timeout_s=timeout_s), printer, err, since=cutoff,
                grep=grep)


def rank_tails(plan: Plan, names: Sequence[str], targets: dict[str, ssh.Target], *, lines: int,
               timeout_s: float) -> Fetched:
    """The last lines of these ranks' logs (status -v), within timeout_s."""
    from .logsources import sources

    picked = [s for s in sources(plan) if s.kind == "rank" and s.name in names]
    return fetch(plan, picked, targets, tail=lines, timeout_s=timeout_s)


STATUS_TAIL_LINES = 20  # of each broken rank's log under `status -v`
STATUS_TAIL_RANKS = 8  # ranks shown (a dead 32-rank group: the first of each instance, then others)


def status_tails(plan: Plan, rep, timeout_s: float) -> str:
    """`status -v`: the last lines of the broken ranks' logs, read over SSH (the operator's agent and
    ~/.ssh/config, the stack's pinned host keys) within `timeout_s`; "" when no rank is broken."""
    down = {n.node for n in rep.nodes if n.state == "unreachable"}  # its line in LOGS says where to look
    bad = [r for r in rep.ranks if (r.state != "ok" or not r.ok) and r.node not in down]
    if not bad:
        return ""
    firsts = list(dict.fromkeys(f"{r.role}-{r.instance}" for r in bad))
    order = [next(r for r in bad if f"{r.role}-{r.instance}" == i) for i in firsts]
    order += [r for r in bad if r not in order]
    names = [r.name for r in order[:STATUS_TAIL_RANKS]]
    targets = ssh.ssh_targets(plan, connect_timeout_s=min(ssh.DEFAULT_CONNECT_TIMEOUT_S, timeout_s))
    got = rank_tails(plan, names, targets, lines=STATUS_TAIL_LINES, timeout_s=timeout_s)
    out = ["", f"LAST {STATUS_TAIL_LINES} LINES of the broken ranks' logs"
           + (f" ({len(names)} of {len(bad)}: `ascend-pd logs` shows the others)" if len(bad) > len(names) else "")]
    for log in sorted(got.logs, key=lambda lg: names.index(lg.source.name)):
        s = log.source
        if s.node in got.unreachable and not (log.lines or log.missing or log.notes):
            continue
        out.append(f"  {s.label} ({s.path}):")
        out += [f"    -- {n}" for n in log.notes]
        out += ["    -- no log yet"] if log.missing else [f"    {printable(ln)}" for ln in log.lines]
    out += [f"  {node}: logs not read: {why}" for node, why in sorted(got.unreachable.items())]
    return "\n".join(out) + "\n"


__all__ = ["status_tails", "node_script", "fetch", "follow", "run", "show", "Printer", "parse_since", "since_filter", "line_time",
           "rank_tails", "Fetched", "SourceLog", "DEFAULT_TIMEOUT_S", "screenful"]
