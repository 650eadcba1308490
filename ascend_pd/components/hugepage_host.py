"""HugepageHost: vm.nr_hugepages on one node (host script, not in a container)."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan
from ascend_pd.shell import Script

from .preflight import NodePreflight
from .transport import host_command


class HugepageHost(pulumi.ComponentResource):
    """Reserves the node's huge pages for the openYuanrong worker; restores the previous count on
    delete. Independent of the container: it only has to be done before the worker starts.

    Per: node, when `hugepages` is set
    Runs: on the host: pages = GiB / `Hugepagesize` from `/proc/meminfo`; verifies `HugePages_Total`,
      fails with `MemAvailable` and restores the old count if the kernel gave fewer; persists in
      `/etc/sysctl.d`
    """

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        node: NodePlan,
        gib: int,
        conn: remote.ConnectionArgs,
        script: Script,
        preflight: Optional[NodePreflight] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:HugepageHost", name, None, opts)
        self.command = host_command(f"{node.name}-nr-hugepages", address=node.address, conn=conn, script=script,
                                    parent=self, aliases=node.names_of("nr-hugepages"),
                                    depends_on=[preflight.command] if preflight else [])
        self.register_outputs({"node": node.name, "gib": gib, "stdout": self.command.stdout})
