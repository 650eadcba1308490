"""Run a script on many nodes at once over the operator's own OpenSSH client (doctor, heal).

    targets = ssh_targets(plan)                       # or ssh_targets(plan, identity_file=..., ...)
    results = run_on_nodes(targets, {"p0": text, ...}, timeout_s=30, parallel=16)
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


def run_one(target: Target, script: str, timeout_s: float) -> Result:
    start = time.monotonic()
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
                 parallel: int = 16) -> dict[str, Result]:
    """Run scripts[node] on each node (all of them at once, at most `parallel` ssh processes);
    every node of `scripts` gets a Result within about timeout_s (+ the queue ahead of it)."""
    unknown = sorted(set(scripts) - set(targets))
    if unknown:
        raise ValueError(f"no ssh target for node(s) {unknown}")
    if parallel < 1:
        raise ValueError("parallel must be >= 1")
    pool = ThreadPoolExecutor(max_workers=min(parallel, max(1, len(scripts))))
    futures = {}
    try:
        # Submitted inside the try: a Ctrl-C between two submits must still kill the ssh already started.
        for n, text in scripts.items():
            futures[n] = pool.submit(run_one, targets[n], text, timeout_s)
        return {n: f.result() for n, f in futures.items()}
    except KeyboardInterrupt:
        for f in futures.values():
            f.cancel()
        kill_live()  # the running threads then end at once, and shutdown below does not wait out a deadline
        raise
    finally:
        pool.shutdown(wait=True)


__all__ = ["Target", "Result", "ssh_targets", "run_on_nodes", "run_one", "known_hosts_line", "kill_live"]
