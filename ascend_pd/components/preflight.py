"""NodePreflight: the preflight checks of one node, before anything else runs on it."""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from ascend_pd.plan import NodePlan
from ascend_pd.shell import Script

from .transport import host_command


class NodePreflight(pulumi.ComponentResource):
    """The checks `python -m ascend_pd doctor` runs, on one node, as the first Command there: the
    node's docker provider, image, container, huge pages and so everything in the container wait
    for it. Under `preflight.mode: enforce` a failure stops that node's deploy with the check, the
    reason and the fix; `warn` prints them and goes on; `off` registers no NodePreflight.

    Per: node, unless `preflight.mode` is `off`
    Runs: on the host, read-only: driver/CANN minimum versions, page size, memory for the huge pages,
      clock sync, `npu-smi info` (health, no foreign process), `/etc/hccn.conf` and `hccn_tool` (link,
      health, IP = hccn.conf), ports free, weights present, docker and image or registry, download URLs;
      the stack's own processes (`docker top` of its containers) pass, so a re-run does not fail

    The cross-node checks (clock skew, identical versions and weights, the NPU ping matrix) need
    every node's answers at once: only doctor runs them.
    """

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        node: NodePlan,
        conn: remote.ConnectionArgs,
        script: Script,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:NodePreflight", name, None, opts)
        # Read-only, one create: delete-before-replace (host_command) costs nothing and changes nothing.
        self.command = host_command(f"{node.name}-preflight", address=node.address, conn=conn, script=script,
                                    parent=self, aliases=node.names_of("preflight"))
        self.register_outputs({"node": node.name, "stdout": self.command.stdout})
