"""PdProxy: the vLLM-Ascend PD load-balancing proxy in front of every prefill and decode rank."""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan, ProxyPlan
from ascend_pd.shell import Script

from .npu_container import NpuContainer
from .transport import container_command
from .vllm_dp_group import VllmDpGroup


class PdProxy(pulumi.ComponentResource):
    """Starts after every DP group is healthy: its create script waits for /healthcheck to count
    every instance and then runs one chat completion through the whole P/D path.

    Per: stack
    Runs: `load_balance_proxy_server_example.py` on the proxy node's address with every prefill and
      decode rank, waits for `/healthcheck` to count every instance, then one chat completion
    """

    command: remote.Command
    url: str

    def __init__(
        self,
        name: str,
        *,
        proxy: ProxyPlan,
        node: NodePlan,
        npu: NpuContainer,
        groups: Sequence[VllmDpGroup],
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:PdProxy", name, None, opts)
        self.url = proxy.url
        after: list[pulumi.Resource] = [npu.ready]
        after += [cmd for group in groups for cmd in group.commands.values()]
        self.command = container_command(
            f"{proxy.node}-proxy", target=npu.target, script=script, parent=self, depends_on=after,
            aliases=node.names_of("proxy"),
        )
        self.register_outputs({
            "node": proxy.node,
            "url": proxy.url,
            "prefillers": [f"{h}:{p}" for h, p in proxy.prefillers],
            "decoders": [f"{h}:{p}" for h, p in proxy.decoders],
            "stdout": self.command.stdout,
        })
