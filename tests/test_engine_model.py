"""The engine model (ascend_pd/engine/model.py) on the program's own graphs under the SDK's mocks:
which steps a change produces, in what order, what state a run leaves, how long a deploy takes.
The scenarios that run these steps for real are tests/integration/test_scenarios.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
from pulumi_harness import COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, PROJECT, run_program, stack_config, with_host_keys

from ascend_pd.engine.capture import Graph
from ascend_pd.engine.model import (CREATE, DELETE, DELETE_REPLACED, REPLACE, SAME, UPDATE, execute, plan_destroy,
                                    plan_up, simulate)
from ascend_pd.engine.timing import first_deploy, launch_gangs, smallest_parallel, step_seconds
from ascend_pd.loader import load_config
from ascend_pd.plan import build_plan

STACKS = ("a2-8node", "a3-4node")


def edited(stack: str, key: str, edit) -> dict[str, str]:
    raw = stack_config(stack)
    obj = json.loads(raw[f"{PROJECT}:{key}"]) if f"{PROJECT}:{key}" in raw else {}
    obj = edit(obj) or obj
    raw[f"{PROJECT}:{key}"] = json.dumps(obj) if not isinstance(obj, str) else obj
    return raw


def graph(stack: str, raw: dict | None = None) -> Graph:
    return run_program(raw or stack_config(stack), stack=stack)


def acting(steps) -> list[tuple[str, str]]:
    return [(s.op, s.name) for s in steps if s.acts]


@pytest.fixture(scope="module")
def base() -> dict[str, Graph]:
    return {s: graph(s) for s in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_no_change_is_all_sames(base, stack):
    steps = plan_up(base[stack].regs, graph(stack))
    assert {s.op for s in steps} == {SAME}
    assert len(steps) == len(base[stack].regs)


@pytest.mark.parametrize("stack", STACKS)
def test_first_up_creates_everything_in_dependency_order(base, stack):
    steps = plan_up([], base[stack])
    assert {s.op for s in steps} == {CREATE}
    index = {s.urn: i for i, s in enumerate(steps)}
    for i, s in enumerate(steps):
        for dep in s.reg.dependencies:
            assert index[dep] in s.after, (s.name, dep)
            assert index[dep] < i


def test_a_tuning_flag_updates_the_launches_of_its_role_only(base):
    raw = edited("a2-8node", "decode", lambda d: d["flags"].update({"max-num-seqs": 99}))
    steps = plan_up(base["a2-8node"].regs, graph("a2-8node", raw))
    assert set(acting(steps)) == {(UPDATE, f"d{i}-launch") for i in range(4)}
    assert all(s.why == ("create",) for s in steps if s.op == UPDATE)


def test_a_prefill_image_that_replaces_the_etcd_nodes_container_reruns_every_worker(base):
    """etcd runs in p0's container, p0 is a prefill node: a new prefill image replaces etcd (empty
    again) with it. The decode nodes' workers, running on, are updated after the new etcd (their
    create follows etcd's id), and each restarts into it, having joined the old one: measured on
    the real engine, before they followed etcd they stayed unregistered."""
    raw = edited("a2-8node", "prefill", lambda d: d.update(image="quay.io/ascend/vllm-ascend:v0.20.2rc1-rebuild"))
    steps = plan_up(base["a2-8node"].regs, graph("a2-8node", raw))
    ops = acting(steps)
    assert (REPLACE, "p0-etcd") in ops
    at = {(s.op, s.name): i for i, s in enumerate(steps)}
    for d in ("d0", "d1", "d2", "d3"):
        assert (UPDATE, f"{d}-worker") in ops
        assert at[(REPLACE, "p0-etcd")] in steps[at[(UPDATE, f"{d}-worker")]].after
        assert not [op for op, n in ops if n == f"{d}-launch"]  # decode serves on


def test_an_identity_setting_replaces_old_delete_first(base):
    raw = edited("a3-4node", "stateDir", lambda _: "/workspace/apd-2")
    steps = plan_up(base["a3-4node"].regs, graph("a3-4node", raw))
    ops = acting(steps)
    replaced = {n for op, n in ops if op == REPLACE}
    container_commands = {r.name for r in base["a3-4node"].of_type(COMMAND) if "docker exec" in r.inputs["create"]}
    assert replaced == container_commands  # every script that keeps files under stateDir
    for name in replaced:
        assert ops.index((DELETE_REPLACED, name)) < ops.index((REPLACE, name)), name
    # A new worker starts only once the new etcd is up (it registers there).
    assert ops.index((REPLACE, "p0-etcd")) < ops.index((REPLACE, "p1-worker"))
    assert not {n for op, n in ops if n.endswith(("-container", "-image", "-nr-hugepages"))}


def test_a_removed_node_is_deleted_after_everything_else(base):
    raw = edited("a2-8node", "prefill", lambda p: p.update(nodes=["p0", "p2", "p3"]))
    steps = plan_up(base["a2-8node"].regs, graph("a2-8node", raw))
    deletes = [i for i, s in enumerate(steps) if s.op == DELETE]
    assert [steps[i].name for i in deletes if steps[i].acts] == ["p1-launch"]
    for i in deletes:
        assert steps[i].phase == "final"
        assert all(j in steps[i].after for j, s in enumerate(steps) if s.phase == "main")


def test_a_renamed_node_with_its_former_name_keeps_every_resource(base):
    def rename(nodes):
        nodes[3].update(name="p3x", formerNames=["p3"])

    raw = edited("a2-8node", "nodes", rename)
    raw[f"{PROJECT}:prefill"] = json.dumps({**json.loads(raw[f"{PROJECT}:prefill"]), "nodes": ["p0", "p1", "p2", "p3x"]})
    raw = with_host_keys(raw)
    steps = plan_up(base["a2-8node"].regs, graph("a2-8node", raw))
    ops = acting(steps)
    assert {op for op, _ in ops} == {UPDATE}, ops  # scripts name the node: updated, nothing replaced
    assert {n for _, n in ops} == {"p3x-launch", "p3x-worker", "p3x-probes", "p3x-install-yuanrong", "p3x-nr-hugepages", "p3x-firewall",
                                   "p3x-preflight"}
    # Without the former name every p3 resource is new, and the old ones go at the very end.
    raw2 = dict(raw, **{f"{PROJECT}:nodes": json.dumps(
        [{k: v for k, v in n.items() if k != "formerNames"} for n in json.loads(raw[f"{PROJECT}:nodes"])])})
    ops2 = acting(plan_up(base["a2-8node"].regs, graph("a2-8node", raw2)))
    assert (CREATE, "p3x-container") in ops2 and (DELETE, "p3-container") in ops2
    assert ops2.index((CREATE, "p3x-container")) < ops2.index((DELETE, "p3-container"))


def test_destroy_deletes_dependents_first(base):
    g = base["a3-4node"]
    steps = plan_destroy(g.regs)
    assert {s.op for s in steps} == {DELETE} and len(steps) == len(g.regs)
    index = {s.urn: i for i, s in enumerate(steps)}
    for r in g.regs:
        for dep in r.dependencies:
            assert index[r.urn] in steps[index[dep]].after, (r.name, "before", dep)
    ops = acting(steps)
    assert ops.index((DELETE, "p0-proxy")) < ops.index((DELETE, "p0-launch")) < ops.index((DELETE, "p0-worker")) \
        < ops.index((DELETE, "p0-etcd")) < ops.index((DELETE, "p0-container"))


def test_execute_respects_order_parallelism_and_stops_after_a_failure(base):
    g = base["a2-8node"]
    steps = plan_up([], g)
    lock, running, peak, done = threading.Lock(), [0], [0], []

    def act(step):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            for i in step.after:
                assert steps[i].name in done or not steps[i].acts, (step.name, steps[i].name)
        time.sleep(0.002)
        with lock:
            running[0] -= 1
            done.append(step.name)

    out = execute([], steps, act, parallel=3, goal_order=[r.urn for r in g.regs])
    assert out.ok and peak[0] <= 3
    assert {r.urn for r in out.state} == {r.urn for r in g.regs}

    # A failing update: no new step starts after it; the failed update keeps its old record.
    raw = edited("a2-8node", "decode", lambda d: d["flags"].update({"max-num-seqs": 99}))
    steps = plan_up(out.state, graph("a2-8node", raw))

    def failing(step):
        if step.name == "d1-launch":
            raise RuntimeError("rank died")

    result = execute(out.state, steps, failing, parallel=1, goal_order=[r.urn for r in g.regs])
    failed = {steps[i].name for i in result.failed}
    assert failed == {"d1-launch"}
    record = {r.name: r for r in result.state}["d1-launch"]
    assert record is next(r for r in out.state if r.name == "d1-launch")  # old inputs kept
    assert result.skipped  # the proxy's and the other launches' steps did not start


def test_simulated_time(base):
    g = base["a2-8node"]
    steps = plan_up([], g)
    serial = simulate(steps, step_seconds, parallel=1)
    assert serial.makespan_s == pytest.approx(sum(step_seconds(s) for s in steps if s.acts))
    wide = simulate(steps, step_seconds, parallel=1000)
    assert wide.makespan_s == pytest.approx(wide.critical_path_s) and wide.ratio == pytest.approx(1.0)
    assert wide.critical_path[-1] == "p0-proxy" and any(n.endswith("-image") for n in wide.critical_path)
    # The 4-node decode group's launches finish together; fewer slots than its nodes stall it.
    gangs = launch_gangs(steps, g)
    assert [sorted(steps[i].name for i in gang) for gang in gangs] == [["d0-launch", "d1-launch", "d2-launch", "d3-launch"]]
    assert simulate(steps, step_seconds, parallel=3, gangs=gangs).stalled


def sixteen_nodes() -> dict[str, str]:
    """a2-8node doubled: 8 one-node prefill instances, two 4-node decode groups."""
    raw = stack_config("a2-8node")
    nodes = [{"name": f"p{i}", "address": f"192.0.2.{10 + i}", "nic": "eth0"} for i in range(8)]
    nodes += [{"name": f"d{i}", "address": f"192.0.2.{30 + i}", "nic": "eth0"} for i in range(8)]
    raw[f"{PROJECT}:nodes"] = json.dumps(nodes)
    for role, names in (("prefill", [f"p{i}" for i in range(8)]), ("decode", [f"d{i}" for i in range(8)])):
        raw[f"{PROJECT}:{role}"] = json.dumps({**json.loads(raw[f"{PROJECT}:{role}"]), "nodes": names})
    return with_host_keys(raw)


@pytest.mark.parametrize("name", ["a2-8node", "a3-4node", "synthetic-16node"])
def test_the_readmes_parallelism_keeps_the_deploy_on_its_critical_path(base, name):
    """`pulumi up --parallel <2 x nodes>` (what render prints and the README says): the first
    deploy's makespan within 1.1 x its critical path, no DP group stalled."""
    raw = sixteen_nodes() if name == "synthetic-16node" else stack_config(name)
    stack = "a2-8node" if name == "synthetic-16node" else name
    g = base.get(name) or graph(stack, raw)
    plan = build_plan(load_config({k.split(":", 1)[1]: v for k, v in raw.items()}), stack)
    t = first_deploy(g, parallel=plan.up_parallelism)
    print(f"{name}: --parallel {plan.up_parallelism}: makespan {t.makespan_s:.0f}s, critical path "
          f"{t.critical_path_s:.0f}s, ratio {t.ratio:.3f}; smallest within 1.1: {smallest_parallel(g)}")
    assert not t.stalled and t.ratio <= 1.1
    assert plan.up_parallelism >= smallest_parallel(g)


def test_the_cli_default_on_a_small_machine_is_not_enough_for_sixteen_nodes():
    """The CLI's default, 4 x CPUs, is 8 on a 2-CPU runner: the 16 image pulls then go in two waves."""
    t = first_deploy(graph("a2-8node", sixteen_nodes()), parallel=8)
    assert t.ratio > 1.5


def test_every_custom_resource_type_has_a_duration(base):
    for g in base.values():
        for s in plan_up([], g):
            if s.acts and s.reg.type in (COMMAND, CONTAINER):
                assert step_seconds(s) > 0, s.name


@pytest.mark.parametrize("stack", STACKS)
def test_no_replacement_forces_out_anothers_dependents(base, stack):
    """A resource that two deleteBeforeReplace replacements force out is deleted in the chain of
    the first, while the engine runs the second chain (which deletes the other root) in parallel:
    the delete of a launch can find its container already gone. So no Command may depend (through
    a property) on anything of another node: even replacing every container at once forces each
    resource out exactly once, through its own node's container."""
    raw = edited(stack, "container", lambda c: c.update(image=c["image"] + "-rebuild"))
    steps = plan_up(base[stack].regs, graph(stack, raw))
    forced = {}
    for s in steps:
        if s.op == DELETE_REPLACED and s.why and s.why[0].endswith(" is replaced"):
            root = s.why[0].split(" ", 1)[0]
            forced.setdefault(s.name, set()).add(root)
    assert forced
    for name, roots in forced.items():
        assert roots == {f"{name.split('-', 1)[0]}-container"}, (name, roots)


def test_a_multi_node_group_of_which_one_launch_changes_is_no_stalled_gang(base):
    """A rename (with `formerNames`) of one decode node updates that node's launch only: the group's
    unchanged launches run no step and are no gang members, so the run finishes (it was "never":
    the gang waited for members that never start)."""
    def rename(nodes):
        nodes[7].update(name="d3x", formerNames=["d3"])

    raw = edited("a2-8node", "nodes", rename)
    raw[f"{PROJECT}:decode"] = json.dumps({**json.loads(raw[f"{PROJECT}:decode"]), "nodes": ["d0", "d1", "d2", "d3x"]})
    g = graph("a2-8node", with_host_keys(raw))
    steps = plan_up(base["a2-8node"].regs, g)
    gangs = launch_gangs(steps, g)
    assert all(steps[i].acts for gang in gangs for i in gang)
    t = simulate(steps, step_seconds, parallel=16, gangs=gangs)
    assert not t.stalled and t.makespan_s < float("inf")
    # Even a gang handed a member that takes no time completes (it holds no slot to wait in).
    sames = [i for i, s in enumerate(steps) if s.name.endswith("-launch") and not s.acts]
    launch = next(i for i, s in enumerate(steps) if s.name == "d3x-launch")
    assert not simulate(steps, step_seconds, parallel=16, gangs=[set(sames) | {launch}]).stalled


# ---------------------------------------------------------------------------------------------
# The docker rules: pulumi-docker 5.1.0 = terraform-provider-docker 4.5.0 (engine/model.py).


def with_inputs(g: Graph, resource: str, changes: dict) -> Graph:
    """`g` with some inputs of `resource` changed (a key set to None is removed)."""
    def edit(r):
        if r.name != resource:
            return r
        inputs = {**r.inputs, **changes}
        return dataclasses.replace(r, inputs={k: v for k, v in inputs.items() if v is not None})

    return Graph(regs=[edit(r) for r in g.regs])


def op_of(steps, name: str) -> list[str]:
    return [s.op for s in steps if s.name == name]


@pytest.mark.parametrize("change, replaces", [
    # Updated in place by provider 4.5.0 (no ForceNew): ContainerUpdate, ContainerStart or the state only.
    ({"restart": "always"}, False),
    ({"mustRun": False}, False),
    ({"init": False}, False),
    ({"memory": 4096}, False),
    ({"destroyGraceSeconds": 30}, False),
    # New in 4.x and not ForceNew: 3.9 had no such attribute (the 3.9 rules replaced the container).
    ({"deviceReadBps": [{"path": "/dev/sda", "rate": 1048576}]}, False),
    ({"deviceWriteIops": [{"path": "/dev/sda", "rate": 100}]}, False),
    # ForceNew in 4.5.0, as in 3.9: `devices` and every field of it, and the other `docker run` options.
    ({"devices": [{"hostPath": "/dev/davinci_manager", "containerPath": "/dev/davinci_manager", "permissions": "rw"}]},
     True),
    ({"shmSize": 1024}, True),
    ({"tty": False}, True),
    ({"stdinOpen": False}, True),
    ({"envs": ["A=1"]}, True),
    ({"entrypoints": ["sh"]}, True),
    ({"workingDir": "/tmp"}, True),
    ({"privileged": False}, True),
    ({"networkMode": "bridge"}, True),
    ({"labels": [{"label": "x", "value": "y"}]}, True),
    ({"platform": "linux/arm64"}, True),  # new in 4.x, ForceNew
    ({"deviceRequests": [{"driver": "cdi", "deviceIds": ["vendor.com/npu=all"]}]}, True),  # new in 4.x, ForceNew
])
def test_a_container_change_updates_or_replaces_as_provider_4_5_does(base, change, replaces):
    g = base["a3-4node"]
    steps = plan_up(g.regs, with_inputs(g, "p0-container", change))
    ops = op_of(steps, "p0-container")
    if replaces:
        # Delete first (the program's delete_before_replace, and the provider's own default).
        assert ops == [DELETE_REPLACED, REPLACE], ops
        assert next(s for s in steps if s.op == REPLACE and s.name == "p0-container").why == tuple(sorted(change))
    else:
        assert ops == [UPDATE], ops
        assert {s.name for s in steps if s.acts and s.op != SAME} == {"p0-container"}


@pytest.mark.parametrize("change, replaces", [
    ({"keepLocally": False}, False),
    ({"forceRemove": True}, False),
    ({"name": "quay.io/ascend/vllm-ascend:v9"}, True),
    ({"platform": "linux/arm64"}, True),
    ({"triggers": {"digest": "sha256:1"}}, True),
    ({"pullTriggers": ["sha256:1"]}, True),
])
def test_an_image_change_updates_or_replaces_as_provider_4_5_does(base, change, replaces):
    g = base["a3-4node"]
    steps = plan_up(g.regs, with_inputs(g, "p0-image", change))
    ops = op_of(steps, "p0-image")
    if replaces:
        # Create before delete: the old image goes at the very end (and stays: keepLocally).
        assert ops == [REPLACE, DELETE_REPLACED], ops
        assert [s.phase for s in steps if s.name == "p0-image"] == ["main", "final"]
        assert op_of(steps, "p0-container") == [DELETE_REPLACED, REPLACE]  # its image id changes
    else:
        assert ops == [UPDATE], ops
        assert op_of(steps, "p0-container") == [SAME]


def test_a_readdressed_node_updates_its_docker_provider_and_its_container_goes_through_the_new_host(base):
    """The provider's `host` changes: DiffConfig of pulumi-docker 5.1.0 (bridge 3.133.0) replaces a
    provider only for a config field marked ForcesProviderReplace, and none is: an update. Its
    resources keep their provider, so the image is not pulled again; the container is replaced by
    its address label alone, and the delete of the old container runs after the provider update
    (through the new host)."""
    def readdress(nodes):
        nodes[0]["address"] = "192.0.2.99"

    g = base["a3-4node"]
    node = json.loads(stack_config("a3-4node")[f"{PROJECT}:nodes"])[0]["name"]
    steps = plan_up(g.regs, graph("a3-4node", edited("a3-4node", "nodes", readdress)))
    provider = next(i for i, s in enumerate(steps) if s.name == f"{node}-docker")
    assert steps[provider].type == DOCKER_PROVIDER and steps[provider].op == UPDATE
    assert steps[provider].why == ("host",) and not steps[provider].acts
    assert op_of(steps, f"{node}-image") == [SAME]
    old_container = next(i for i, s in enumerate(steps) if s.name == f"{node}-container" and s.op == DELETE_REPLACED)
    assert steps[old_container].why == ("labels",)
    assert provider in steps[old_container].after
    # Without the label nothing of the container would change: the provider update alone replaces nothing.
    unlabelled = plan_up(with_inputs(g, f"{node}-container", {"labels": None}).regs,
                         with_inputs(graph("a3-4node", edited("a3-4node", "nodes", readdress)),
                                     f"{node}-container", {"labels": None}))
    assert op_of(unlabelled, f"{node}-container") == [SAME]
    assert op_of(unlabelled, f"{node}-docker") == [UPDATE]


def test_a_container_without_the_option_is_still_replaced_delete_first(base):
    """pulumi-docker asks for delete-before-replace on every docker_container; an explicit
    delete_before_replace (True or False) overrides it, an unset one does not."""
    g = base["a3-4node"]
    assert all(r.delete_before_replace and r.delete_before_replace_defined for r in g.of_type(CONTAINER))

    def option(value, defined):
        return Graph(regs=[dataclasses.replace(r, delete_before_replace=value, delete_before_replace_defined=defined)
                           if r.name == "p0-container" else r for r in g.regs])

    for value, defined, expect in ((False, False, [DELETE_REPLACED, REPLACE]),
                                   (False, True, [REPLACE, DELETE_REPLACED])):
        state = option(value, defined)
        steps = plan_up(state.regs, with_inputs(state, "p0-container", {"shmSize": 1024}))
        assert op_of(steps, "p0-container") == expect, (value, defined)
    # An image has no such default: unset, it is replaced create-first.
    assert not any(r.delete_before_replace for r in g.of_type(IMAGE))
