"""How a rendered script reaches a node: SSH (pulumi-command), then `docker exec` for container
scripts. The script text itself comes from ascend_pd.scripts and is passed through untouched.

Lifecycle rules every Command follows (Pulumi engine and pulumi-command facts, DESIGN.md):
* an input change other than `triggers` is an update, which runs the NEW create only; so whatever
  decides which processes and files a script manages (`Script.identity`, the node address, the
  container) goes into `triggers`: a change is then a replacement, and with
  delete_before_replace=True the OLD delete (old inputs, old connection, from state) runs first;
* a container script holds its lock on the node while it runs (shell.in_container): the script of
  an interrupted `pulumi up` that still runs there and the next run's never overlap;
* `add_previous_output_in_env` is off: sshd refuses those variables on most nodes, which
  pulumi-command reports as one warning per update and delete.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Callable, Generic, Optional, Sequence, TypeVar

import pulumi
from pulumi_command import remote

from ascend_pd.config import Ssh
from ascend_pd.plan import NodePlan
from ascend_pd.shell import Locks, Script, in_container, on_host, q

R = TypeVar("R")


def connection(*, ssh: Ssh, node: NodePlan, private_key: Optional[pulumi.Input[str]]) -> remote.ConnectionArgs:
    """SSH to one node. `private_key` is the secret `ascend-pd:sshPrivateKey` (an Output marked
    secret) or None: pulumi-command then authenticates through ssh-agent ($SSH_AUTH_SOCK).
    A pinned `ascend-pd:ssh.hostKeys.<node>` is verified; without one the host key is not checked.
    The dial settings ride out a node that reboots during `pulumi up`.
    pulumi-command stores the whole connection as a secret in the state."""
    return remote.ConnectionArgs(
        host=node.address,
        port=ssh.port,
        user=ssh.user,
        private_key=private_key,
        host_key=ssh.host_keys.get(node.name),
        dial_error_limit=ssh.dial_error_limit,
        per_dial_timeout=ssh.per_dial_timeout_s,
    )


@dataclass(frozen=True)
class ContainerTarget:
    """Where a container script runs: the node (address, SSH), the container (fixed name, id) and
    where its scripts take their locks."""

    address: str
    connection: remote.ConnectionArgs
    name: str
    id: pulumi.Input[str]
    locks: Locks


class AllOf(Generic[R]):
    """Many resources as one `depends_on` entry (`entry`), built once and given to many dependents: an
    Output whose dependencies are the resources `pick` finds in each and whose value is None, which
    the SDK reads as those dependencies and no resource of its own. The engine receives the same URNs
    as from the list itself (tests/test_graph.py holds it); listed to each of N dependents, the SDK
    resolved N x N entries one by one (every node's worker after every node's firewall: a tenth of
    a 256-node program's run)."""

    def __init__(self, items: Sequence[R] = (), pick: Callable[[R], pulumi.Resource] = lambda r: r) -> None:
        self.entry: list[pulumi.Input[pulumi.Resource]] = (
            [pulumi.Output.all(*(pick(i).urn for i in items)).apply(lambda _: None)] if items else [])


def _aliases(names: Sequence[str]) -> list[pulumi.Alias]:
    return [pulumi.Alias(name=n) for n in names]


def host_command(
    name: str,
    *,
    address: str,
    conn: remote.ConnectionArgs,
    script: Script,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    aliases: Sequence[str] = (),
) -> remote.Command:
    """A script that runs on the node itself (huge pages)."""
    if script.where != "host":
        raise ValueError(f"{script.name} on {script.node} is a {script.where} script, not a host script")
    return remote.Command(
        name,
        connection=conn,
        create=on_host(script.create),
        delete=on_host(script.delete),
        triggers=[address, *script.identity],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            # One fixed host: a create-before-delete replacement would let the old delete undo
            # (restore) what the new create just set.
            delete_before_replace=True,
            aliases=_aliases(aliases),
        ),
    )


def _following(follows: Sequence[pulumi.Input[str]], create: Callable[[str], str]) -> pulumi.Input[str]:
    """create(ids): the create text given the followed resources' ids (one word each)."""
    if not follows:
        return create("")
    return pulumi.Output.all(*follows).apply(lambda ids: create(" ".join(map(str, ids))))


def container_command(
    name: str,
    *,
    target: ContainerTarget,
    script: Script,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    triggers: Sequence[pulumi.Input] = (),
    follows: Sequence[pulumi.Input[str]] = (),
    aliases: Sequence[str] = (),
) -> remote.Command:
    """A script that runs inside the node's NPU container (`docker exec -i <name> bash -s`).

    follows: ids of resources on other nodes whose replacement must run this create again (an
    update, not a replacement: the idempotent script decides what to restart). They go into the
    create (an input built from their outputs) as the script's $ASCEND_PD_FOLLOWS
    (shell.in_container), so that the script can tell a replacement from a re-run.

    triggers: the container id (a new container starts empty, so everything that ran in the old one
    runs again), the node address and the script's identity (see the module docstring), and extra
    triggers from the caller (the etcd a worker registers in; the other containers of a DP group).

    delete_before_replace=True: the container name is fixed, so `docker exec <name>` always
    reaches whichever container currently has that name. With Pulumi's default
    create-before-delete replacement the NEW create would run first (in the new container) and
    then the OLD delete would run in that same new container, stopping what was just started.

    The delete starts a stopped container first and finds nothing to do in a missing one
    (ascend_pd.shell.in_container).
    """
    if script.where != "container":
        raise ValueError(f"{script.name} on {script.node} is a {script.where} script, not a container script")
    lock = target.locks.of(script.name)
    return remote.Command(
        name,
        connection=target.connection,
        create=_following(follows, lambda ids: in_container(target.name, script.create, lock=lock, follows=ids)),
        delete=in_container(target.name, script.delete, lock=lock, delete=True, host_first=script.delete_on_host_first),
        triggers=[target.id, target.address, *script.identity, *triggers],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            delete_before_replace=True,
            aliases=_aliases(aliases),
        ),
    )


def secret_file(
    name: str,
    *,
    target: ContainerTarget,
    path: str,
    content: pulumi.Input[str],
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    aliases: Sequence[str] = (),
) -> remote.Command:
    """A secret written beside the scripts: `content` (a Pulumi secret) goes to the node on the
    Command's stdin and into `path` in the container, mode 0600; neither the create text (what
    `pulumi preview --diff` shows), nor argv, nor the output holds it, and the state keeps it
    encrypted. A new value is an update (the same file written again); the processes that read it
    follow it through their own triggers."""
    write = f"umask 077 && mkdir -p {q(posixpath.dirname(path))} && cat > {q(path + '.part')} && mv {q(path + '.part')} {q(path)}"
    return remote.Command(
        name,
        connection=target.connection,
        create=f"docker exec -i {q(target.name)} sh -c {q(write)} && echo {q('written ' + path)}",
        delete=in_container(target.name, f"rm -f {q(path)}\necho {q('removed ' + path)}\n", lock=None, delete=True),
        stdin=pulumi.Output.secret(content),
        # A new container or path: a replacement, whose old delete removes the old file first.
        triggers=[target.id, target.address, path],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on), delete_before_replace=True,
                                    aliases=_aliases(aliases)),
    )
