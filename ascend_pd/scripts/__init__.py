"""Shell text for every node, rendered from the plan: what runs, not how it gets there.

One module per service, each a function `plan -> Script` (create and delete text). Container
scripts run inside the node's NPU container (the components pipe them into `docker exec -i
<container> bash -s`); host scripts run on the node. Every script is strict (`set -euo pipefail`),
idempotent and convergent (a second run with the same text changes nothing; a run with changed text
restarts what changed; a run after a crash restarts what is dead), bounds every wait, and on
failure prints the last lines of the relevant log. Values enter only through `ascend_pd.shell`.
"""

from __future__ import annotations

from ..plan import Plan, restart_bound_s
from ..probes import probes
from ..shell import Locks, Script
from .etcd import etcd
from .firewall import firewall
from .hugepages import hugepages
from .launch import launch
from .preflight import preflight
from .prepare import prepare
from .prometheus import prometheus, prometheus_config, prometheus_reload
from .proxy import proxy
from .worker import worker


def script_locks(plan: Plan) -> Locks:
    """The node containers' script locks (shell.in_container): beside the pid files, and held at most
    as long as the longest legitimate run (a restart: stop, drain, model load, worker restart)."""
    return Locks(plan.run_dir, restart_bound_s(plan.cfg))


def node_scripts(plan: Plan, node: str) -> tuple[Script, ...]:
    """Every script of a node in start order (render, golden files, integration tests)."""
    out: list[Script] = []
    if plan.cfg.preflight.mode != "off":  # before anything else on the node
        out.append(preflight(plan, node))
    if plan.cfg.firewall.enabled:  # before anything of the serving path listens
        out.append(firewall(plan, node))
    if plan.cfg.hugepages:
        out.append(hugepages(plan, node))
    out += prepare(plan, node)
    if node == plan.etcd.node:
        out.append(etcd(plan))
    out.append(worker(plan, node))
    instance = plan.instance_on(node)
    if instance is not None:
        out.append(launch(plan, instance, node))
    if node == plan.proxy.node:
        out.append(proxy(plan))
    out.append(probes(plan, node))
    if node == plan.cfg.monitoring.node:  # Prometheus (monitoring.node), after the proxy
        out += prometheus(plan)
    return tuple(out)


__all__ = ["node_scripts", "script_locks", "firewall", "hugepages", "prepare", "etcd", "worker", "launch", "preflight", "proxy", "probes",
           "prometheus", "prometheus_config", "prometheus_reload", "Script"]
