"""`ascend-pd forget-node --stack S NODE`: converge a stack whose node NODE is gone for good.

Why a command: every resource of a node is deleted over SSH to that node (its Commands' delete
scripts, the docker provider's container removal). A machine that is gone fails each of those deletes
after the dial attempts, so the `pulumi up` that takes the node out of the stack fails, and so does
every `up` after it: the stack is wedged on a machine that will never answer.

The Pulumi CLI has no "drop these resources from the state" that keeps their dependents: `pulumi
state delete` refuses while anything depends on them (here: the other nodes' workers on the node's
firewall, the proxy on its launches), and `--target-dependents` drops the dependents too, healthy
nodes' launches and the proxy included. So the order is the other way round, with the engine doing
the work and nothing editing the state file:

1. the operator edits the stack first: NODE removed, or replaced by a node of another name (a spare);
2. `forget-node` checks that NODE really does not answer (SSH port: no connection within the
   timeout, or no route; refused means a machine is there) and refuses otherwise unless forced;
3. it exports the state to a backup file (`pulumi stack export`);
4. it runs `pulumi up --exclude <NODE's resources>`: everything else converges on the new stack
   (the spare prepared and started, the other nodes' firewalls, groups and the proxy updated), and
   the engine leaves NODE's resources alone instead of dialling it; afterwards nothing that stays
   depends on them;
5. it removes exactly NODE's resources with `pulumi state delete` (which checks that nothing depends
   on them any more);
6. it runs `pulumi up` once more: with `--exclude` the engine deletes nothing an excluded resource
   depends on, transitively, its parent included (pkg/resource/deploy/step_generator.go,
   getExcludeDependencies), so what the new stack drops but NODE's resources held stays: a prefill
   group that NODE's proxy listed, the group of an instance that was NODE's alone. With NODE's
   resources gone from the state, this `up` deletes those, on machines that answer;
7. it writes what NODE's resources would have run on deletion into a cleanup script, for the day the
   machine comes back with the old containers, ranks, worker, huge pages and firewall on it.

A node's resources are the ones named `<node>-...` (the program names every resource of a node that
way, and tests/test_forget.py holds every resource's name to the node it connects to); a name that
two node names prefix belongs to the longer one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

# The components that stand for one node (their children are the node's too, and named like it).
NODE_COMPONENTS = frozenset({
    "ascend-pd:index:NodePreflight", "ascend-pd:index:HostFirewall", "ascend-pd:index:NpuContainer",
    "ascend-pd:index:HugepageHost", "ascend-pd:index:YuanrongWorker",
})
NODE_MARK = ("ascend-pd:index:NpuContainer", "-npu")  # every node of a stack has one: its name is <node>-npu
DOCKER_PROVIDER = "pulumi:providers:docker"
COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker of a secret value in an exported state
DEFAULT_CONNECT_TIMEOUT_S = 10.0

Run = Callable[[list[str]], int]  # the pulumi CLI: argv -> exit code (its output goes to the terminal)


class ForgetError(Exception):
    """What stops forget-node before it changed anything, and what to do about it."""


@dataclass(frozen=True)
class StateResource:
    urn: str
    type: str
    name: str
    custom: bool
    inputs: dict[str, Any]

    @classmethod
    def of(cls, doc: dict[str, Any]) -> "StateResource":
        urn = doc["urn"]
        return cls(urn=urn, type=doc.get("type", ""), name=urn.rsplit("::", 1)[-1], custom=bool(doc.get("custom")),
                   inputs=doc.get("inputs") or {})


def state_resources(deployment: dict[str, Any]) -> list[StateResource]:
    """The resources of `pulumi stack export`'s deployment, in its (dependency) order."""
    return [StateResource.of(r) for r in deployment.get("resources") or []]


def state_nodes(resources: list[StateResource]) -> list[str]:
    typ, suffix = NODE_MARK
    return sorted(r.name[: -len(suffix)] for r in resources if r.type == typ and r.name.endswith(suffix))


def owner(name: str, nodes: list[str]) -> Optional[str]:
    """The node a resource name belongs to: the longest node name it starts with, then a dash."""
    best = None
    for n in nodes:
        if name.startswith(n + "-") and (best is None or len(n) > len(best)):
            best = n
    return best


def node_resources(resources: list[StateResource], node: str) -> list[StateResource]:
    """NODE's resources, in state order (every dependency before what depends on it)."""
    nodes = state_nodes(resources)
    return [r for r in resources
            if (r.custom or r.type in NODE_COMPONENTS) and owner(r.name, nodes) == node]


@dataclass(frozen=True)
class Endpoint:
    """Where NODE was reached over SSH when last deployed."""

    user: str
    address: str
    port: int

    def ssh(self) -> str:
        """The ssh command line that reaches it (the cleanup hint)."""
        return "ssh " + (f"-p {self.port} " if self.port != 22 else "") + f"{self.user}@{self.address}"


def node_endpoint(resources: list[StateResource], node: str) -> Endpoint:
    """Where NODE was when last deployed: its docker provider's `ssh://user@host:port`."""
    for r in resources:
        if r.type == DOCKER_PROVIDER and r.name == f"{node}-docker":
            host = r.inputs.get("host")
            if isinstance(host, str) and host.startswith("ssh://"):
                parts = urlsplit(host)
                if parts.hostname:
                    return Endpoint(parts.username or "root", parts.hostname, parts.port or 22)
    raise ForgetError(f"the state has no docker provider `{node}-docker` with an ssh:// host: cannot tell where "
                      f"{node} was (a state written by another program?)")


def answers(address: str, port: int, timeout_s: float) -> Optional[str]:
    """How the machine answered on its SSH port, or None when it did not (timeout, no route)."""
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return f"{address}:{port} accepts connections"
    except ConnectionRefusedError:
        return f"{address}:{port} refuses connections (the machine is up, its sshd is not)"
    except OSError:
        return None


def cleanup_script(resources: list[StateResource], node: str, where: Endpoint) -> tuple[str, list[str]]:
    """A script undoing what NODE's resources set up, for when the machine comes back: each Command's
    delete and `docker rm -f` for its containers, dependents first (the state order reversed). Also
    the names of the Commands whose delete is a secret in the state (left out)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# What ascend-pd deployed on {node} ({where.address}), forgotten by `ascend-pd forget-node` while the",
        "# machine did not answer. Run it on the machine if it comes back, before it serves anything else:",
        f"#   {where.ssh()} bash -s < THIS_FILE",
        "# Each step is the delete Pulumi would have run, in the order it would have run them.",
        "set -u",
        "failed=0",
    ]
    secret = []
    for r in reversed(resources):
        if r.type == COMMAND:
            delete = r.inputs.get("delete")
            if isinstance(delete, dict) and SECRET_SIG in delete:
                secret.append(r.name)
                continue
            if not isinstance(delete, str) or not delete.strip():
                continue
            body = delete
        elif r.type == CONTAINER and isinstance(r.inputs.get("name"), str):
            body = f"docker rm -f {r.inputs['name']}"
        else:
            continue
        lines += [f"echo '--- {r.name}'", "( " + body.rstrip() + "\n) || { echo \"--- " + r.name + ": failed\"; failed=1; }"]
    lines.append('exit "$failed"')
    return "\n".join(lines) + "\n", secret


def default_backup_dir() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "ascend-pd" / "backups"


def pulumi_runner(pulumi: str, cwd: Path) -> Run:
    def run(argv: list[str]) -> int:
        return subprocess.run([pulumi, *argv], cwd=str(cwd)).returncode

    return run


def export_state(pulumi: str, cwd: Path, stack: str) -> dict[str, Any]:
    p = subprocess.run([pulumi, "stack", "export", "--stack", stack], cwd=str(cwd), capture_output=True, text=True)
    if p.returncode != 0:
        raise ForgetError(f"`pulumi stack export --stack {stack}` failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout).get("deployment") or {}


@dataclass
class Forget:
    stack: str
    node: str
    stack_nodes: dict[str, list[str]]  # the edited stack file's nodes: name -> formerNames
    pulumi: str
    cwd: Path
    backup_dir: Path
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    force: bool = False
    dry_run: bool = False
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)

    def check_stack(self) -> None:
        if self.node in self.stack_nodes:
            raise ForgetError(
                f"{self.node} is still a node of the stack file: forget-node converges a stack that no longer has "
                f"it. Edit `ascend-pd:nodes` first: remove {self.node}, or put the machine that replaces it there "
                f"under another name (a spare, or e.g. `{self.node}b`), then run this again.")
        for name, former in self.stack_nodes.items():
            if self.node in former:
                raise ForgetError(
                    f"nodes `{name}` lists {self.node} in formerNames: that makes {name} the same resources as "
                    f"{self.node}, and Pulumi would delete them on the dead machine first. Remove {self.node} from "
                    f"formerNames of {name}, then run this again.")

    def run(self, run: Run, deployment: dict[str, Any]) -> int:
        """Returns the exit code: 0 forgotten (or, dry run, what would be), 1 a Pulumi step failed."""
        resources = state_resources(deployment)
        mine = node_resources(resources, self.node)
        if not mine:
            known = ", ".join(state_nodes(resources)) or "none"
            raise ForgetError(f"stack {self.stack}'s state has no resource of node {self.node} (nodes in the "
                              f"state: {known})")
        where = node_endpoint(resources, self.node)
        address, port = where.address, where.port
        t0 = time.monotonic()
        how = answers(address, port, self.connect_timeout_s)
        if how and not self.force:
            raise ForgetError(f"{self.node} answers ({how}): a node that answers is removed with a plain `pulumi up`, "
                              f"which runs its delete scripts. If the machine is broken anyway and must not be "
                              f"touched, add --force.")
        self.log(f"{self.node} ({address}): " + (f"{how}; forgetting it anyway (--force)" if how else
                                                 f"no answer on port {port} within {self.connect_timeout_s:g} s"))
        urns = [r.urn for r in mine]
        excludes = [a for u in urns for a in ("--exclude", u)]
        if self.dry_run:
            self.log(f"would forget {len(mine)} resources of {self.node}: " + ", ".join(r.name for r in mine))
            self.log("what the up that converges the rest does (pulumi preview with those excluded):")
            return 0 if run(["preview", "--stack", self.stack, "--diff", *excludes]) == 0 else 1
        self.backup_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = self.backup_dir / f"{self.stack}-before-forget-{self.node}-{stamp}.json"
        if run(["stack", "export", "--stack", self.stack, "--file", str(backup)]) != 0 or not backup.is_file():
            self.log("the state could not be exported: nothing was changed")
            return 1
        os.chmod(backup, 0o600)
        self.log(f"state backed up to {backup} (back to it: pulumi stack import --stack {self.stack} --file {backup})")
        t_up = time.monotonic()
        if run(["up", "--stack", self.stack, "--yes", "--skip-preview", *excludes]) != 0:
            self.log(f"`pulumi up` failed: {self.node}'s resources are still in the state (fix what it names and run "
                     f"this again; the backup is {backup})")
            return 1
        up_s = time.monotonic() - t_up
        if run(["state", "delete", "--stack", self.stack, "--yes", *urns]) != 0:
            self.log(f"`pulumi state delete` failed: the rest of the stack is converged; {self.node}'s resources "
                     f"are still in the state (the backup is {backup})")
            return 1
        # What NODE's resources depended on and the new stack drops could not go while they were
        # excluded (step 6 of the module's docstring): one more `up`, and the next preview is clean.
        if run(["up", "--stack", self.stack, "--yes", "--skip-preview"]) != 0:
            self.log(f"{self.node}'s resources are out of the state, but the last `pulumi up` (removing what only "
                     f"held them) failed: run `pulumi up --stack {self.stack}` once what it names is fixed (the "
                     f"backup is {backup})")
            return 1
        script, secret = cleanup_script(mine, self.node, where)
        cleanup = self.backup_dir / f"{self.stack}-cleanup-{self.node}-{stamp}.sh"
        cleanup.write_text(script)
        os.chmod(cleanup, 0o700)
        print(f"forgot {len(mine)} resources of {self.node} ({address}) in stack {self.stack}: "
              + ", ".join(r.name for r in mine))
        print(f"the rest of the stack converged with `pulumi up` in {up_s:.0f} s ({time.monotonic() - t0:.0f} s "
              f"in all); the next `pulumi preview` shows no change")
        print(f"should {self.node} ever come back, clean it before anything else: "
              f"{where.ssh()} bash -s < {cleanup}"
              + (f" (left out, secret in the state: {', '.join(secret)})" if secret else ""))
        return 0


def find_pulumi() -> str:
    found = shutil.which("pulumi")
    if not found:
        raise ForgetError("forget-node runs the Pulumi CLI: `pulumi` is not on PATH (install it, or run from the "
                          "environment you run `pulumi up` from)")
    return found


__all__ = ["Forget", "ForgetError", "StateResource", "answers", "cleanup_script", "default_backup_dir",
           "export_state", "find_pulumi", "Endpoint", "node_endpoint", "node_resources", "owner", "pulumi_runner",
           "state_nodes", "state_resources"]
