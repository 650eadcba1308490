"""Run a script on many nodes at once over the operator's own OpenSSH client (doctor, heal).

    targets = ssh_targets(plan)                       # or ssh_targets(plan, identity_file=..., ...)
    results = run_on_nodes(targets, {"p0": text, ...}, timeout_s=30)     # set_parallel(n): sessions at once
    results["p0"].ok, .rc, .stdout, .stderr, .elapsed, .error, .first_output_at

Why the `ssh` binary and not an SSH library: it is what pulumi-docker already uses for every node
(`docker -H ssh://...`), so the same ssh-agent, `~/.ssh/config` (jump hosts, per-host keys) and
`~/.ssh/known_hosts` apply, and a node doctor reaches is a node `pulumi up` reaches. The script
goes to `bash -s` on stdin, whole and literal, as with pulumi-command.

Bounds: `ConnectTimeout` for the TCP and SSH handshake, `ServerAlive*` for a node that stops
answering mid-run, and `timeout_s` for the whole run of one node (the process group is killed).
An unreachable node is one failed Result; nothing here raises for a node's failure.
`BatchMode=yes`: no password or host-key prompt can block a run.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Optional

from .plan import Plan

# A LAN node completes the TCP and SSH handshake in well under a second; 5 s rides out a busy sshd.
DEFAULT_CONNECT_TIMEOUT_S = 5
# Keepalive: a node silent for 3 x 5 s is gone.
SERVER_ALIVE_INTERVAL_S = 5
SERVER_ALIVE_COUNT = 3
SSH_FAILED = 255  # ssh's own exit code: connection, authentication, host key
# At most this many ssh sessions at once, per command (doctor, logs, bundle, heal; `--parallel`). Every
# session is a process and a key signature (one ssh-agent serves them one at a time) on the operator's
# machine; through a jump host each is a connection to the bastion's one sshd, whose default
# `MaxStartups 10:30:100` starts refusing unauthenticated connections beyond 10. At 256 nodes an
# unbounded fan-out was 256 ssh processes for one `bundle`. 32: a 256-node read in 8 waves of
# about a second each (tools/scale_bench: docs/development.md "Scale").
DEFAULT_PARALLEL = 32
MAX_PARALLEL = 1024


@dataclass(frozen=True)
class Target:
    """How to reach one node: address and the stack's ssh settings, plus operator-side files."""

    name: str
    address: str
    user: str
    port: int
    identity_file: Optional[str] = None  # else ssh-agent / ~/.ssh/config
    known_hosts_file: Optional[str] = None  # else the operator's ~/.ssh/known_hosts
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    def argv(self) -> list[str]:
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout_s))}",
                "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL_S}", "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT}",
                "-p", str(self.port), "-l", self.user]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts_file:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts_file}", "-o", "StrictHostKeyChecking=yes",
                     "-o", "GlobalKnownHostsFile=/dev/null"]
        return argv + ["--", self.address, "bash -s"]


@dataclass(frozen=True)
class Result:
    """One node's run. `error` is None when the script ran (whatever its exit code), else why it
    did not run or did not finish (unreachable, authentication, host key, timeout)."""

    node: str
    rc: Optional[int]
    stdout: str
    stderr: str
    elapsed: float
    error: Optional[str] = None
    first_output_at: Optional[float] = None  # time.time() when the first stdout line arrived

    @property
    def ok(self) -> bool:
        return self.error is None and self.rc == 0


def known_hosts_line(address: str, port: int, key: str) -> str:
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key.strip()}\n"


def ssh_targets(plan: Plan, *, identity_file: Optional[str] = None, known_hosts_file: Optional[str] = None,
                connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> dict[str, Target]:
    """Every node of the plan with the stack's `ascend-pd:ssh` user and port. When the stack pins host
    keys (`ssh.hostKeys`) and no known_hosts file is given, those pins become a private known_hosts
    file (strict checking), so doctor verifies exactly what pulumi-command verifies."""
    ssh = plan.cfg.ssh
    if known_hosts_file is None and ssh.host_keys:
        missing = [n.name for n in plan.nodes if n.name not in ssh.host_keys]
        if not missing:
            fd, known_hosts_file = tempfile.mkstemp(prefix="ascend-pd-known-hosts-")
            atexit.register(_remove, known_hosts_file)
            with os.fdopen(fd, "w") as f:
                f.writelines(known_hosts_line(n.address, ssh.port, ssh.host_keys[n.name]) for n in plan.nodes)
    return {n.name: Target(n.name, n.address, ssh.user, ssh.port, identity_file, known_hosts_file, connect_timeout_s)
            for n in plan.nodes}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _why(stderr: str, target: Target) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently added")]
    last = lines[-1] if lines else "no message"
    if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        return (f"host key of {target.address} not verified ({last}): add it to known_hosts "
                f"(ssh-keyscan -p {target.port} {target.address}) or pin ascend-pd:ssh.hostKeys.{target.name}")
    if "Permission denied" in stderr:
        return f"ssh as {target.user} refused ({last}): load the stack's key into ssh-agent or pass --identity"
    return f"unreachable over ssh {target.user}@{target.address}:{target.port}: {last}"


class _Gate:
    """The process-wide bound on ssh sessions at once: every run_one passes it, whichever command or
    thread pool started it (bundle runs its nodes' reads and doctor's at once; heal restarts instances
    and their nodes at once)."""

    def __init__(self, size: int):
        self.size = size
        self._sem = threading.BoundedSemaphore(size)

    def acquire(self, deadline: Optional[float], cancelled: Optional[threading.Event]) -> bool:
        """A session, or False once the deadline passed or the run was cancelled (Ctrl-C) first."""
        while True:
            wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if cancelled is not None and cancelled.is_set():
                return False
            if wait <= 0:
                return False
            if self._sem.acquire(timeout=wait):
                late = deadline is not None and time.monotonic() >= deadline
                if late or (cancelled is not None and cancelled.is_set()):
                    self._sem.release()
                    return False
                return True

    def release(self) -> None:
        self._sem.release()


_GATE = _Gate(DEFAULT_PARALLEL)


def set_parallel(n: int) -> None:
    """At most n ssh sessions at once from now on (the command's `--parallel`)."""
    global _GATE
    if not 1 <= n <= MAX_PARALLEL:
        raise ValueError(f"--parallel {n}: from 1 to {MAX_PARALLEL} ssh sessions at once")
    _GATE = _Gate(n)


def parallel() -> int:
    return _GATE.size


# The ssh processes running now. Each runs in its own session (so a deadline can kill its whole group),
# which also keeps a terminal's Ctrl-C from reaching it: on KeyboardInterrupt they are killed from here.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def kill_live() -> None:
    """Kill every ssh still running (the operator pressed Ctrl-C): nothing is left behind."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_one(target: Target, script: str, timeout_s: float, *, deadline: Optional[float] = None,
            cancelled: Optional[threading.Event] = None) -> Result:
    """One node's run, once a session is free (the `--parallel` gate), within timeout_s; with a
    `deadline` (time.monotonic()), a node still waiting for a session then is not started at all,
    nor once `cancelled` is set."""
    start = time.monotonic()
    gate = _GATE
    if not gate.acquire(deadline, cancelled):
        why = ("cancelled" if cancelled is not None and cancelled.is_set() else
               f"the {gate.size} ssh sessions at once (--parallel) were busy until the deadline; a larger "
               "--parallel or --timeout reaches it")
        return Result(target.name, None, "", "", time.monotonic() - start, f"not started: {why}")
    try:
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.1, deadline - time.monotonic()))
        return _run_one(target, script, timeout_s, time.monotonic())
    finally:
        gate.release()


def _run_one(target: Target, script: str, timeout_s: float, start: float) -> Result:
    try:
        proc = subprocess.Popen(target.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return Result(target.name, None, "", "", 0.0, f"cannot run ssh: {exc}")
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        return _finish(proc, target, script, timeout_s, start)
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def _finish(proc: subprocess.Popen, target: Target, script: str, timeout_s: float, start: float) -> Result:
    first: list[float] = []
    out: list[str] = []
    err: list[bytes] = []

    def read_out() -> None:
        for raw in iter(proc.stdout.readline, b""):
            if not first:
                first.append(time.time())
            out.append(raw.decode("utf-8", "replace"))

    def read_err() -> None:
        err.append(proc.stderr.read())

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    try:
        proc.stdin.write(script.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # ssh exited before reading its stdin (unreachable): its exit code says why
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for t in readers:
        t.join(timeout=2)
    elapsed = time.monotonic() - start
    stdout, stderr = "".join(out), b"".join(err).decode("utf-8", "replace")
    error = None
    if timed_out:
        error = f"no answer within {timeout_s:g} s (ssh {target.user}@{target.address}:{target.port})"
    elif proc.returncode == SSH_FAILED and not stdout:
        error = _why(stderr, target)
    return Result(target.name, None if timed_out else proc.returncode, stdout, stderr, elapsed, error,
                  first[0] if first else None)


def run_on_nodes(targets: Mapping[str, Target], scripts: Mapping[str, str], *, timeout_s: float = 60.0,
                 deadline_s: Optional[float] = None) -> dict[str, Result]:
    """Run scripts[node] on each node, as many at once as the `--parallel` gate lets through. Each
    node's run is bounded by timeout_s; with deadline_s, every node's Result is in within deadline_s
    of the call, waiting for a session included (a node whose turn has not come by then is named as
    not started); without it, a node may wait for the nodes ahead of it."""
    unknown = sorted(set(scripts) - set(targets))
    if unknown:
        raise ValueError(f"no ssh target for node(s) {unknown}")
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    # A thread per node: the threads wait at the gate, not in a pool's queue, so the deadline holds for all.
    pool = ThreadPoolExecutor(max_workers=max(1, len(scripts)))
    cancelled = threading.Event()
    futures = {}
    try:
        # Submitted inside the try: a Ctrl-C between two submits must still kill the ssh already started.
        for n, text in scripts.items():
            futures[n] = pool.submit(run_one, targets[n], text, timeout_s, deadline=deadline, cancelled=cancelled)
        return {n: f.result() for n, f in futures.items()}
    except KeyboardInterrupt:
        cancelled.set()  # the nodes still waiting for a session start none
        for f in futures.values():
            f.cancel()
        kill_live()  # the running threads then end at once, and shutdown below does not wait out a deadline
        raise
    finally:
        pool.shutdown(wait=True)


__all__ = ["Target", "Result", "ssh_targets", "run_on_nodes", "run_one", "known_hosts_line", "kill_live",
           "set_parallel", "parallel", "DEFAULT_PARALLEL"]
