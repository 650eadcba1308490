"""VllmDpGroup: one vLLM-Ascend data-parallel instance (prefill or decode), possibly multi-node."""

from __future__ import annotations

from typing import Mapping, Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import Instance
from ascend_pd.scripts import Script

from .npu_container import NpuContainer
from .transport import container_command
from .yuanrong_worker import YuanrongWorker


class VllmDpGroup(pulumi.ComponentResource):
    """One launch Command per node of the instance, each waiting only for its own node's worker:
    every group starts as soon as its nodes are ready, prefill and decode never wait on each
    other, and the nodes of a multi-node group start together (their ranks find each other
    through the DP master within the launch script's deadline)."""

    commands: dict[str, remote.Command]  # by node name

    def __init__(
        self,
        name: str,
        *,
        instance: Instance,
        launches: Mapping[str, Script],
        npus: Mapping[str, NpuContainer],
        workers: Mapping[str, YuanrongWorker],
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:VllmDpGroup", name, None, opts)
        if set(launches) != set(instance.nodes):
            raise ValueError(f"{instance.name}: launch scripts for {sorted(launches)}, nodes {list(instance.nodes)}")
        self.commands = {}
        for node in instance.nodes:
            self.commands[node] = container_command(
                f"{instance.name}-{node}",
                npu=npus[node],
                script=launches[node],
                parent=self,
                depends_on=[workers[node].command],
            )
        self.register_outputs({
            "role": instance.role,
            "nodes": list(instance.nodes),
            "dpSize": instance.dp,
            "tp": instance.tp,
            "dpAddress": instance.dp_address,
            "endpoints": [f"{r.address}:{r.port}" for r in instance.ranks],
            "stdout": {node: cmd.stdout for node, cmd in self.commands.items()},
        })
