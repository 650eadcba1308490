"""Where every log of a stack is, who wrote it, and the `ascend-pd logs ...` line that shows it (pure).

The launch scripts write every log inside the node's NPU container (`stateDir` is a path in the
container, not a bind mount): a rank's stdout and stderr go to `<stateDir>/logs/<rank>.log`
(scripts/launch.py), etcd's to `<stateDir>/logs/etcd.log` (scripts/etcd.py, binary mode), the
proxy's to `<stateDir>/logs/proxy.log` (scripts/proxy.py), the openYuanrong worker's `dscli start`
to `<stateDir>/logs/dscli-start.log` and the worker itself to its glog file under its working
directory (WorkerPlan.log). Only etcd in image mode (`etcd.image`) logs to docker: `docker logs
<etcd container>` on the host.

`pointer_lines` turns a status report into one `ascend-pd logs ...` line per broken thing: what
status, heal and the alerts' runbooks print so that "read the rank's logs" is a command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from .plan import Plan

SERVICES = ("worker", "etcd", "proxy")
PROG = "ascend-pd"


@dataclass(frozen=True)
class Source:
    """One log: `name` is the rank (prefill-0-r1) or service (worker, worker-start, etcd, proxy)."""

    name: str
    kind: str  # rank, worker, etcd, proxy
    node: str
    path: str  # in the container; for docker: the container's name
    docker: bool = False  # `docker logs <path>` on the host (etcd's own container), else a file in the container
    role: str = ""
    instance: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}@{self.node}"


def sources(plan: Plan) -> list[Source]:
    """Every log of the plan, ranks first in the plan's order, then workers, etcd and the proxy."""
    logs = plan.log_dir
    out = [Source(r.name, "rank", r.node, f"{logs}/{r.name}.log", role=r.role, instance=r.instance_name)
           for r in plan.ranks]
    for w in plan.workers:
        out.append(Source("worker", "worker", w.node, w.log))
        out.append(Source("worker-start", "worker", w.node, f"{logs}/dscli-start.log"))
    e = plan.etcd
    out.append(Source("etcd", "etcd", e.node, e.container_name, docker=True) if e.image
               else Source("etcd", "etcd", e.node, f"{logs}/etcd.log"))
    out.append(Source("proxy", "proxy", plan.proxy.node, f"{logs}/proxy.log"))
    return out


class SelectionError(ValueError):
    """A selector names nothing of the plan: the message names the option and the valid values."""


def _check(option: str, values: Sequence[str], known: Iterable[str]) -> None:
    known = list(dict.fromkeys(known))
    for v in values:
        if v not in known:
            raise SelectionError(f"{option} {v}: not in this stack (one of: {', '.join(known)})")


def select(plan: Plan, *, roles: Sequence[str] = (), instances: Sequence[str] = (), ranks: Sequence[str] = (),
           nodes: Sequence[str] = (), services: Sequence[str] = ()) -> list[Source]:
    """The sources the selectors name: the union of the rank selectors (--role, --instance, --rank) and
    the services, within --node when given. No selector but --node (or none at all): everything there."""
    _check("--role", roles, ("prefill", "decode"))
    _check("--instance", instances, (i.name for i in plan.instances))
    _check("--rank", ranks, (r.name for r in plan.ranks))
    _check("--node", nodes, (n.name for n in plan.nodes))
    _check("service", services, SERVICES)
    every = sources(plan)
    narrowed = bool(roles or instances or ranks or services)
    chosen = [s for s in every if not narrowed
              or (s.kind == "rank" and (s.role in roles or s.instance in instances or s.name in ranks))
              or (s.kind in services)]
    return [s for s in chosen if not nodes or s.node in nodes]


def logs_command(stack: str, *, rank: str = "", instance: str = "", service: str = "", node: str = "",
                 tail: Optional[int] = None, nodes: Sequence[str] = ()) -> str:
    """The exact command line that shows one thing's logs."""
    argv = [PROG, "logs", "--stack", stack]
    if service:
        argv.append(service)
    if instance:
        argv += ["--instance", instance]
    if rank:
        argv += ["--rank", rank]
    for n in ([node] if node else []) + list(nodes):
        argv += ["--node", n]
    if tail is not None:
        argv += ["--tail", str(tail)]
    return shlex.join(argv)


_STATE_WORDS = {"fail": "down", "hung": "hung", "ok": "failing checks"}


# Each alert's logs (monitoring.py): the labels its series carry, as Prometheus templates.
_RANK, _INSTANCE, _NODE = "{{ $labels.rank }}", "{{ $labels.instance }}", "{{ $labels.node }}"
ALERT_LOGS = {
    "AscendPdRankDown": {"rank": _RANK}, "AscendPdRankHung": {"rank": _RANK},
    "AscendPdDecodeOnlyFallback": {"rank": _RANK}, "AscendPdRequestErrors": {"instance": _INSTANCE},
    "AscendPdKvPoolHitRateDrop": {"service": "worker"}, "AscendPdEtcdDown": {"service": "etcd"},
    "AscendPdEtcdNoLeader": {"service": "etcd"}, "AscendPdNodeExporterDown": {"node": _NODE},
    "AscendPdHugepagesBelowPlan": {"service": "worker", "node": _NODE},
    "AscendPdWorkerMissing": {"service": "worker", "node": _NODE},
    "AscendPdRolloutStuck": {"instance": _INSTANCE}, "AscendPdRolloutFailed": {"instance": _INSTANCE},
    "AscendPdProxyDown": {"service": "proxy"}, "AscendPdSmokeFailing": {"service": "proxy"},
}


def runbook_with_logs(stack: str, alert: str, runbook: str) -> str:
    """An alert's runbook ending in the command that shows the logs of what it is about (unchanged for
    an alert about no log of the stack, e.g. the exporter's own)."""
    sel = ALERT_LOGS.get(alert)
    if sel is None:
        return runbook
    argv = [PROG, "logs", "--stack", stack] + ([sel["service"]] if "service" in sel else []) + [
        x for k in ("instance", "rank", "node") if k in sel for x in (f"--{k}", sel[k])]
    return f"{runbook} Logs: `{' '.join(argv)} --tail 200`."


def pointer_lines(plan: Plan, rep) -> list[str]:
    """`status`'s report -> one line per broken rank, worker, etcd or proxy with the command that shows
    its log. A broken instance with every rank broken is one line (--instance), else one per rank."""
    # A node where nothing answers is one line (its container or the node is down): --node shows all of it.
    down = {n.node: n for n in rep.nodes if n.state == "unreachable"}
    out = [f"everything on {', '.join(down)} (unreachable): {logs_command(plan.stack, nodes=list(down))}"] \
        if down else []
    by_instance: dict[str, list] = {}
    for r in rep.ranks:
        if r.node in down:
            continue
        if r.state != "ok" or not r.ok:
            by_instance.setdefault(f"{r.role}-{r.instance}", []).append(r)
    sizes = {i.name: len(i.ranks) for i in plan.instances}
    for inst, bad in by_instance.items():
        states = ", ".join(dict.fromkeys(_STATE_WORDS.get(r.state, r.state) for r in bad))
        if len(bad) == sizes.get(inst) and len(bad) > 1:
            out.append(f"{inst} ({states}, {len(bad)} ranks): {logs_command(plan.stack, instance=inst)}")
        else:
            out += [f"{r.name} ({_STATE_WORDS.get(r.state, r.state)}) on {r.node}: {logs_command(plan.stack, rank=r.name)}" for r in bad]
    for w in rep.workers:
        if not w.ok and w.node not in down:
            out.append(f"worker on {w.node}: {logs_command(plan.stack, service='worker', node=w.node)}")
    if rep.etcd is not None and not rep.etcd.ok and plan.etcd.node not in down:
        out.append(f"etcd on {plan.etcd.node}: {logs_command(plan.stack, service='etcd')}")
    if rep.proxy is not None and not rep.proxy.ok and plan.proxy.node not in down:
        out.append(f"proxy on {plan.proxy.node}: {logs_command(plan.stack, service='proxy')}")
    return out


def pointer_blocks(plan: Plan, rep) -> list[str]:
    """The LOGS section of status's report (nothing when everything is healthy)."""
    lines = pointer_lines(plan, rep)
    return ["", "LOGS of what is broken"] + [f"  {ln}" for ln in lines] if lines else []


__all__ = ["runbook_with_logs", "ALERT_LOGS", "Source", "SERVICES", "sources", "select", "SelectionError", "logs_command", "pointer_lines",
           "pointer_blocks"]
