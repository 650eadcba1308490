"""YuanrongWorker: the openYuanrong Datasystem worker of one node (the external KV cache pool)."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan, WorkerPlan
from ascend_pd.shell import Script

from .etcd_single import EtcdSingle
from .host_firewall import HostFirewall
from .hugepage_host import HugepageHost
from .npu_container import NpuContainer
from .transport import AllOf, container_command


class YuanrongWorker(pulumi.ComponentResource):
    """`dscli start` in the node's container once openYuanrong is installed in it, etcd is healthy
    (the worker registers there) and the node's huge pages are reserved (if the stack uses them).

    Per: node
    Runs: `dscli start -t … -w …` from a fixed directory, waits for the liveness file; a worker killed
      while starting (its own etcd thread can SIGKILL it as it rejoins the pool right after a restart)
      is started again, up to `yuanrong.startAttempts`; any other start failure fails at once with
      dscli's output and the worker log's warnings and errors; a running worker not registered in the
      etcd its script names restarts into it (the create runs again whenever etcd is replaced). Destroy: `dscli stop` bounded by `yuanrong.stopTimeoutS`,
      then kill; removes its data dir and `~/.datasystem`
    """

    command: remote.Command
    address: str

    def __init__(
        self,
        name: str,
        *,
        worker: WorkerPlan,
        node: NodePlan,
        npu: NpuContainer,
        etcd: EtcdSingle,
        hugepages: Optional[HugepageHost],
        script: Script,
        firewalls: AllOf[HostFirewall] = AllOf(),
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:YuanrongWorker", name, None, opts)
        self.address = worker.address
        # The worker needs dscli (install-yuanrong), not the stack's own pip and patch steps: those
        # run while it starts, and the launches wait for both.
        after: list[pulumi.Resource] = [npu.steps.get("install-yuanrong", npu.ready), etcd.command]
        if hugepages is not None:
            after.append(hugepages.command)
        # It reconciles with every other worker at start: every node's firewall must name this node's
        # address first (a readdressed node's worker failed with "Success num: 0" before this).
        after += firewalls.entry
        # A replaced etcd starts empty (its delete removes the data dir): every worker's registration
        # is gone, and a worker left running never registers again. Following etcd's id, each worker's
        # create runs again after a replacement, finds itself unregistered and restarts into the new
        # etcd (measured: a prefill image change that replaced the etcd node's container left every
        # decode worker unregistered before this).
        self.command = container_command(
            f"{worker.node}-worker", target=npu.target, script=script, parent=self, depends_on=after,
            follows=[etcd.command.id], aliases=node.names_of("worker"),
        )
        self.register_outputs({"node": worker.node, "address": worker.address, "stdout": self.command.stdout})
