"""How a rendered script reaches a node: SSH (pulumi-command), then `docker exec` for container
scripts. The script text itself comes from ascend_pd.scripts and is passed through untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import pulumi
from pulumi_command import remote

from ascend_pd.config import Ssh
from ascend_pd.plan import NodePlan
from ascend_pd.scripts import Script, in_container, on_host

if TYPE_CHECKING:  # imported for annotations only (npu_container imports this module)
    from .npu_container import NpuContainer


def connection(*, ssh: Ssh, node: NodePlan, private_key: Optional[pulumi.Input[str]]) -> remote.ConnectionArgs:
    """SSH to one node. `private_key` is the secret `ascend-pd:sshPrivateKey` (an Output marked
    secret) or None: pulumi-command then authenticates through ssh-agent ($SSH_AUTH_SOCK).
    A pinned `ascend-pd:ssh.hostKeys.<node>` is verified; without one the host key is not checked.
    pulumi-command stores the whole connection as a secret in the state."""
    return remote.ConnectionArgs(
        host=node.address,
        port=ssh.port,
        user=ssh.user,
        private_key=private_key,
        host_key=ssh.host_keys.get(node.name),
    )


def host_command(
    name: str,
    *,
    conn: remote.ConnectionArgs,
    script: Script,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> remote.Command:
    """A script that runs on the node itself (huge pages)."""
    if script.where != "host":
        raise ValueError(f"{script.name} on {script.node} is a {script.where} script, not a host script")
    return remote.Command(
        name,
        connection=conn,
        create=on_host(script.create),
        delete=on_host(script.delete),
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            # One fixed host: a create-before-delete replacement would let the old delete undo
            # (restore) what the new create just set.
            delete_before_replace=True,
        ),
    )


def container_command(
    name: str,
    *,
    npu: "NpuContainer",
    script: Script,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    triggers: Sequence[pulumi.Input] = (),
) -> remote.Command:
    """A script that runs inside the node's NPU container (`docker exec -i <name> bash -s`).

    triggers=[container.id, *triggers]: a new container (new image, new mounts, ...) starts empty,
    so everything that ran in the old one must run again: the Command is replaced. Extra triggers
    replace it when something else it checks is replaced (the etcd container in image mode).

    delete_before_replace=True: the container name is fixed, so `docker exec <name>` always
    reaches whichever container currently has that name. With Pulumi's default
    create-before-delete replacement the NEW create would run first (in the new container) and
    then the OLD delete would run in that same new container, stopping what was just started.
    Deleting first runs the old delete while the old processes are still the ones there.

    The delete tolerates a missing container (missing_ok=True): when the container is already
    gone, so are the processes the delete would stop.
    """
    if script.where != "container":
        raise ValueError(f"{script.name} on {script.node} is a {script.where} script, not a container script")
    return remote.Command(
        name,
        connection=npu.connection,
        create=in_container(npu.container_name, script.create),
        delete=in_container(npu.container_name, script.delete, missing_ok=True),
        triggers=[npu.container.id, *triggers],
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            delete_before_replace=True,
        ),
    )
