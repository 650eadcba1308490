"""PdProxy: the vLLM-Ascend PD load-balancing proxy in front of every prefill and decode rank."""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan, ProxyPlan
from ascend_pd.shell import Script

from .npu_container import NpuContainer
from .transport import container_command, secret_file
from .vllm_dp_group import VllmDpGroup


class PdProxy(pulumi.ComponentResource):
    """Starts after every DP group is healthy: its create script waits for /healthcheck to count
    every instance and then runs one chat completion through the whole P/D path.

    Per: stack
    Runs: the proxy's key written beside it (`proxy.auth`: a Pulumi secret on the Command's stdin, a 0600
      file), then `load_balance_proxy_server_example.py` through `pd_proxy_launch.py` on the proxy node's
      address with every prefill and decode rank, waits for `/healthcheck` to count every instance, then
      one chat completion
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
        key: Optional[tuple[str, pulumi.Output]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        """key: (file, value) of ascend-pd:proxyApiKey under proxy.auth, written first (`<node>-proxy-key`);
        a new key replaces the proxy (its triggers carry it, encrypted), which reads it at start."""
        super().__init__("ascend-pd:index:PdProxy", name, None, opts)
        self.url = proxy.url
        after: list[pulumi.Resource] = [npu.ready]
        after += [cmd for group in groups for cmd in group.commands.values()]
        self.key = None
        if key is not None:
            self.key = secret_file(f"{proxy.node}-proxy-key", target=npu.target, path=key[0], content=key[1],
                                   parent=self, depends_on=[npu.container], aliases=node.names_of("proxy-key"))
            after.append(self.key)
        self.command = container_command(
            f"{proxy.node}-proxy", target=npu.target, script=script, parent=self, depends_on=after,
            triggers=[key[1]] if key is not None else (), aliases=node.names_of("proxy"),
        )
        self.register_outputs({
            "node": proxy.node,
            "url": proxy.url,
            "prefillers": [f"{h}:{p}" for h, p in proxy.prefillers],
            "decoders": [f"{h}:{p}" for h, p in proxy.decoders],
            "stdout": self.command.stdout,
        })
