"""deploy(plan): the whole resource graph of a stack, wired from the plan and its scripts.

Start order per node (every arrow is a dependency; nodes proceed independently):

    <node>-preflight ----> <node>-docker, <node>-image, <node>-container, <node>-nr-hugepages, <node>-firewall
                           (unless preflight.mode is off; so everything below waits for it)
    <node>-firewall -----> <node>-container (unless firewall.enabled is false: nothing listens before it)
    every node's firewall -> <node>-worker (nothing talks to a peer before the peer's firewall lets it in)
    <node>-container --+--> <node>-install-yuanrong -> <node>-<stack's pip/patch steps...> --+
          |            +--> <etcd node>-install-etcd -> <etcd node>-etcd                      |
          +--> <node>-probes         |                         |                              |
                                     v                         v                              |
    <node>-nr-hugepages -------> <node>-worker (after openYuanrong, etcd, huge pages)         |
                                     +--> <node>-launch (its instance's ranks; after the workers  <-+
                                              of every node of its DP group)
                                              -> <proxy node>-proxy (after every launch)
                                                   -> <mon node>-prometheus-config, -prometheus-image
                                                        -> <mon node>-prometheus-container
                                                             -> <mon node>-prometheus-reload
                                                   (only with monitoring.node: on that node's host and docker)

Nothing waits for what it does not use: the worker starts while the stack's pip and patch steps
run (the launch needs them), etcd needs only its binary. No Command depends on another node's
resources except through etcd (workers), a multi-node group's launches (its nodes' workers) and the
proxy (every launch): see vllm_dp_group.py for why; and Prometheus, which waits for the proxy so that
nothing of the serving path waits for it.

Destroy runs in reverse: Prometheus (its data stays), proxy, launches, workers, etcd, preparation,
container, huge pages.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping, Optional

import pulumi

from ascend_pd import scripts
from ascend_pd.plan import Plan, proxy_key_file, role_secrets_file, secret_env
from ascend_pd.scripts.prometheus import config_files, digest, server

from .etcd_single import EtcdSingle
from .host_firewall import HostFirewall
from .hugepage_host import HugepageHost
from .npu_container import NpuContainer
from .pd_proxy import PdProxy
from .preflight import NodePreflight
from .prometheus_server import PrometheusServer
from .transport import AllOf, connection, container_command
from .values import rank_rows, smoke_test
from .vllm_dp_group import VllmDpGroup
from .yuanrong_worker import YuanrongWorker


def _role_secrets(plan: Plan, role: str, values: Mapping[str, Any]) -> Optional[tuple[str, pulumi.Output]]:
    """(file, content) of a role's secret variables: `NAME='value'` lines, a Pulumi secret. A value the
    program was not given (a model run) is its placeholder."""
    names = secret_env(plan.cfg, role)
    if not names:
        return None
    env = {**plan.cfg.vllm.env, **getattr(plan.cfg, role).env}
    text = "".join(f"{name}={shlex.quote(str(values.get(path, env[name])))}\n" for name, path in names)
    return role_secrets_file(plan.cfg, role), pulumi.Output.secret(text)


def deploy(plan: Plan, private_key: Optional[pulumi.Input[str]] = None, *,
           proxy_key: Optional[pulumi.Input[str]] = None, secret_values: Mapping[str, Any] = {}) -> dict[str, Any]:
    """Register every resource of `plan`; return the stack outputs (name -> value). `proxy_key` and
    `secret_values` (setting path -> value) are what the stack keeps secret (ascend_pd/secrets.py)."""
    cfg = plan.cfg
    conns = {n.name: connection(ssh=cfg.ssh, node=n, private_key=private_key) for n in plan.nodes}

    preflights: dict[str, Optional[NodePreflight]] = {}
    for node in plan.nodes:
        preflights[node.name] = None
        if cfg.preflight.mode != "off":
            preflights[node.name] = NodePreflight(
                f"{node.name}-preflight-gate",  # its Command is <node>-preflight
                opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=n) for n in node.names_of("preflight-gate")]),
                node=node, conn=conns[node.name], script=scripts.preflight(plan, node.name),
            )
    # Every node's firewall names every peer's address. A node's container waits for its own; its
    # worker, the first thing of it that talks to peers (it reconciles with every other worker at start
    # and fails otherwise; launches and the proxy come after it), waits for all of them: a node that
    # joins or changes address is let in everywhere first.
    firewalls: dict[str, HostFirewall] = {}
    if cfg.firewall.enabled:
        firewalls = {node.name: HostFirewall(
            f"{node.name}-host-firewall",  # its Command is <node>-firewall
            opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=n) for n in node.names_of("host-firewall")]),
            node=node, conn=conns[node.name], script=scripts.firewall(plan, node.name), preflight=preflights[node.name],
        ) for node in plan.nodes}

    npus: dict[str, NpuContainer] = {}
    hugepages: dict[str, HugepageHost] = {}
    for node in plan.nodes:
        preflight = preflights[node.name]
        npus[node.name] = NpuContainer(
            f"{node.name}-npu",
            opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=n) for n in node.names_of("npu")]),
            node=node,
            container=cfg.container,
            ssh=cfg.ssh,
            conn=conns[node.name],
            prepare=scripts.prepare(plan, node.name),
            locks=scripts.script_locks(plan),
            preflight=preflight,
            firewall=firewalls.get(node.name),
        )
        if cfg.hugepages is not None:
            hugepages[node.name] = HugepageHost(
                f"{node.name}-hugepages",
                opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=n) for n in node.names_of("hugepages")]),
                node=node,
                gib=cfg.hugepages.gib,
                conn=conns[node.name],
                script=scripts.hugepages(plan, node.name),
                preflight=preflight,
            )

    # Liveness/readiness probes for the operator's monitoring, rendered with the plan's ports and
    # paths; they only read, so they go in as soon as the container exists.
    for node in plan.nodes:
        npu = npus[node.name]
        container_command(f"{node.name}-probes", target=npu.target, script=scripts.probes(plan, node.name),
                          parent=npu, depends_on=[npu.container], aliases=node.names_of("probes"))

    nodes = {n.name: n for n in plan.nodes}
    etcd = EtcdSingle("etcd", etcd=plan.etcd, node=nodes[plan.etcd.node], npu=npus[plan.etcd.node],
                      script=scripts.etcd(plan))

    every_firewall = AllOf(list(firewalls.values()), lambda f: f.command)
    workers = {
        node.name: YuanrongWorker(
            f"{node.name}-yuanrong",
            opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=n) for n in node.names_of("yuanrong")]),
            worker=plan.worker(node.name),
            node=node,
            npu=npus[node.name],
            etcd=etcd,
            hugepages=hugepages.get(node.name),
            firewalls=every_firewall,
            script=scripts.worker(plan, node.name),
        )
        for node in plan.nodes
    }

    role_secrets = {role: _role_secrets(plan, role, secret_values) for role in ("prefill", "decode")}
    groups = [
        VllmDpGroup(
            inst.name,
            instance=inst,
            nodes=nodes,
            launches={node: scripts.launch(plan, inst, node) for node in inst.nodes},
            npus=npus,
            workers=workers,
            secrets=role_secrets[inst.role],
        )
        for inst in plan.instances
    ]

    key_file = proxy_key_file(cfg)
    proxy = PdProxy("proxy", proxy=plan.proxy, node=nodes[plan.proxy.node], npu=npus[plan.proxy.node], groups=groups,
                    script=scripts.proxy(plan),
                    key=(key_file, pulumi.Output.secret(proxy_key)) if key_file and proxy_key is not None else None)

    outputs: dict[str, Any] = {
        "proxyUrl": proxy.url,
        "servedModel": cfg.model.served_name,
        "etcdEndpoint": etcd.endpoint,
        "ranks": rank_rows(plan),
        "smokeTest": smoke_test(proxy.url, cfg.model.served_name, cfg.proxy.smoke_timeout_s),
    }

    prom = server(plan)  # None unless monitoring.node is set: most sites run their own Prometheus
    if prom is not None:
        prometheus = PrometheusServer(
            "prometheus",
            opts=pulumi.ResourceOptions(depends_on=[proxy]),  # after the proxy: see the module docstring
            server=prom, node=nodes[prom.node], npu=npus[prom.node], proxy=proxy, conn=conns[prom.node],
            config=scripts.prometheus_config(plan), reload=scripts.prometheus_reload(plan),
            digest=digest(config_files(plan)),
        )
        outputs["prometheusUrl"] = prometheus.url
    return outputs
