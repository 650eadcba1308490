"""VllmDpGroup: one vLLM-Ascend data-parallel instance (prefill or decode), possibly multi-node."""

from __future__ import annotations

from typing import Mapping, Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import Instance, NodePlan
from ascend_pd.shell import Script

from .npu_container import NpuContainer
from .transport import container_command, secret_file
from .yuanrong_worker import YuanrongWorker


class VllmDpGroup(pulumi.ComponentResource):
    """One launch Command per node of the instance, each waiting for the workers of the group's
    nodes: every group starts as soon as its nodes are ready, prefill and decode never wait on each
    other, and the nodes of a multi-node group start together. No rank of a group serves before
    every rank has joined, so a node's launch that began before the group's slowest worker was up
    would only spend its `vllm.readyTimeoutS` waiting for a peer whose launch had not started
    (measured: a worker restarted after `docker stop` took 69 s on a loaded machine, and the other
    three nodes' launches ran out their 60 s).

    A node runs at most one instance, so its launch is named by the node (`<node>-launch`): a
    topology change that moves a node to another instance updates that launch instead of creating
    a new one beside the old (whose delete Pulumi would run only at the very end). The name the
    launch had before (`<instance>-<node>`) is an alias.

    A DP group restarts as a whole through its scripts, not through triggers: every rank's command
    fingerprint covers the whole group, so a change anywhere changes every node's launch script
    (an update on every node), and a node's launch keeps running ranks only while the whole group
    answers. No launch has another node's container in its triggers: a resource that two
    deleteBeforeReplace replacements force out at once is deleted by one of them while the other
    already removes its container (the engine runs the two chains in parallel).

    Per: DP instance
    Runs: per node one `<node>-launch` command starting that node's ranks (`setsid nohup env … vllm
      serve …`, each rank's full command literal in the script), waiting until every local rank
      answers `/health` within `vllm.readyTimeoutS`; on a re-run it restarts the whole group when any
      rank's command changed or any rank of the group is down, and first stops any rank the plan no
      longer has on that node
    """

    commands: dict[str, remote.Command]  # by node name

    def __init__(
        self,
        name: str,
        *,
        instance: Instance,
        nodes: Mapping[str, NodePlan],
        launches: Mapping[str, Script],
        npus: Mapping[str, NpuContainer],
        workers: Mapping[str, YuanrongWorker],
        secrets: Optional[tuple[str, pulumi.Output]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        """secrets: (file, content) of the role's secret variables, written on every node of the group
        (`<node>-secrets`) before its launch; a new value replaces the launches (a restart of the group
        as a replaced launch does it: drained, then started), whose triggers carry it encrypted."""
        super().__init__("ascend-pd:index:VllmDpGroup", name, None, opts)
        if set(launches) != set(instance.nodes):
            raise ValueError(f"{instance.name}: launch scripts for {sorted(launches)}, nodes {list(instance.nodes)}")
        self.commands = {}
        self.secrets: dict[str, remote.Command] = {}
        for node in instance.nodes:
            former = [f"{instance.name}-{node}", *nodes[node].names_of("launch")]
            after = [*(workers[n].command for n in instance.nodes), npus[node].ready]
            if secrets is not None:
                self.secrets[node] = secret_file(f"{node}-secrets", target=npus[node].target, path=secrets[0],
                                                 content=secrets[1], parent=self, depends_on=[npus[node].container],
                                                 aliases=nodes[node].names_of("secrets"))
                after.append(self.secrets[node])
            self.commands[node] = container_command(
                f"{node}-launch",
                target=npus[node].target,
                script=launches[node],
                parent=self,
                depends_on=after,
                triggers=[secrets[1]] if secrets is not None else (),
                aliases=former,
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
