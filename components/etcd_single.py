"""EtcdSingle: the single etcd member the openYuanrong workers register in."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import EtcdPlan
from ascend_pd.scripts import Script

from .npu_container import NpuContainer
from .transport import container_command


class EtcdSingle(pulumi.ComponentResource):
    """etcd inside the etcd node's container, started after that container is prepared."""

    command: remote.Command
    endpoint: str

    def __init__(
        self,
        name: str,
        *,
        etcd: EtcdPlan,
        npu: NpuContainer,
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:EtcdSingle", name, None, opts)
        self.endpoint = etcd.endpoint
        self.command = container_command(
            f"{etcd.node}-etcd", npu=npu, script=script, parent=self, depends_on=[npu.ready]
        )
        self.register_outputs({"node": etcd.node, "endpoint": etcd.endpoint, "stdout": self.command.stdout})
