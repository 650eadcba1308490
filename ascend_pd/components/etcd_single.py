"""EtcdSingle: the single etcd member the openYuanrong workers register in."""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from ascend_pd.plan import EtcdPlan, NodePlan
from ascend_pd.shell import Script

from .npu_container import NpuContainer
from .npu_container import RESTART_POLICY
from .transport import _aliases, container_command


class EtcdSingle(pulumi.ComponentResource):
    """etcd on the etcd node, health-gated before anything depends on it.

    Per: stack
    Runs: `etcd` with the plan's URLs and data dir, waits for `/health`. Default: the binary, started
      inside the etcd node's NPU container (installed from the release if missing); destroy stops it
      and removes the data dir. With `etcd.image`: a `docker.Container` of its own on that node (host
      network, the same argv as its command, data inside it, so replacing or destroying it discards
      the data), and the `/health` gate runs from the NPU container

    Binary mode (default): `script` starts etcd inside the node's NPU container after that container
    is prepared, and its delete stops etcd and removes the data dir.
    Image mode (`etcd.image`): etcd runs in its own container (host network, the plan's argv as its
    command, data inside it, so replacing or destroying it also discards the data) and `script` is
    the health gate, run from the NPU container.
    """

    command: remote.Command  # what the workers wait for: etcd healthy
    container: Optional[docker.Container]
    endpoint: str

    def __init__(
        self,
        name: str,
        *,
        etcd: EtcdPlan,
        node: NodePlan,
        npu: NpuContainer,
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:EtcdSingle", name, None, opts)
        self.endpoint = etcd.endpoint
        self.container = None
        # Binary mode needs only the etcd binary in the container; image mode only the container
        # (the gate runs curl from it). Neither waits for the other preparation steps.
        depends_on: list[pulumi.Resource] = [npu.steps.get("install-etcd", npu.container)]
        triggers: list[pulumi.Input] = []
        if etcd.image is not None:
            on_node = pulumi.ResourceOptions(parent=self, provider=npu.provider)
            image = docker.RemoteImage(
                f"{etcd.node}-etcd-image", name=etcd.image, keep_locally=True,
                opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                    aliases=_aliases(node.names_of("etcd-image")))))
            self.container = docker.Container(
                f"{etcd.node}-etcd-container",
                name=etcd.container_name,
                image=image.image_id,
                network_mode="host",
                command=list(etcd.argv),
                # The data dir is a tmpfs: every start of the container (a reboot, a docker restart)
                # begins empty, as seed 000's FAQ asks; the workers then register again (converge).
                mounts=[docker.ContainerMountArgs(target=etcd.data_dir, type="tmpfs")],
                restart=RESTART_POLICY,
                must_run=True,
                # The name is fixed: the old container must be gone before the new one is created.
                opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                    delete_before_replace=True, aliases=_aliases(node.names_of("etcd-container")))),
            )
            depends_on.append(self.container)
            triggers.append(self.container.id)
        self.command = container_command(
            f"{etcd.node}-etcd", target=npu.target, script=script, parent=self, depends_on=depends_on,
            triggers=triggers, aliases=node.names_of("etcd"),
        )
        self.register_outputs({
            "node": etcd.node,
            "endpoint": etcd.endpoint,
            "image": etcd.image,
            "stdout": self.command.stdout,
        })
