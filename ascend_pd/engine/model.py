"""The steps a `pulumi up` (or `destroy`) runs to take a stack from the state of its last run to the
graph the program registers now, and the order it runs them in.

It is a model of the engine (diff and the fast tests run it where no CLI and no cluster are), written
from the engine's source
(pkg/resource/deploy/step_generator.go, pulumi 3.259.0) and the providers' schemas (pulumi-command
1.2.1; pulumi-docker 5.1.0 = terraform-provider-docker 4.5.0, bridged by pulumi-terraform-bridge
3.133.0). The rules it applies:

* A registration whose URN (or one of its aliases) is in the state is diffed against it; otherwise
  it is a **create**.
* A diff is an **update** unless a changed property forces a **replacement**: `triggers` of a
  `command:remote:Command` (pulumi-command marks it replace-on-change), any property of a docker
  Container outside the few the provider updates in place (restart, mustRun, init, the device
  throttles, ...), a docker image's name, platform or triggers, and anything named in the
  resource's `replaceOnChanges`. An update of a Command runs its `create` again (no `update`
  command is set); its `delete` does not run. A change to a docker Provider's inputs (`host`,
  `sshOpts`) **updates** the provider, never replaces it (the bridge's DiffConfig replaces only
  for config fields marked ForcesProviderReplace, and pulumi-docker marks none): its resources keep
  their provider reference, so nothing is replaced for it, and every later step through that
  provider, the deletes of old containers included, reaches the NEW host (if that is another
  machine, the old container is not found there, which the 4.5.0 delete takes as done, and it
  stays behind on the old machine).
* An input that depends (a property dependency) on a resource being replaced counts as changed: the
  new resource's outputs differ. `dependsOn` alone never propagates a change.
* A replacement is delete-before-replace when the resource says so (`deleteBeforeReplace`), or,
  when the resource leaves the option unset, when the provider asks for it: pulumi-docker does for
  every Container.
* A delete-before-replace replacement first deletes, in reverse dependency order, every
  dependent that the replacement forces out (transitively, through property dependencies that
  force a replacement of the dependent), then the old resource, then creates the new one; the
  dependents are created again when the program registers them. Otherwise the new one is created
  first and the old one is deleted at the end.
* Resources no longer registered, and the old halves of create-before-delete replacements, are
  deleted **after every create, update and replacement of the run has succeeded**, dependents
  first, each with the inputs recorded in the state (a Command's SSH connection is one of them; a
  docker resource's daemon is its provider's current `host`).
* A step starts once the steps of the resources it depends on (and its parent) have finished; at
  most `parallel` steps run at once (the CLI's default is 4 x the operator's CPUs). After a failed
  step no new step starts; steps already running finish; no delete of the final phase runs.
* `destroy` deletes everything, dependents first.

`plan_up` and `plan_destroy` compute the steps; `execute` runs them against an `act` callback with
the engine's scheduling and returns the state the engine would record; `simulate` runs them on a
clock with per-step durations (the makespan of a deploy against its critical path).
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from .capture import COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, Graph, Reg, plain

# Properties of a docker_container that terraform-provider-docker 4.5.0 (pulumi-docker 5.1.0) updates
# in place: the top-level attributes of internal/provider/resource_docker_container.go without
# ForceNew (and without a ForceNew nested field), by their Pulumi names (as pulumi-docker 5.1.0's
# schema.json spells them; provider/resources.go renames none of these). A change to any other
# input replaces the container.
# Against 3.9 the list gained the four block-IO throttles (device_read_bps, device_read_iops,
# device_write_bps, device_write_iops, lines 693-772), which resourceDockerContainerUpdate applies
# with ContainerUpdate (resource_docker_container_funcs.go:1014-1018); `devices` (line 663, each
# field ForceNew) still replaces. Of the rest the update acts on restart, max_retry_count, memory*,
# cpu_shares, cpu_set and must_run false->true (a ContainerStart, line 997); the others (init, tmpfs,
# healthcheck, rm, cpu_period, cpu_quota, ...) change only the state, not the running container.
CONTAINER_IN_PLACE = frozenset({
    "rm", "start", "wait", "waitTimeout", "attach", "logs", "mustRun", "restart", "maxRetryCount",
    "removeVolumes", "tmpfs", "deviceReadBps", "deviceReadIops", "deviceWriteBps", "deviceWriteIops",
    "destroyGraceSeconds", "memory", "memoryReservation", "memorySwap", "cpuShares", "cpuSet", "healthcheck",
    "containerReadRefreshTimeoutMilliseconds", "init", "cpuPeriod", "cpuQuota",
})
# docker_image (RemoteImage), terraform-provider-docker 4.5.0 resource_docker_image.go: name (line 36),
# pull_triggers (61), triggers (84) and platform (90) are ForceNew, as in 3.9; keep_locally and
# force_remove update in place. (`build` is not ForceNew itself but most of its fields are; the
# program builds nothing, so the model leaves it out.)
IMAGE_REPLACING = frozenset({"name", "triggers", "pullTriggers", "platform"})
# Resource types whose provider asks for delete-before-replace when the resource leaves the option
# unset: pulumi-docker 5.1.0 provider/resources.go:114 (`DeleteBeforeReplace: true` on
# docker_container), which the bridge returns with every replacing diff (pulumi-terraform-bridge
# 3.133.0 pkg/tfbridge/provider.go:1253); the engine lets a set option override it
# (step_generator.go:2044-2047).
PROVIDER_DELETE_FIRST = frozenset({CONTAINER})
# pulumi-command: `triggers` replaces; every other input (create, delete, connection, ...) updates.
COMMAND_REPLACING = frozenset({"triggers"})

# Step kinds, as the CLI names them.
CREATE, UPDATE, SAME = "create", "update", "same"
REPLACE = "create-replacement"  # the new half of a replacement
DELETE_REPLACED = "delete-replaced"  # the old half (before the new one with deleteBeforeReplace)
DELETE = "delete"  # a resource the program no longer registers (or destroy)


@dataclass
class Step:
    op: str
    urn: str
    old: Optional[Reg]  # the state's record (deletes and updates act with it)
    new: Optional[Reg]  # the registration (creates and updates)
    why: tuple[str, ...] = ()  # changed inputs, or the resource whose replacement forced this one
    after: set[int] = field(default_factory=set)  # indices of the steps that must finish first
    phase: str = "main"  # "main" or "final" (the deletes after every create and update)

    @property
    def reg(self) -> Reg:
        return self.new or self.old  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return self.reg.name

    @property
    def type(self) -> str:
        return self.reg.type

    @property
    def acts(self) -> bool:
        """Whether the step does something on a node (components, providers and sames do not)."""
        return self.op != SAME and self.reg.custom and self.reg.type != DOCKER_PROVIDER

    def __str__(self) -> str:
        why = f" ({', '.join(self.why)})" if self.why else ""
        return f"{self.op} {self.name}{why}"


def _alias_urns(reg: Reg) -> list[str]:
    """The URNs `reg` had under its alias names: same parent chain and type, another name."""
    head = reg.urn[: len(reg.urn) - len(reg.name)]
    return [head + a for a in reg.aliases]


def _subst(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, dict):
        return {k: _subst(v, mapping) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_subst(v, mapping) for v in value)
    return value


def _with_ids(reg: Reg, goal_ids: Mapping[str, str], ids: Mapping[str, str]) -> Reg:
    """`reg` with the ids of its dependencies as the engine holds them: the mocks name a resource's
    id after its name, but a resource kept through an alias keeps the id it was created with."""
    mapping = {goal_ids[d]: ids[d] for d in reg.dependencies if d in ids and goal_ids.get(d) and goal_ids[d] != ids[d]}
    return dataclasses.replace(reg, inputs=_subst(reg.inputs, mapping)) if mapping else reg


def _changed(old: Reg, new: Reg, replaced: set[str]) -> set[str]:
    keys = set(old.inputs) | set(new.inputs)
    out = {k for k in keys if plain(old.inputs.get(k)) != plain(new.inputs.get(k))}
    # An input built from a replaced resource's outputs changes with it (its id, its address).
    out |= {k for k, deps in new.property_dependencies.items() if deps & replaced and k in new.inputs}
    return out


def _replacing(reg: Reg, changed: set[str]) -> set[str]:
    """The changed inputs that force `reg` to be replaced."""
    forced = {k.split("[", 1)[0] for k in reg.replace_on_changes}
    if reg.type == COMMAND:
        forced |= COMMAND_REPLACING
    elif reg.type == CONTAINER:
        forced |= {k for k in changed if k not in CONTAINER_IN_PLACE}
    elif reg.type == IMAGE:
        forced |= IMAGE_REPLACING
    return changed & forced if reg.custom else set()


def _delete_first(reg: Reg) -> bool:
    """Whether a replacement of `reg` deletes the old one first (see PROVIDER_DELETE_FIRST)."""
    if reg.delete_before_replace_defined:
        return reg.delete_before_replace
    return reg.delete_before_replace or reg.type in PROVIDER_DELETE_FIRST


def _waits_for(reg: Reg) -> set[str]:
    """URNs whose steps `reg`'s step waits for: its dependencies, its parent, its provider (the
    program registers it only once their registrations have returned)."""
    out = set(reg.dependencies)
    if reg.parent:
        out.add(reg.parent)
    if reg.provider:
        out.add(reg.provider.rsplit("::", 1)[0])
    return out


def _dependency_order(regs: Sequence[Reg]) -> list[Reg]:
    """`regs` ordered so that every resource comes after the ones it depends on (state order is
    registration order, which already is; this keeps it stable and robust to hand-built states)."""
    by_urn = {r.urn: r for r in regs}
    seen: set[str] = set()
    out: list[Reg] = []

    def visit(r: Reg, stack: frozenset[str]) -> None:
        if r.urn in seen or r.urn in stack:
            return
        for d in sorted(_waits_for(r)):
            if d in by_urn:
                visit(by_urn[d], stack | {r.urn})
        seen.add(r.urn)
        out.append(r)

    for r in regs:
        visit(r, frozenset())
    return out


def _dependents(regs: Sequence[Reg]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for r in regs:
        for d in _waits_for(r):
            out[d].add(r.urn)
    return out


def _key(urn: str) -> str:
    """preview.resource_key without the import (preview.py builds on this module)."""
    _, _, chain, name = urn.split("::", 3)
    return f"{chain.split('$', 1)[1] if chain.startswith('pulumi:pulumi:Stack$') else chain}::{name}"


def plan_up(state: Sequence[Reg], goal: Graph, verdicts: Optional[Mapping[str, str]] = None,
            reasons: Optional[Mapping[str, Sequence[str]]] = None) -> list[Step]:
    """The steps of `pulumi up` from `state` (the registrations recorded by the last run) to `goal`.

    `verdicts` (resource key -> `same`, `update`, `replace`, `create`, from a real `pulumi preview`,
    see preview.py) replace the model's own diff of each resource: the engine decides what changes,
    the model how the steps are ordered (dependencies, delete-before-replace, the final deletes)."""
    old_by_urn = {r.urn: r for r in state}
    old_order = _dependency_order(state)
    dependents = _dependents(state)
    steps: list[Step] = []
    step_of: dict[str, int] = {}  # new URN -> the step that makes it ready for its dependents
    matched: set[str] = set()  # old URNs claimed by a registration
    replaced: set[str] = set()  # new URNs being replaced (their outputs change)
    condemned: dict[str, int] = {}  # old URN -> the delete step a deleteBeforeReplace issued
    late_deletes: list[Reg] = []  # old halves of create-before-delete replacements

    def add(step: Step) -> int:
        if step.new is not None:
            # An update or a same keeps the resource and its id; a create or replacement gets a new one.
            keep = step.op in (UPDATE, SAME) and step.old is not None and step.old.id
            ids[step.urn] = step.old.id if keep else step.new.id
            step.new = dataclasses.replace(step.new, id=ids[step.urn])
        steps.append(step)
        return len(steps) - 1

    goal_ids = {r.urn: r.id for r in goal.regs}
    ids: dict[str, str] = {}  # URN -> the id the engine holds for it once this run is done

    for new in goal.regs:
        old = old_by_urn.get(new.urn) or next((old_by_urn[u] for u in _alias_urns(new) if u in old_by_urn), None)
        new = _with_ids(new, goal_ids, ids)
        ready_after = {step_of[d] for d in _waits_for(new) if d in step_of}
        if old is None:
            # A resource the engine's state has and the base does not: what the engine said, acting
            # with the new inputs only (its recorded ones are not known here).
            said = verdicts.get(_key(new.urn), CREATE) if verdicts is not None else CREATE
            op = said if said in (SAME, UPDATE) else CREATE
            step_of[new.urn] = add(Step(op, new.urn, None, new, after=ready_after))
            continue
        matched.add(old.urn)
        if old.urn in condemned:  # deleted by another resource's deleteBeforeReplace: created again
            replaced.add(new.urn)
            step_of[new.urn] = add(Step(REPLACE, new.urn, old, new, why=("dependency replaced",),
                                        after=ready_after | {condemned[old.urn]}))
            continue
        changed = _changed(old, new, replaced)
        if verdicts is not None:  # the engine's verdict; the model's diff only fills in the reasons
            said = verdicts.get(_key(new.urn), SAME)
            why = set((reasons or {}).get(_key(new.urn), ())) or changed or {"the engine's diff"}
            if said == SAME:
                step_of[new.urn] = add(Step(SAME, new.urn, old, new, after=ready_after))
                continue
            if said == UPDATE:
                step_of[new.urn] = add(Step(UPDATE, new.urn, old, new, why=tuple(sorted(why)), after=ready_after))
                continue
            elif said == CREATE:  # the engine does not match it to the state's resource: a new one
                matched.discard(old.urn)
                step_of[new.urn] = add(Step(CREATE, new.urn, None, new, after=ready_after))
                continue
        elif not changed:
            step_of[new.urn] = add(Step(SAME, new.urn, old, new, after=ready_after))
            continue
        forcing = _replacing(new, changed) if verdicts is None else why
        if not forcing:
            step_of[new.urn] = add(Step(UPDATE, new.urn, old, new, why=tuple(sorted(changed)), after=ready_after))
            continue
        replaced.add(new.urn)
        if not _delete_first(new):
            step_of[new.urn] = add(Step(REPLACE, new.urn, old, new, why=tuple(sorted(forcing)), after=ready_after))
            late_deletes.append(old)
            continue
        # Delete before replace: the dependents this replacement forces out go first, dependents of
        # dependents before them; then the old resource; then the new one.
        forced_out = _forced_out(old, old_order, dependents)
        deleted: dict[str, int] = {}
        for dep in reversed(forced_out):
            if dep.urn in condemned:
                continue
            after = ready_after | {deleted[u] for u in dependents.get(dep.urn, ()) if u in deleted}
            deleted[dep.urn] = condemned[dep.urn] = add(
                Step(DELETE_REPLACED, dep.urn, dep, None, why=(f"{old.name} is replaced",), after=after))
        gone = add(Step(DELETE_REPLACED, old.urn, old, None, why=tuple(sorted(forcing)),
                        after=ready_after | set(deleted.values())))
        condemned[old.urn] = gone
        step_of[new.urn] = add(Step(REPLACE, new.urn, old, new, why=tuple(sorted(forcing)),
                                    after=ready_after | {gone}))

    main = set(range(len(steps)))
    final: list[Reg] = [r for r in old_order if r.urn not in matched and r.urn not in condemned] + late_deletes
    final_steps: dict[str, int] = {}
    # Dependents first: walk in reverse dependency order; a delete waits for its dependents' deletes.
    for r in reversed(_dependency_order(final)):
        after = main | {final_steps[u] for u in dependents.get(r.urn, ()) if u in final_steps}
        op = DELETE_REPLACED if r in late_deletes else DELETE
        final_steps[r.urn] = add(Step(op, r.urn, r, None, after=after, phase="final",
                                      why=("replaced",) if op == DELETE_REPLACED else ("no longer registered",)))
    return steps


def _forced_out(root: Reg, old_order: Sequence[Reg], dependents: Mapping[str, set[str]]) -> list[Reg]:
    """The transitive dependents of `root` in the state (dependency order) whose replacement the
    replacement of `root` forces: an input of theirs depends on a replaced resource, and a change of
    that input replaces them (calculateDependentReplacements)."""
    reach: set[str] = set()
    todo = [root.urn]
    while todo:
        for d in dependents.get(todo.pop(), ()):
            if d not in reach:
                reach.add(d)
                todo.append(d)
    out, replace_set = [], {root.urn}
    for r in old_order:
        if r.urn not in reach or not r.custom:
            continue
        touched = {k for k, deps in r.property_dependencies.items() if deps & replace_set and k in r.inputs}
        if _replacing(r, touched):
            out.append(r)
            replace_set.add(r.urn)
    return out


def plan_destroy(state: Sequence[Reg]) -> list[Step]:
    """`pulumi destroy`: every resource, dependents first."""
    order = _dependency_order(state)
    dependents = _dependents(state)
    steps: list[Step] = []
    index: dict[str, int] = {}
    for r in reversed(order):
        index[r.urn] = len(steps)
        steps.append(Step(DELETE, r.urn, r, None, after={index[u] for u in dependents.get(r.urn, ()) if u in index},
                          phase="final"))
    return steps


# ---------------------------------------------------------------------------------------------
# Running the steps


@dataclass
class Outcome:
    """What one run of the steps did: the state the engine records, and per step ok/failed/skipped."""

    state: list[Reg]
    done: list[int]
    failed: dict[int, BaseException]
    skipped: list[int]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.skipped


def _next_state(state: Sequence[Reg], steps: Sequence[Step], done: set[int], goal_order: Sequence[str]) -> list[Reg]:
    """The state after the steps in `done`, applied in step order: successful creates, updates,
    replacements and sames record the registration; successful deletes drop the record; failed or
    skipped steps leave what was there (a failed update keeps the old inputs, a failed create
    leaves nothing). (The engine would also keep the old half of a create-before-delete
    replacement whose final delete did not run; ascend-pd replaces only images that way.)"""
    records: dict[str, Reg] = {r.urn: r for r in state}
    for i in sorted(done):
        s = steps[i]
        if s.op in (DELETE, DELETE_REPLACED):
            if records.get(s.old.urn) is s.old:  # not a replacement recorded since
                del records[s.old.urn]
        else:
            if s.old is not None and s.old.urn != s.new.urn:  # renamed through an alias
                records.pop(s.old.urn, None)
            records[s.new.urn] = s.new
    order = {u: i for i, u in enumerate(goal_order)}
    return sorted(records.values(), key=lambda r: order.get(r.urn, -1))


def execute(state: Sequence[Reg], steps: Sequence[Step], act: Callable[[Step], None], *, parallel: int,
            goal_order: Sequence[str] = ()) -> Outcome:
    """Run `act(step)` for every step, with the engine's scheduling: a step starts when the steps it
    waits for are done, at most `parallel` at once; after a failure no new step starts."""
    if parallel < 1:
        raise ValueError("parallel must be at least 1")
    pending = set(range(len(steps)))
    done: set[int] = set()
    failed: dict[int, BaseException] = {}
    running: dict[Future, int] = {}
    lock = threading.Lock()

    def run(i: int) -> None:
        if steps[i].acts:
            act(steps[i])

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        while True:
            with lock:
                if not failed:
                    ready = sorted(i for i in pending if steps[i].after <= done)
                    for i in ready[: max(0, parallel - len(running))]:
                        pending.discard(i)
                        running[pool.submit(run, i)] = i
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                i = running.pop(fut)
                exc = fut.exception()
                if exc is None:
                    done.add(i)
                else:
                    failed[i] = exc
    skipped = sorted(pending)
    order = list(goal_order) or [r.urn for r in state]
    return Outcome(state=_next_state(state, steps, done, order), done=sorted(done), failed=failed, skipped=skipped)


# ---------------------------------------------------------------------------------------------
# Time


@dataclass(frozen=True)
class Timing:
    makespan_s: float
    critical_path_s: float
    critical_path: tuple[str, ...]  # step names along it
    stalled: tuple[str, ...] = ()  # gang members that never all ran at once (a deadlock)
    # Per step (by index) of the slot simulation: when it started and finished (inf: never ran).
    started_s: tuple[float, ...] = ()
    finished_s: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.critical_path_s if self.critical_path_s else 1.0


def simulate(steps: Sequence[Step], duration: Callable[[Step], float], *, parallel: int,
             gangs: Iterable[Iterable[int]] = ()) -> Timing:
    """The wall time of running `steps` with `parallel` slots, against the critical path (infinite
    slots). `gangs` are sets of steps that can only finish together: the launches of one multi-node
    DP group, whose ranks become healthy only once every rank of the group runs; each holds its
    slot until the last one started, then for its own duration."""
    dur = [0.0 if not s.acts else float(duration(s)) for s in steps]
    gang_of: dict[int, frozenset[int]] = {}
    for g in gangs:
        # Only steps that hold a slot can wait for each other: one that takes no time (or does
        # nothing) is never started as a member, and a gang waiting for it would never complete.
        members = frozenset(i for i in g if dur[i] > 0)
        if len(members) < 2:
            continue
        for i in members:
            gang_of[i] = members

    # Critical path: longest path through `after` (a gang finishes when its slowest member
    # finishes after the last member started).
    finish: dict[int, float] = {}
    via: dict[int, Optional[int]] = {}

    def start_of(i: int) -> float:
        return max((finish_of(j) for j in steps[i].after), default=0.0)

    def finish_of(i: int) -> float:
        if i not in finish:
            members = gang_of.get(i, frozenset({i}))
            begin = max(start_of(j) for j in members)
            for j in members:
                finish[j] = begin + dur[j]
                via[j] = max(steps[j].after, key=finish_of, default=None)
        return finish[i]

    for i in range(len(steps)):
        finish_of(i)
    critical = max(finish.values(), default=0.0)
    last = max(finish, key=finish.get, default=None)
    path: list[str] = []
    while last is not None:
        path.append(steps[last].name)
        last = via.get(last)

    # Makespan: event simulation with `parallel` slots, ready steps in index order (registration).
    # A step is ready when its last prerequisite ends (a count per step, not a scan of every pending
    # step per event: that was quadratic at 256 nodes); the ready ones start lowest index first.
    now, clock = 0.0, []
    free = parallel
    pending = set(range(len(steps)))
    waits_for = [len(set(s.after)) for s in steps]
    dependents: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(steps):
        for j in set(s.after):
            dependents[j].append(i)
    ready = [i for i in pending if waits_for[i] == 0]
    heapq.heapify(ready)
    started: dict[int, float] = {}
    waiting_gang: dict[frozenset[int], set[int]] = defaultdict(set)

    def start_ready() -> None:
        nonlocal free
        while ready and free > 0:
            i = heapq.heappop(ready)
            pending.discard(i)
            if dur[i] == 0:
                heapq.heappush(clock, (now, i))
                continue
            free -= 1
            started[i] = now
            g = gang_of.get(i)
            if g is None:
                heapq.heappush(clock, (now + dur[i], i))
            else:
                waiting_gang[g].add(i)
                if waiting_gang[g] == set(g):
                    for j in g:
                        heapq.heappush(clock, (now + dur[j], j))

    start_ready()
    ended: dict[int, float] = {}
    while clock:
        now, i = heapq.heappop(clock)
        ended[i] = now
        for j in dependents[i]:
            waits_for[j] -= 1
            if waits_for[j] == 0:
                heapq.heappush(ready, j)
        if dur[i] > 0:
            free += 1
        start_ready()
    stalled = tuple(steps[i].name for g, members in waiting_gang.items() if members != set(g) for i in sorted(members))
    stalled += tuple(steps[i].name for i in sorted(pending))
    never = float("inf")
    return Timing(makespan_s=now if not stalled else never, critical_path_s=critical,
                  critical_path=tuple(reversed(path)), stalled=stalled,
                  started_s=tuple(started.get(i, ended.get(i, never)) for i in range(len(steps))),
                  finished_s=tuple(ended.get(i, never) for i in range(len(steps))))


__all__ = ["Step", "Outcome", "Timing", "plan_up", "plan_destroy", "execute", "simulate",
           "CREATE", "UPDATE", "SAME", "REPLACE", "DELETE", "DELETE_REPLACED"]
