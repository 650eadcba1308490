"""What a `pulumi up` does to the service: from the engine model's steps and the scripts behind each
Command, which processes (ranks, workers, etcd, the proxy) start, stop or restart, whether each
role keeps serving, and for about how long.

The rules are the scripts' own:
* an update runs the new create, which restarts exactly the processes whose start fingerprint
  changed (`Script.processes`); a launch does it rolling: at most `rollout.maxUnavailable`
  instances of a role at once, each drained out of the proxy first;
* a replacement runs the old delete (every process of the old script stops) before the new create
  starts them again: no rolling, so every instance it touches is down at once; except a launch's
  (its container replaced: a new image) while the proxy and etcd serve on: its delete drains the
  instance through the same slots, and the new launch gives the slot back once it serves again;
* a delete of the final phase stops the old processes after everything else;
* a worker re-run while etcd restarts (on an empty data dir) finds itself unregistered and restarts;
* Prometheus (`monitoring.node`) is off the serving path: a new configuration is written and reloaded,
  a new image or container setting restarts it, neither touches a served request (a note says which).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..engine.capture import COMMAND, CONTAINER, IMAGE, Graph, Reg, plain
from ..engine.model import CREATE, DELETE, DELETE_REPLACED, REPLACE, SAME, UPDATE, Step, Timing, simulate
from ..engine.timing import KEPT_S, MODEL_LOAD_S, PROMETHEUS_PARENT, delete_seconds, launch_gangs, step_seconds
from ..plan import Plan
from ..scripts import node_scripts
from ..scripts.prometheus import server as prometheus_server
from ..shell import Script

ROLES = ("prefill", "decode")

# What happens to a process, and how.
RESTART, START, STOP = "restart", "start", "stop"
ROLLING, IN_PLACE, REPLACED, AT_END = "rolling", "in place", "replaced (old delete first)", "at the end of the run"


@dataclass(frozen=True)
class Process:
    node: str
    name: str  # "prefill-0-r1", "worker", "etcd", "proxy"
    action: str  # RESTART, START, STOP
    how: str  # ROLLING, IN_PLACE, REPLACED, AT_END
    resource: str  # the resource whose step does it

    @property
    def kind(self) -> str:
        if self.name.startswith(ROLES):
            return "rank"
        return self.name


@dataclass(frozen=True)
class RoleEffect:
    role: str
    instances: int  # in the new plan
    before: int  # instances in the base (0: a new stack, or the base was invalid)
    restarting: tuple[str, ...]  # instances (new names) going down at some point and back
    added: tuple[str, ...]  # instances on nodes that served no instance of this role before
    removed: tuple[str, ...]  # old instances whose nodes serve none of this role any more
    rolling: bool  # restarts go through the launch's slots (updates), not replacements
    max_unavailable: int
    serving: bool  # at least one instance of the role serves at every moment
    duration_s: float  # restarting: rolling -> the whole rollout; outage -> the outage

    @property
    def verdict(self) -> str:
        if not (self.restarting or self.added or self.removed):
            return "unaffected"
        if not self.before:
            return "starts (nothing served before)"
        if not self.restarting:
            return "keeps serving"
        if self.serving:
            return "keeps serving (rolling)" if self.rolling else "keeps serving"
        return "outage"


@dataclass
class Effect:
    processes: list[Process]
    roles: list[RoleEffect]
    notes: list[str] = field(default_factory=list)
    timing: Optional[Timing] = None
    up_s: float = 0.0  # the whole `pulumi up`, engine model plus rolling restarts
    # Why this run will fail, where the model knows it (a provider refuses a step): the processes
    # and roles above are then what happens before the failure, and nothing after it runs.
    fails: list[str] = field(default_factory=list)
    failing_steps: tuple[str, ...] = ()  # the steps that fail (resource names)
    fails_short: list[str] = field(default_factory=list)  # the same, for the report's first line
    endpoint: Optional[tuple[str, str]] = None  # (old, new) `proxyUrl` when the clients' endpoint moves
    mixed_models: bool = False  # `model.path` changes while a role keeps serving: old and new models meet
    # Each side's Commands -> the Script each runs (scripts_by_resource), for the report's nodes and diffs.
    old_scripts: dict[str, Script] = field(default_factory=dict)
    new_scripts: dict[str, Script] = field(default_factory=dict)


def scripts_by_resource(plan: Optional[Plan], graph: Optional[Graph]) -> dict[str, Script]:
    """Each Command of `graph` -> the Script it runs (found by its create text in the Command's)."""
    if plan is None or graph is None:
        return {}
    names = {n.name for n in plan.nodes}
    by_node = {n: node_scripts(plan, n) for n in names}
    out = {}
    for reg in graph.of_type(COMMAND):
        node = _named_node(reg.name, names)
        create = str(plain(reg.inputs.get("create", "")))
        for script in by_node.get(node, ()):
            if script.create in create:
                out[reg.name] = script
                break
    return out


def node_of(step: Step, scripts: Mapping[str, Script], plan: Optional[Plan]) -> str:
    script = scripts.get(step.name)
    if script is not None:
        return script.node
    return (_named_node(step.name, {n.name for n in plan.nodes}) if plan else None) or ""


def _named_node(resource: str, nodes: set[str]) -> Optional[str]:
    """The longest node name `resource` starts with (`<node>-...`; node names may hold '-'): its
    prefixes tried from the longest down, a set lookup each, not a scan of every node per resource."""
    parts = resource.split("-")
    return next((p for p in ("-".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)) if p in nodes), None)


def _events(steps: Sequence[Step], old: Mapping[str, Script], new: Mapping[str, Script],
            etcd_container: tuple[str, str]) -> list[Process]:
    out: list[Process] = []
    stopped_by_replace: set[tuple[str, str]] = set()
    for s in steps:
        if not s.acts:
            continue
        if s.type == CONTAINER and s.name in etcd_container:
            node = (s.new or s.old).name[: -len("-etcd-container")]
            if s.op == CREATE:
                out.append(Process(node, "etcd", START, IN_PLACE, s.name))
            elif s.op == DELETE_REPLACED:
                stopped_by_replace.add((node, "etcd"))
            elif s.op == REPLACE:
                out.append(Process(node, "etcd", RESTART, REPLACED, s.name))
            elif s.op == DELETE:
                out.append(Process(node, "etcd", STOP, AT_END, s.name))
            continue
        if s.type != COMMAND:
            continue
        before = old.get(s.old.name) if s.old is not None else None
        after = new.get(s.new.name) if s.new is not None else None
        if s.op == CREATE and after:
            out += [Process(after.node, p, START, IN_PLACE, s.name) for p, _ in after.processes]
        elif s.op == DELETE_REPLACED and before:
            stopped_by_replace |= {(before.node, p) for p, _ in before.processes}
        elif s.op == REPLACE and after:
            for p, _ in after.processes:
                action = RESTART if (after.node, p) in stopped_by_replace else START
                out.append(Process(after.node, p, action, REPLACED, s.name))
        elif s.op == DELETE and before:
            out += [Process(before.node, p, STOP, AT_END, s.name) for p, _ in before.processes]
        elif s.op == UPDATE and after:
            was = dict(before.processes) if before else {}
            now = dict(after.processes)
            # Only a restart of a rank that keeps its name goes through the rollout slots; a launch
            # stops the ranks its node no longer runs first, undrained, and starts the new ones.
            how = ROLLING if after.name == "launch" else IN_PLACE
            for p, spec in now.items():
                if p not in was:
                    out.append(Process(after.node, p, START, IN_PLACE, s.name))
                elif was[p] != spec:
                    out.append(Process(after.node, p, RESTART, how, s.name))
            out += [Process(after.node, p, STOP, IN_PLACE, s.name) for p in was if p not in now]
    # A process a replacement stopped and another resource starts (etcd moving into its own
    # container and back) restarts; one nothing starts again (its node left) stopped for good.
    started = {(p.node, p.name) for p in out}
    out = [Process(p.node, p.name, RESTART, REPLACED, p.resource)
           if p.action == START and (p.node, p.name) in stopped_by_replace else p for p in out]
    out += [Process(n, p, STOP, REPLACED, "") for n, p in sorted(stopped_by_replace - started)]
    return out


def _worker_follows_etcd(processes: list[Process], steps: Sequence[Step], new: Mapping[str, Script]) -> list[Process]:
    """Workers re-run in this `up` find an etcd that restarted empty: they register again (restart)."""
    if not any(p.name == "etcd" and p.action in (RESTART, START) for p in processes):
        return processes
    moved = {(p.node, p.name) for p in processes}
    extra = []
    for s in steps:
        script = new.get(s.name) if s.new is not None else None
        if s.op == UPDATE and script is not None and script.name == "worker" and (script.node, "worker") not in moved:
            extra.append(Process(script.node, "worker", RESTART, IN_PLACE, s.name))
    return processes + extra


def _drained_replacements(processes: list[Process]) -> list[Process]:
    """Ranks a launch's replacement restarts go through the restart slots (the old delete drains
    them) as long as the proxy that lists them and etcd that holds the slots serve throughout."""
    if any(p.name in ("proxy", "etcd") and p.action in (RESTART, STOP) for p in processes):
        return processes
    return [Process(p.node, p.name, p.action, ROLLING, p.resource)
            if p.kind == "rank" and p.how == REPLACED and p.action == RESTART and p.resource.endswith("-launch") else p
            for p in processes]


def _slots(role: str, old: Optional[Plan], new: Plan, rank_moves: Sequence[Process], steps: Sequence[Step]) -> int:
    """The restart slots the role's restarts take. A replaced launch's old delete drains its instance and
    takes the slot with the old script's `rollout.maxUnavailable` (the engine runs the delete of the
    state), so a value changed in the same `up` counts for those from the next one (measured on the real
    engine: 4 -> 1 beside a prefill image drained all four prefill instances at once). The larger of the
    two bounds how many are out at once."""
    replaced = {s.name for s in steps if s.op == REPLACE}
    if old is not None and any(p.how == ROLLING and p.resource in replaced for p in rank_moves):
        return max(old.max_unavailable(role), new.max_unavailable(role))
    return new.max_unavailable(role)


def _role(role: str, old: Optional[Plan], new: Plan, processes: Sequence[Process], steps: Sequence[Step],
          timing: Timing) -> RoleEffect:
    moved = {p.node for p in processes if p.kind == "rank" and p.name.startswith(role + "-")}
    old_nodes = {n for i in (old.instances_of(role) if old else ()) for n in i.nodes}
    new_nodes = {n for i in new.instances_of(role) for n in i.nodes}
    restarting, added = [], []
    for inst in new.instances_of(role):
        if not moved & set(inst.nodes):
            continue
        (restarting if set(inst.nodes) & old_nodes else added).append(inst.name)
    removed = tuple(i.name for i in (old.instances_of(role) if old else ()) if not set(i.nodes) & new_nodes)
    rank_moves = [p for p in processes if p.kind == "rank" and p.name.startswith(role + "-")
                  and p.node in new_nodes & old_nodes]
    rolling = all(p.how == ROLLING for p in rank_moves)
    slots = _slots(role, old, new, rank_moves, steps)
    kept = len(new.instances_of(role)) - len(restarting) - len(added)
    down_at_once = min(slots, len(restarting)) if rolling else len(restarting)
    serving = not restarting or kept + len(restarting) - down_at_once >= 1
    if not restarting:
        duration = 0.0
    elif rolling:
        waves = -(-len(restarting) // slots)
        duration = (1 if not serving else waves) * MODEL_LOAD_S
    else:
        duration = _outage_window(role, old, steps, timing)
    return RoleEffect(role, len(new.instances_of(role)), len(old.instances_of(role)) if old else 0, tuple(restarting), tuple(added), removed, rolling, slots,
                      serving, duration)


def _outage_window(role: str, old: Optional[Plan], steps: Sequence[Step], timing: Timing) -> float:
    """From the first step that stops a rank of the role to the last that starts one (simulated)."""
    role_nodes = {n for i in (old.instances_of(role) if old else ()) for n in i.nodes}
    first, last = None, None
    for i, s in enumerate(steps):
        if not (s.acts and s.type == COMMAND and s.name.endswith("-launch")):
            continue
        if s.name[: -len("-launch")] not in role_nodes:
            continue
        if s.op == DELETE_REPLACED:
            first = timing.started_s[i] if first is None else min(first, timing.started_s[i])
        if s.op in (REPLACE, UPDATE, CREATE):
            last = timing.finished_s[i] if last is None else max(last, timing.finished_s[i])
    if first is None or last is None:
        return MODEL_LOAD_S
    return max(last - first, MODEL_LOAD_S)


def _host(reg: Reg, graphs: Sequence[Optional[Graph]], state: Mapping[str, Reg]) -> str:
    """The docker host a container is created on: its provider's `host` input."""
    urn = reg.provider.rsplit("::", 1)[0] if reg.provider else ""
    provider = state.get(urn) or next((g.by_urn(urn) for g in graphs if g is not None and g.by_urn(urn)), None)
    return str(plain(provider.inputs.get("host", ""))) if provider is not None else ""


def _container_conflicts(steps: Sequence[Step], old_graph: Optional[Graph], new_graph: Graph
                         ) -> list[tuple[int, str, str]]:
    """Creates of a docker container whose name is still taken on its host when the create runs: an
    old container of that name is deleted only at the end of the run (a node renamed without
    `formerNames`: new resources beside the old). Docker refuses the create (`Conflict. The
    container name ... is already in use`; tests/integration/test_scenarios.py runs it), and the
    engine starts no step after a failure, so the deletes of the end never run either."""
    state = {r.urn: r for r in (old_graph.regs if old_graph else ())}
    late = {}
    for s in steps:
        if s.type == CONTAINER and s.phase == "final" and s.old is not None:
            late[(_host(s.old, [old_graph], state), str(plain(s.old.inputs.get("name", ""))))] = s
    out = []
    for i, s in enumerate(steps):
        if s.type != CONTAINER or s.phase != "main" or s.op not in (CREATE, REPLACE) or s.new is None:
            continue
        key = (_host(s.new, [new_graph, old_graph], state), str(plain(s.new.inputs.get("name", ""))))
        old = late.get(key)
        if old is None or (s.old is not None and s.old.urn == old.old.urn):
            continue
        node_new, node_old = s.name[: -len("-container")], old.name[: -len("-container")]
        address = key[0].split("@", 1)[-1].rsplit(":", 1)[0] if key[0] else "the same host"
        hint = (f"if `{node_new}` is `{node_old}` renamed, add `formerNames: [{node_old}]` to `{node_new}` in "
                "`ascend-pd:nodes` and run `diff` again (its resources are then kept, not created anew)"
                if s.name.endswith("-container") and old.name.endswith("-container") else
                "give the new container another name, or remove the old one first")
        short = (f"`{s.name}`: the container name `{key[1]}` is still in use on {address} ("
                 + (f"add `formerNames: [{node_old}]` to node `{node_new}`" if "formerNames" in hint else "a name conflict")
                 + ")")
        out.append((i, short, f"`{s.name}` creates the container `{key[1]}` on {address} while `{old.name}` of the same "
                       f"name there is deleted only at the end of the run: docker refuses the name (`Conflict. The "
                       f"container name ... is already in use`), the run stops and nothing is stopped or deleted; "
                       f"{hint}"))
    return out


def _before_failure(steps: Sequence[Step], failing: Sequence[int], timing: Timing) -> list[Step]:
    """The steps that run in a run that fails at `failing`: the engine starts none after the first
    failure (steps already running finish) and runs no delete of the end. The acting steps of the
    rest become sames here (so they move no process)."""
    if not failing:
        return list(steps)
    at = min(timing.started_s[i] for i in failing)
    out = []
    for i, s in enumerate(steps):
        runs = s.phase == "main" and i not in failing and timing.started_s[i] <= at
        out.append(s if runs or not s.acts else dataclasses.replace(s, op=SAME))
    return out


# The resources of PrometheusServer: `<monitoring.node>-prometheus-<part>`.
PROMETHEUS_PARTS = ("config", "image", "container", "reload")


def _is_prometheus(step: Step) -> bool:
    """A child of PrometheusServer (by its URN: a node may itself be named `...-prometheus`)."""
    return PROMETHEUS_PARENT in step.urn and step.name.endswith(tuple(f"-prometheus-{p}" for p in PROMETHEUS_PARTS))


def _prometheus_notes(steps: Sequence[Step], old_plan: Optional[Plan], new_plan: Plan) -> list[str]:
    """What a run does to Prometheus on `monitoring.node`, per node it runs (or ran) on: it starts,
    restarts (a new container), reloads (a new configuration, same container) or goes. Never a
    serving impact: nothing of the serving path waits for it."""
    old = prometheus_server(old_plan) if old_plan is not None else None
    new = prometheus_server(new_plan)
    ops: dict[str, dict[str, str]] = {}  # node -> part -> op
    for s in steps:
        if s.acts and _is_prometheus(s):
            node, _, part = s.name.rpartition("-prometheus-")
            ops.setdefault(node, {})[part] = s.op
    out = []
    for node, parts in sorted(ops.items()):
        container, config = parts.get("container"), parts.get("config")
        here = new if new is not None and new.node == node else None
        was = old if old is not None and old.node == node else None
        if container == CREATE and here is not None:
            out.append(f"Prometheus starts on {node} ({here.url}, image {here.image}) after the proxy, data in "
                       f"{here.data_dir}: no serving impact")
        elif container in (DELETE, DELETE_REPLACED) and here is None:
            data = f"its data in {was.data_dir} stays on the node" if was else "its data stays on the node"
            out.append(f"Prometheus on {node} is removed at the end of the run (container and configuration); {data}: "
                       "no serving impact")
        elif container == REPLACE:
            why = (f"image {was.image} -> {here.image}" if was and here and was.image != here.image
                   else "its container settings change")
            also = "; it starts with the new configuration" if config in (UPDATE, REPLACE, CREATE) else ""
            data = f"; its data in {here.data_dir} is kept" if here else ""
            if was and here and was.data_dir != here.data_dir:
                data = (f"; it starts with an empty TSDB in {here.data_dir} ({was.dir}, the history and the old "
                        "configuration, stays on the node, read by nothing: remove it by hand)")
            out.append(f"Prometheus on {node} restarts in a new container ({why}): its UI, API and alert evaluation "
                       f"pause for seconds{data}{also}: no serving impact")
        elif config == REPLACE:  # its triggers hold the files' sha256
            out.append(f"Prometheus on {node} reloads its configuration (rules, alerts or targets changed: the files "
                       "are rewritten, then `POST /-/reload`), no restart: no serving impact")
        elif config == UPDATE or parts.get("reload") in (UPDATE, REPLACE):
            out.append(f"Prometheus on {node}: its configuration (the same files) is written again and reloaded "
                       "(a stopped container is started), no restart: no serving impact")
    return out


def _role_moves(old: Plan, new: Plan) -> list[str]:
    """Nodes that serve another role than before, a spare (no role) included: `x0: spare -> decode`."""
    def roles(plan: Plan) -> dict[str, str]:
        out = {n.name: "spare" for n in plan.nodes}
        out.update({n: i.role for i in plan.instances for n in i.nodes})
        return out

    before, after = roles(old), roles(new)
    moves = [f"{n}: {before[n]} -> {after[n]}" for n in after if n in before and before[n] != after[n]]
    return [f"nodes change roles: {'; '.join(moves)}"] if moves else []


def analyse(steps: Sequence[Step], old_plan: Optional[Plan], new_plan: Plan, old_graph: Optional[Graph],
            new_graph: Graph) -> Effect:
    old = scripts_by_resource(old_plan, old_graph)
    new = scripts_by_resource(new_plan, new_graph)
    etcd_container = tuple(f"{p.etcd.node}-etcd-container" for p in (old_plan, new_plan) if p is not None)
    all_steps = steps
    conflicts = _container_conflicts(steps, old_graph, new_graph)
    if conflicts:
        first = simulate(steps, lambda s: delete_seconds(s) if s.op in (DELETE, DELETE_REPLACED) else step_seconds(s),
                         parallel=new_plan.up_parallelism)
        steps = _before_failure(steps, [i for i, _, _ in conflicts], first)
    processes = _drained_replacements(_worker_follows_etcd(_events(steps, old, new, etcd_container), steps, new))
    moved = {(p.node, p.name) for p in processes}

    def seconds(step: Step) -> float:
        script = new.get(step.name) if step.new is not None else None
        if step.op == UPDATE and script is not None and not any((script.node, n) in moved for n, _ in script.processes):
            return KEPT_S  # its processes run on with the same command: the script checks and exits
        if step.op in (DELETE, DELETE_REPLACED):
            return delete_seconds(step)
        return step_seconds(step)

    timing = simulate(all_steps, seconds, parallel=new_plan.up_parallelism, gangs=launch_gangs(all_steps, new_graph))
    roles = [_role(r, old_plan, new_plan, processes, steps, timing) for r in ROLES]
    notes = [] if old_plan is None else _role_moves(old_plan, new_plan)
    containers = sorted(node_of(s, new, new_plan) for s in steps
                        if s.op == REPLACE and s.type == CONTAINER and s.name not in etcd_container
                        and not _is_prometheus(s))
    pulled = {node_of(s, new, new_plan) for s in steps
              if s.acts and s.type == IMAGE and s.op in (CREATE, REPLACE) and not _is_prometheus(s)}
    if containers:
        with_pull = [n for n in containers if n in pulled]
        notes.append(f"the NPU container is replaced on {', '.join(containers)}: everything in it stops first "
                     "(its deletes)" + (f"; the new image is pulled on {', '.join(with_pull)} before that, while the "
                                        "old container still serves" if with_pull else
                                        "; the image stays (no pull): only the container's settings change"))
    worker_restarts = sorted({p.node for p in processes if p.name == "worker" and p.action == RESTART})
    all_nodes = [n.name for n in new_plan.nodes]
    if any(p.name == "etcd" and p.action == RESTART for p in processes):
        stale = [n for n in all_nodes if (n, "worker") not in moved]
        notes.append("etcd restarts on an empty data dir: the KV cache pool is formed again (cached KV blocks are "
                     "lost: prefix-cache hits start cold)"
                     + (f"; the workers of {', '.join(stale)} do not re-run in this `up` and stay unregistered "
                        "until `ascend-pd:converge`" if stale else ""))
    elif worker_restarts and set(worker_restarts) >= set(all_nodes):
        notes.append("every openYuanrong worker restarts: the KV cache pool is formed again (cached KV blocks are "
                     "lost: prefix-cache hits start cold)")
    elif worker_restarts:
        notes.append(f"the openYuanrong workers of {', '.join(worker_restarts)} restart: the KV cache blocks they "
                     "held are lost (the pool serves on with the others)")
    endpoint = None
    if old_plan is not None and old_plan.proxy.url != new_plan.proxy.url:
        endpoint = (old_plan.proxy.url, new_plan.proxy.url)
    proxy = [p for p in processes if p.name == "proxy"]
    if endpoint is not None and old_plan.proxy.node != new_plan.proxy.node:
        notes.append(f"the proxy moves from {old_plan.proxy.node} to {new_plan.proxy.node}: the new one starts on "
                     f"{new_plan.proxy.node} while the old one serves on until the end of the run; `proxyUrl` (the "
                     f"clients' endpoint) changes from {endpoint[0]} to {endpoint[1]}: point the clients at the new "
                     "one (the old one stops at the end of the run)")
    elif any(p.action in (RESTART, STOP) for p in proxy):
        notes.append("the proxy restarts: no request is served for its restart (seconds)"
                     + (f"; `proxyUrl` (the clients' endpoint) changes from {endpoint[0]} to {endpoint[1]}"
                        if endpoint else ""))
    elif endpoint is not None:
        notes.append(f"`proxyUrl` (the clients' endpoint) changes from {endpoint[0]} to {endpoint[1]}")
    mixed = False
    if old_plan is not None and old_plan.cfg.model.path != new_plan.cfg.model.path:
        mixed = any(r.restarting and r.serving for r in roles)
        if mixed:
            notes.append("`model.path` changes while instances keep serving: during the rollout, prefill instances of "
                         "one model hand their KV cache to decode instances of the other (and the other way round). "
                         "Only weights of the same architecture and KV layout can work together; for another model, "
                         "take the service down for the change (`rollout.maxUnavailable` >= the instances of each "
                         "role) instead of rolling")
    # A role whose restart slots are not the new value's: its replaced launches drain with the old one (_slots).
    late = [r.role for r in roles if r.restarting and r.max_unavailable != new_plan.max_unavailable(r.role)]
    if late:
        notes.append(f"`rollout.maxUnavailable` changes from {old_plan.cfg.rollout.max_unavailable} to "
                     f"{new_plan.cfg.rollout.max_unavailable}, but the replaced launches of {' and '.join(late)} are "
                     f"drained by their old deletes, which take the restart slots with the old value: change "
                     f"`rollout.maxUnavailable` in an `up` of its own first")
    notes += _prometheus_notes(steps, old_plan, new_plan)
    fails = [why for _, _, why in conflicts]
    rollout = max((r.duration_s for r in roles if r.rolling and r.restarting), default=0.0)
    up_s = max(timing.makespan_s, rollout)
    if conflicts:
        up_s = min(timing.started_s[i] for i, _, _ in conflicts)
    return Effect(processes, roles, notes, timing, up_s, fails, tuple(all_steps[i].name for i, _, _ in conflicts),
                  [short for _, short, _ in conflicts], endpoint, mixed, old, new)


__all__ = ["Process", "RoleEffect", "Effect", "analyse", "scripts_by_resource", "node_of",
           "RESTART", "START", "STOP", "ROLLING", "IN_PLACE", "REPLACED", "AT_END"]
