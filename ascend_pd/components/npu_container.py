"""NpuContainer: the long-lived NPU container of one node (the seeds' start-docker.sh) and the
preparation steps that run in it once (openYuanrong/etcd installs, pip pins, patches)."""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from ascend_pd.config import DEFAULT_DEVICES, DEFAULT_MOUNTS, Container, Ssh, docker_size_mib
from ascend_pd.plan import NodePlan
from ascend_pd.shell import Locks, Script

from .host_firewall import HostFirewall
from .preflight import NodePreflight
from .transport import ContainerTarget, _aliases, container_command
from .values import DOCKER_SSH_OPTS, container_envs, docker_host, volume_specs

# Container options of the seeds' `docker run` that are not per-cluster settings.
WORKING_DIR = "/home"  # -w /home
ENTRYPOINT = ["bash"]  # --entrypoint=bash with -it: an idle shell keeps the container up
# Docker's default ("no") leaves the container stopped after a reboot or a daemon restart: every
# `docker exec` then fails. The services inside still need `ascend-pd:converge` (README).
RESTART_POLICY = "unless-stopped"
# Read, write, mknod: docker's default for a --device, and what the daemon reports back.
DEVICE_PERMISSIONS = "rwm"
# The label that ties the container to its node's address: a readdressed node is another machine,
# so its container is replaced (labels force a new container).
ADDRESS_LABEL = "ascend-pd.node-address"


class NpuContainer(pulumi.ComponentResource):
    """Docker over SSH to one node: the image (kept on destroy), the container, then the
    preparation steps in order, each after the previous one (a step marked unchained, the etcd
    binary, right after the container).

    Per: node
    Runs: `docker.Provider` over `ssh://`, `RemoteImage` of the node's image (its role's `image`, else
      `container.image`; kept on destroy), the container as the seeds'
      `start-docker.sh` (host network, privileged, devices, driver mounts, `shm_size`, `init`,
      restart `unless-stopped`), then the preparation steps in order (openYuanrong wheel, etcd binary
      on the etcd node, `pip` steps, patch series), and the node's liveness/readiness probes

    pulumi-docker reaches the daemon through the LOCAL `ssh` binary (`docker -H ssh://...`): it
    authenticates with ssh-agent or ~/.ssh/config and checks ~/.ssh/known_hosts. The secret
    `ascend-pd:sshPrivateKey` is deliberately not handed to it (provider inputs are stored in
    plain text), so load the same key into ssh-agent before `pulumi up`.
    """

    target: ContainerTarget
    provider: docker.Provider
    image: docker.RemoteImage
    container: docker.Container
    steps: dict[str, remote.Command]  # preparation steps by script name
    ready: pulumi.Resource  # the last chained preparation step (or the container when there is none)

    def __init__(
        self,
        name: str,
        *,
        node: NodePlan,
        container: Container,
        ssh: Ssh,
        conn: remote.ConnectionArgs,
        prepare: Sequence[Script],
        locks: Locks,
        preflight: Optional[NodePreflight] = None,
        firewall: Optional[HostFirewall] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:NpuContainer", name, None, opts)
        # Nothing of this node is touched (no pull, no container) until its preflight passed.
        after = [preflight.command] if preflight else []
        # Nothing in the container listens before the node's firewall is loaded (the pull may go first).
        guarded = after + ([firewall.command] if firewall else [])

        self.provider = docker.Provider(
            f"{node.name}-docker",
            host=docker_host(ssh.user, node.address, ssh.port),
            ssh_opts=list(DOCKER_SSH_OPTS),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after, aliases=_aliases(node.names_of("docker"))),
        )
        on_node = pulumi.ResourceOptions(parent=self, provider=self.provider)
        self.image = docker.RemoteImage(
            f"{node.name}-image",
            name=node.image,  # its role's image (prefill.image, decode.image) or container.image
            keep_locally=True,  # destroy must not delete a 20 GB image other containers may use
            opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                custom_timeouts=pulumi.CustomTimeouts(create=f"{container.pull_timeout_s}s",
                                                      update=f"{container.pull_timeout_s}s"),
                depends_on=after,
                aliases=_aliases(node.names_of("image")))),
        )
        self.container = docker.Container(
            f"{node.name}-container",
            name=container.name,
            image=self.image.image_id,
            network_mode="host",
            privileged=True,
            shm_size=docker_size_mib(container.shm_size),
            # Written as docker reads it back ("rwm"): a device left without permissions is stored as ""
            # and read as "rwm" by pulumi-docker 4.x on every refresh, and `devices` forces a new
            # container, so every NPU container would be replaced after a `pulumi refresh`.
            devices=[docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions=DEVICE_PERMISSIONS)
                     for d in DEFAULT_DEVICES],
            volumes=[
                docker.ContainerVolumeArgs(host_path=v["host"], container_path=v["container"], read_only=v["read_only"])
                for v in volume_specs(DEFAULT_MOUNTS, container.extra_mounts)
            ],
            working_dir=WORKING_DIR,
            entrypoints=ENTRYPOINT,
            tty=True,
            stdin_open=True,
            # tini as PID 1 reaps rank processes orphaned when their `docker exec` session ends.
            init=True,
            envs=container_envs(container.env),
            labels=[docker.ContainerLabelArgs(label=ADDRESS_LABEL, value=node.address)],
            restart=RESTART_POLICY,
            must_run=True,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.provider,
                # The name is fixed: a second container with it cannot exist next to the first.
                delete_before_replace=True,
                depends_on=guarded,
                aliases=_aliases(node.names_of("container")),
            ),
        )
        self.target = ContainerTarget(address=node.address, connection=conn, name=container.name,
                                      id=self.container.id, locks=locks)

        self.steps = {}
        previous: pulumi.Resource = self.container
        for script in prepare:
            step = container_command(
                f"{node.name}-{script.name}", target=self.target, script=script, parent=self,
                depends_on=[previous if script.chained else self.container], aliases=node.names_of(script.name),
            )
            self.steps[script.name] = step
            if script.chained:
                previous = step
        self.ready = previous

        self.register_outputs({
            "node": node.name,
            "containerId": self.container.id,
            "containerName": self.container.name,
            "imageId": self.image.image_id,
            "prepared": [s.stdout for s in self.steps.values()],
        })
