"""YuanrongWorker: the openYuanrong Datasystem worker of one node (the external KV cache pool)."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import WorkerPlan
from ascend_pd.scripts import Script

from .etcd_single import EtcdSingle
from .hugepage_host import HugepageHost
from .npu_container import NpuContainer
from .transport import container_command


class YuanrongWorker(pulumi.ComponentResource):
    """`dscli start` in the node's container once the container is prepared, etcd is healthy (the
    worker registers there) and the node's huge pages are reserved (if the stack uses them)."""

    command: remote.Command
    address: str

    def __init__(
        self,
        name: str,
        *,
        worker: WorkerPlan,
        npu: NpuContainer,
        etcd: EtcdSingle,
        hugepages: Optional[HugepageHost],
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:YuanrongWorker", name, None, opts)
        self.address = worker.address
        after: list[pulumi.Resource] = [npu.ready, etcd.command]
        if hugepages is not None:
            after.append(hugepages.command)
        self.command = container_command(
            f"{worker.node}-worker", npu=npu, script=script, parent=self, depends_on=after
        )
        self.register_outputs({"node": worker.node, "address": worker.address, "stdout": self.command.stdout})
