"""How long a deploy takes: every step of the engine model given a duration, the makespan at a
given `pulumi up --parallel`, against the critical path (what no parallelism can beat).

The durations are estimates for a real cluster, named here so a reader can argue with them; what
matters is their proportions (an image pull and a model load dwarf everything else). A multi-node
DP group is a gang: its launches finish together, once every one of them runs (vLLM's ranks form
the group only when all are up), so a `--parallel` too small to run a whole group at once stalls
it until `vllm.readyTimeoutS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .capture import COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, Graph, Reg
from .model import Step, Timing, plan_up, simulate

# Estimates, in seconds (a 20-30 GB vLLM-Ascend image over a datacenter link; DeepSeek/GLM weights).
IMAGE_PULL_S = 900.0
CONTAINER_S = 5.0
PREFLIGHT_S = 10.0
HUGEPAGES_S = 30.0  # 500 GiB of 2 MiB pages: the kernel compacts memory
INSTALL_S = 60.0  # the openYuanrong wheel
ETCD_INSTALL_S = 15.0
PIP_STEP_S = 45.0
PATCH_STEP_S = 5.0
ETCD_S = 5.0
WORKER_S = 60.0  # dscli start with 500 GB of shared memory
MODEL_LOAD_S = 1200.0  # every rank of an instance loads and warms up
PROXY_S = 30.0  # /healthcheck, then one chat completion
PROBES_S = 2.0
PROMETHEUS_PULL_S = 60.0  # quay.io/prometheus/prometheus: about 100 MB, not a 20 GB vLLM image
PROMETHEUS_CONFIG_S = 2.0  # a few files written over SSH
PROMETHEUS_RELOAD_S = 10.0  # /-/ready of a fresh container (WAL replay), then POST /-/reload
# A re-run (an update) of a service script whose processes run on with the same command: it checks
# them (health, registration) and exits.
KEPT_S = 5.0
# A delete: stop what the script started (TERM, then KILL after the grace) and clean up. A worker's
# `dscli stop` flushes its shared memory first.
DELETE_S = 10.0
WORKER_DELETE_S = 60.0

# Name suffix of a Command -> its duration (see ascend_pd/components/: `<node>-<suffix>`).
COMMAND_S = (
    ("-preflight", PREFLIGHT_S),
    ("-nr-hugepages", HUGEPAGES_S),
    ("-install-yuanrong", INSTALL_S),
    ("-install-etcd", ETCD_INSTALL_S),
    ("-etcd", ETCD_S),
    ("-worker", WORKER_S),
    ("-launch", MODEL_LOAD_S),
    ("-proxy", PROXY_S),
    ("-probes", PROBES_S),
)
# The children of PrometheusServer (`<node>-prometheus-*`), told by their URN: a node may be named
# `...-prometheus` itself.
PROMETHEUS_PARENT = "ascend-pd:index:PrometheusServer$"


def delete_seconds(step: Step) -> float:
    """A delete step of a change (a replacement's old half, or a removed resource)."""
    if step.reg.type == COMMAND:
        return WORKER_DELETE_S if step.reg.name.endswith("-worker") else DELETE_S
    return step_seconds(step) if step.reg.type == CONTAINER else 0.0


def step_seconds(step: Step, *, model_load_s: float = MODEL_LOAD_S) -> float:
    reg = step.reg
    if PROMETHEUS_PARENT in reg.urn:
        if reg.type == IMAGE:
            return PROMETHEUS_PULL_S
        if reg.type == COMMAND:
            return PROMETHEUS_RELOAD_S if reg.name.endswith("-reload") else PROMETHEUS_CONFIG_S
    if reg.type == IMAGE:
        return IMAGE_PULL_S
    if reg.type == CONTAINER:
        return CONTAINER_S
    if reg.type == COMMAND:
        if reg.name.endswith("-launch"):
            return model_load_s
        for suffix, seconds in COMMAND_S:
            if reg.name.endswith(suffix):
                return seconds
        if "-pip-" in reg.name:
            return PIP_STEP_S
        if "-patches-" in reg.name:
            return PATCH_STEP_S
    if reg.type == DOCKER_PROVIDER or not reg.custom:
        return 0.0
    return CONTAINER_S


def launch_gangs(steps: Sequence[Step], graph: Graph) -> list[set[int]]:
    """The launch steps of each multi-node DP group (children of one VllmDpGroup). Only steps that
    start ranks: a delete of a launch whose group URN lives on (instances renumbered) runs in the
    final phase, after the group's new launches, and is no member of the group; and a launch that
    stays the same (no step runs: its ranks serve on, and the group's restarted ranks join them)
    is no member either: it holds no slot and is never "started" for the gang to wait for."""
    by_parent: dict[str, set[int]] = {}
    for i, s in enumerate(steps):
        if s.new is not None and s.acts and s.reg.type == COMMAND and s.reg.name.endswith("-launch"):
            parent = graph.by_urn(s.reg.parent)
            if parent is not None and parent.type == "ascend-pd:index:VllmDpGroup":
                by_parent.setdefault(parent.urn, set()).add(i)
    return [g for g in by_parent.values() if len(g) > 1]


def first_deploy(graph: Graph, *, parallel: int,
                 seconds: Optional[Callable[[Step], float]] = None) -> Timing:
    """The first `pulumi up` of `graph` (from an empty state) at `--parallel parallel`."""
    steps = plan_up([], graph)
    return simulate(steps, seconds or step_seconds, parallel=parallel, gangs=launch_gangs(steps, graph))


def smallest_parallel(graph: Graph, *, within: float = 1.1) -> int:
    """The smallest `--parallel` whose makespan is within `within` x the critical path."""
    steps = plan_up([], graph)
    gangs = launch_gangs(steps, graph)
    for p in range(1, len(steps) + 1):
        t = simulate(steps, step_seconds, parallel=p, gangs=gangs)
        if not t.stalled and t.ratio <= within:
            return p
    return len(steps)


@dataclass(frozen=True)
class Report:
    stack: str
    nodes: int
    parallel: int
    timing: Timing


__all__ = ["KEPT_S", "MODEL_LOAD_S", "delete_seconds", "first_deploy", "smallest_parallel", "step_seconds", "launch_gangs", "Report", "Reg"]
