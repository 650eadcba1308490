"""deploy(plan): the whole resource graph of a stack, wired from the plan and its scripts.

Start order per node (every arrow is a dependency; nodes proceed independently):

    <node>-container -> <node>-<prepare steps...> --+--> <node>-etcd (etcd node only)
                                                    |
    <node>-nr-hugepages ----------------------------+--> <node>-worker (after etcd too)
                                                          -> <instance>-<node> (launch)
                                                              -> <proxy node>-proxy (after all)

Destroy runs in reverse: proxy, launches, workers, etcd, preparation, container, huge pages.
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi

from ascend_pd import scripts
from ascend_pd.plan import Plan
from ascend_pd.probes import probes

from .etcd_single import EtcdSingle
from .hugepage_host import HugepageHost
from .npu_container import NpuContainer
from .pd_proxy import PdProxy
from .transport import connection, container_command
from .values import rank_rows, smoke_test
from .vllm_dp_group import VllmDpGroup
from .yuanrong_worker import YuanrongWorker


def deploy(plan: Plan, private_key: Optional[pulumi.Input[str]] = None) -> dict[str, Any]:
    """Register every resource of `plan`; return the stack outputs (name -> value)."""
    cfg = plan.cfg
    conns = {n.name: connection(ssh=cfg.ssh, node=n, private_key=private_key) for n in plan.nodes}

    npus: dict[str, NpuContainer] = {}
    hugepages: dict[str, HugepageHost] = {}
    for node in plan.nodes:
        npus[node.name] = NpuContainer(
            f"{node.name}-npu",
            node=node,
            container=cfg.container,
            ssh=cfg.ssh,
            conn=conns[node.name],
            prepare=scripts.prepare(plan, node.name),
        )
        if cfg.hugepages is not None:
            hugepages[node.name] = HugepageHost(
                f"{node.name}-hugepages",
                node=node.name,
                gib=cfg.hugepages.gib,
                conn=conns[node.name],
                script=scripts.hugepages(plan, node.name),
            )

    # Liveness/readiness probes for the operator's monitoring, rendered with the plan's ports and
    # paths; they only read, so they go in as soon as the container exists.
    for node in plan.nodes:
        npu = npus[node.name]
        container_command(f"{node.name}-probes", npu=npu, script=probes(plan, node.name), parent=npu,
                          depends_on=[npu.container])

    etcd = EtcdSingle("etcd", etcd=plan.etcd, npu=npus[plan.etcd.node], script=scripts.etcd(plan))

    workers = {
        node.name: YuanrongWorker(
            f"{node.name}-yuanrong",
            worker=plan.worker(node.name),
            npu=npus[node.name],
            etcd=etcd,
            hugepages=hugepages.get(node.name),
            script=scripts.worker(plan, node.name),
        )
        for node in plan.nodes
    }

    groups = [
        VllmDpGroup(
            inst.name,
            instance=inst,
            launches={node: scripts.launch(plan, inst, node) for node in inst.nodes},
            npus=npus,
            workers=workers,
        )
        for inst in plan.instances
    ]

    proxy = PdProxy("proxy", proxy=plan.proxy, npu=npus[plan.proxy.node], groups=groups, script=scripts.proxy(plan))

    return {
        "proxyUrl": proxy.url,
        "servedModel": cfg.model.served_name,
        "etcdEndpoint": etcd.endpoint,
        "ranks": rank_rows(plan),
        "smokeTest": smoke_test(proxy.url, cfg.model.served_name, cfg.proxy.smoke_timeout_s),
    }
