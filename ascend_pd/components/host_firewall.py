"""HostFirewall: the node's nftables table (ascend-pd:firewall), before anything of the serving path listens."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan
from ascend_pd.shell import Script

from .preflight import NodePreflight
from .transport import host_command


class HostFirewall(pulumi.ComponentResource):
    """Loads the node's table of ascend-pd's own, atomically; the container (and so every service in
    it) waits for it. A changed address list or port reloads it in place; delete removes the table.

    Per: node, unless `firewall.enabled` is false
    Runs: on the host: `nft -f` of one `inet` table: SSH from anywhere, every port from the cluster's
      nodes, the proxy's port from `firewall.clients`, the ports `status`, the exporter and Prometheus
      read from `firewall.operators`, replies to the node's own connections; everything else dropped
      and counted. The operator's and docker's tables are untouched; and `net.ipv4.tcp_retries2`
      (`firewall.tcpRetries2`): how long a step over SSH may wait on the node once it goes silent
    """

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        node: NodePlan,
        conn: remote.ConnectionArgs,
        script: Script,
        preflight: Optional[NodePreflight] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:HostFirewall", name, None, opts)
        self.command = host_command(f"{node.name}-firewall", address=node.address, conn=conn, script=script,
                                    parent=self, aliases=node.names_of("firewall"),
                                    depends_on=[preflight.command] if preflight else [])
        self.register_outputs({"node": node.name, "stdout": self.command.stdout})
