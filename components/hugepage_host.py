"""HugepageHost: vm.nr_hugepages on one node (host script, not in a container)."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.scripts import Script

from .transport import host_command


class HugepageHost(pulumi.ComponentResource):
    """Reserves the node's huge pages for the openYuanrong worker; restores the previous count on
    delete. Independent of the container: it only has to be done before the worker starts."""

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        node: str,
        gib: int,
        conn: remote.ConnectionArgs,
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:HugepageHost", name, None, opts)
        self.command = host_command(f"{node}-nr-hugepages", conn=conn, script=script, parent=self)
        self.register_outputs({"node": node, "gib": gib, "stdout": self.command.stdout})
