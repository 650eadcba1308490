"""The resource graph under Pulumi's mocks, with each committed stack loaded as the CLI would.

Every test runs the real `__main__.py` (see pulumi_harness.run_program) and asserts on what the
engine would receive: resource inputs, parents, providers, dependencies and lifecycle options.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter

import pulumi
import pytest
from pulumi.runtime.rpc import is_rpc_secret

from pulumi_harness import (
    COMMAND,
    CONTAINER,
    DOCKER_PROVIDER,
    IMAGE,
    with_host_keys,
    PROJECT,
    Run,
    run_program,
    stack_config,
    stack_output,
    unwrap,
)

from ascend_pd import scripts, shell
from ascend_pd.engine.capture import mock_image_id, plain
from ascend_pd.engine.model import DELETE_REPLACED, REPLACE, SAME, UPDATE, plan_up
from ascend_pd.probes import probes
from ascend_pd.loader import load_config, load_stack
from ascend_pd.plan import build_plan, restart_bound_s
from ascend_pd.program import MODEL_SECRET
from ascend_pd.render import summary

STACKS = ("a2-8node", "a3-4node")
COMPONENT_TYPES = {
    f"ascend-pd:index:{n}"
    for n in ("NodePreflight", "HostFirewall", "NpuContainer", "HugepageHost", "EtcdSingle", "YuanrongWorker",
              "VllmDpGroup", "PdProxy")
}
FAKE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAtestkeyZZZ9\n-----END OPENSSH PRIVATE KEY-----\n"

_BASELINES: dict[str, Run] = {}


def baseline(stack: str) -> Run:
    """One unmodified run per stack, shared by the tests that only read it."""
    if stack not in _BASELINES:
        _BASELINES[stack] = run_program(stack_config(stack), stack=stack)
    return _BASELINES[stack]


def plan_of(stack: str):
    return build_plan(load_stack(stack), stack)


def with_object(stack: str, key: str, edit) -> dict[str, str]:
    """The stack's CLI map with one structured setting edited (as `pulumi config set --path`)."""
    raw = stack_config(stack)
    value = json.loads(raw[f"{PROJECT}:{key}"])
    edit(value)
    raw[f"{PROJECT}:{key}"] = json.dumps(value)
    return raw


# ---------------------------------------------------------------------------------------------
# helpers over a run


def components(run: Run, kind: str):
    return run.of_type(f"ascend-pd:index:{kind}")


def commands_under(run: Run, kind: str):
    """Commands whose parent is a component of `kind`."""
    parents = {c.urn for c in components(run, kind)}
    return [r for r in run.of_type(COMMAND) if r.parent in parents]


def launches(run: Run):
    return [r for r in commands_under(run, "VllmDpGroup") if r.name.endswith("-launch")]


SECRET_FILES = ("-proxy-key", "-secrets")  # the Commands that write a secret beside the scripts (no script)


def script_commands(run: Run):
    """The Commands that run a rendered script (not a secret file)."""
    return [r for r in run.of_type(COMMAND) if not r.name.endswith(SECRET_FILES)]


def node_of_address(plan):
    return {n.address: n.name for n in plan.nodes}


def command_node(plan, reg) -> str:
    return node_of_address(plan)[unwrap(reg.inputs["connection"])["host"]]


def dp_ranks(create: str) -> list[int]:
    return [int(m) for m in re.findall(r"--data-parallel-rank (\d+) ", create)]


# ---------------------------------------------------------------------------------------------
# shape and counts


@pytest.mark.parametrize(
    "stack, nodes, ranks, groups",
    [("a2-8node", 8, 40, {"prefill-0": 2, "prefill-1": 2, "prefill-2": 2, "prefill-3": 2, "decode-0": 32}),
     ("a3-4node", 4, 4, {"prefill-0": 2, "decode-0": 2})],
)
def test_counts(stack, nodes, ranks, groups):
    run = baseline(stack)
    assert len(run.of_type(CONTAINER)) == nodes
    assert len(run.of_type(IMAGE)) == nodes
    assert len(run.of_type(DOCKER_PROVIDER)) == nodes
    assert len(components(run, "NpuContainer")) == nodes
    assert len(components(run, "YuanrongWorker")) == nodes
    assert len(commands_under(run, "YuanrongWorker")) == nodes
    assert len(components(run, "HugepageHost")) == nodes  # both stacks reserve huge pages
    assert len(commands_under(run, "HugepageHost")) == nodes
    assert len(components(run, "HostFirewall")) == nodes and len(commands_under(run, "HostFirewall")) == nodes
    assert len(components(run, "EtcdSingle")) == 1 and len(commands_under(run, "EtcdSingle")) == 1
    assert len(components(run, "PdProxy")) == 1
    assert sorted(c.name for c in commands_under(run, "PdProxy")) == [f"{plan_of(stack).proxy.node}-proxy",
                                                                        f"{plan_of(stack).proxy.node}-proxy-key"]
    assert {g.name for g in components(run, "VllmDpGroup")} == set(groups)

    # Ranks as the launch scripts start them: per group, DP ranks 0..dp-1, each exactly once.
    by_group: dict[str, list[int]] = {}
    for reg in launches(run):
        group = next(g.name for g in components(run, "VllmDpGroup") if g.urn == reg.parent)
        by_group.setdefault(group, []).extend(dp_ranks(reg.inputs["create"]))
    assert {g: sorted(r) for g, r in by_group.items()} == {g: list(range(n)) for g, n in groups.items()}
    assert sum(len(r) for r in by_group.values()) == ranks


@pytest.mark.parametrize("stack", STACKS)
def test_names_types_and_parents(stack):
    run = baseline(stack)
    names = [r.name for r in run.regs]
    assert len(names) == len(set(names)), [n for n, c in Counter(names).items() if c > 1]
    comps = [r for r in run.regs if not r.custom]
    assert comps and {c.type for c in comps} <= COMPONENT_TYPES
    component_urns = {c.urn for c in comps}
    for reg in run.regs:
        if reg.custom:  # every real resource lives inside a component (parent=self)
            assert reg.parent in component_urns, reg.name
        else:  # components sit directly under the stack
            assert reg.parent.endswith(f"::pulumi:pulumi:Stack::{PROJECT}-{stack}"), reg.name
    plan = plan_of(stack)
    for n in plan.nodes:
        for name in (f"{n.name}-container", f"{n.name}-worker", f"{n.name}-docker", f"{n.name}-image"):
            run.named(name)
    for inst in plan.instances:
        for node in inst.nodes:
            launch = run.named(f"{node}-launch")
            # Named by its node (a node runs one instance); the earlier per-instance name is an alias.
            assert f"{inst.name}-{node}" in launch.aliases
    assert run.named("etcd").type == "ascend-pd:index:EtcdSingle"
    assert run.named("proxy").type == "ascend-pd:index:PdProxy"


# ---------------------------------------------------------------------------------------------
# dependencies


@pytest.mark.parametrize("stack", STACKS)
def test_per_node_start_order(stack):
    run, plan = baseline(stack), plan_of(stack)
    etcd = commands_under(run, "EtcdSingle")[0]
    proxy = run.named(f"{plan.proxy.node}-proxy")
    # The proxy's key is written before the proxy starts (proxy.auth), and only then.
    assert run.waits_for(proxy, run.named(f"{plan.proxy.node}-proxy-key"))
    assert not run.waits_for(run.named(f"{plan.proxy.node}-proxy-key"), proxy)
    etcd_node = plan.etcd.node
    assert run.waits_for(etcd, run.named(f"{etcd_node}-container"))
    assert run.waits_for(etcd, run.named(f"{etcd_node}-install-etcd"))
    for n in plan.nodes:
        container = run.named(f"{n.name}-container")
        worker = run.named(f"{n.name}-worker")
        hugepages = run.named(f"{n.name}-nr-hugepages")
        assert run.waits_for(container, run.named(f"{n.name}-image"))
        # Nothing in the container listens before the node's firewall is loaded; the pull need not wait.
        assert run.waits_for(container, run.named(f"{n.name}-firewall"))
        assert not run.waits_for(run.named(f"{n.name}-image"), run.named(f"{n.name}-firewall"))
        # A container waits for its own node's firewall only; the worker, the first thing that talks to
        # peers, waits for every node's (each names this node's address), each a direct dependency of its
        # registration, with the one `AllOf` entry the program gives every worker.
        for other in plan.nodes:
            if other.name != n.name:
                assert not run.waits_for(container, run.named(f"{other.name}-firewall")), (n.name, other.name)
            assert run.named(f"{other.name}-firewall").urn in worker.dependencies, (n.name, other.name)
        launch = run.named(f"{n.name}-launch") if plan.instance_on(n.name) else None
        for step in scripts.prepare(plan, n.name):
            prepared = run.named(f"{n.name}-{step.name}")
            assert run.waits_for(prepared, container)
            if launch is not None:  # vLLM runs with the stack's pip pins and patches
                assert run.waits_for(launch, prepared)
            # The worker needs openYuanrong installed, nothing else: the stack's pip and patch steps
            # run while it starts (and etcd, on its node, needs only its binary).
            assert run.waits_for(worker, prepared) == (step.name == "install-yuanrong" or
                                                       (n.name == etcd_node and step.name == "install-etcd")), step.name
        assert run.waits_for(worker, container)
        assert run.waits_for(worker, etcd)
        assert run.waits_for(worker, hugepages)
        # The reverse never holds (no cycles, and huge pages do not wait for the container).
        assert not run.waits_for(container, worker)
        assert not run.waits_for(hugepages, container)
        for inst in plan.instances:
            if n.name in inst.nodes:
                launch = run.named(f"{n.name}-launch")
                assert run.waits_for(launch, worker)
                assert run.waits_for(proxy, launch)
                assert not run.waits_for(worker, launch)


@pytest.mark.parametrize("stack", STACKS)
def test_preparation_steps_run_in_order(stack):
    run, plan = baseline(stack), plan_of(stack)
    for n in plan.nodes:
        steps = [run.named(f"{n.name}-{s.name}") for s in scripts.prepare(plan, n.name)]
        assert steps, n.name
        container = run.named(f"{n.name}-container")
        previous = container
        for script, step in zip(scripts.prepare(plan, n.name), steps):
            if not script.chained:  # the etcd binary: right after the container, beside the pip chain
                assert step.dependencies == {container.urn}, step.name
                continue
            assert previous.urn in step.dependencies, (step.name, previous.name)  # directly
            previous = step


@pytest.mark.parametrize("stack", STACKS)
def test_groups_start_in_parallel(stack):
    run, plan = baseline(stack), plan_of(stack)
    group_of = {}
    for g in components(run, "VllmDpGroup"):
        for reg in run.children(g, COMMAND):
            group_of[reg.urn] = g.name
    assert len(group_of) == sum(len(i.nodes) for i in plan.instances)
    workers = {run.named(f"{n.name}-worker").urn: n.name for n in plan.nodes}
    for reg in launches(run):
        ancestors = run.ancestors(reg)
        waited_groups = {group_of[u] for u in ancestors if u in group_of}
        assert waited_groups == set(), f"{reg.name} waits for {waited_groups}"
        # The workers of its own group's nodes, no other: a slow node holds back nothing but the
        # group its ranks belong to (which cannot serve without them anyway).
        node = command_node(plan, reg)
        group_nodes = set(next(i for i in plan.instances if node in i.nodes).nodes)
        assert {workers[u] for u in ancestors if u in workers} == group_nodes, reg.name


# ---------------------------------------------------------------------------------------------
# inputs and lifecycle


def _script_of(plan, reg):
    """The plan's Script a Command runs."""
    node = command_node(plan, reg)
    return next(sc for sc in scripts.node_scripts(plan, node) if reg.name in (f"{node}-{sc.name}", f"{node}-nr-{sc.name}"))


@pytest.mark.parametrize("stack", STACKS)
def test_commands_delete_and_replacement(stack):
    run, plan = baseline(stack), plan_of(stack)
    container_ids = {n.name: f"{n.name}-container-id" for n in plan.nodes}
    host_commands = {r.urn for r in commands_under(run, "HugepageHost") + commands_under(run, "NodePreflight")
                     + commands_under(run, "HostFirewall")}
    etcd_id = f"{plan.etcd.node}-etcd-id"
    for reg in script_commands(run):
        node = command_node(plan, reg)
        script = _script_of(plan, reg)
        assert reg.inputs.get("delete", "").strip(), f"{reg.name} has no delete"
        assert reg.delete_before_replace, reg.name
        # sshd refuses PULUMI_COMMAND_* variables on most nodes: one warning per run otherwise.
        assert reg.inputs["addPreviousOutputInEnv"] is False, reg.name
        address = plan.node(node).address
        if reg.urn in host_commands:
            assert reg.inputs["triggers"] == [address, *script.identity]
            assert "docker exec" not in reg.inputs["create"]
            continue
        # What decides which processes the delete acts on replaces the Command (old delete first):
        # its container, its node's address, the script's identity. Nothing of another node: two
        # replacements that force one resource out race in the engine (engine/model.py).
        if reg.name == f"{plan.proxy.node}-proxy":  # and the proxy's key (proxy.auth): a new key restarts it
            assert is_rpc_secret(reg.inputs["triggers"])
            assert plain(reg.inputs["triggers"]) == [container_ids[node], address, *script.identity, MODEL_SECRET]
            key = run.named(f"{node}-proxy-key")
            assert plain(key.inputs["stdin"]) == MODEL_SECRET and is_rpc_secret(key.inputs["stdin"])
            assert MODEL_SECRET not in key.inputs["create"] + key.inputs["delete"]
            continue
        assert reg.inputs["triggers"] == [container_ids[node], address, *script.identity], reg.name
        assert reg.property_dependencies["triggers"] == {run.named(f"{node}-container").urn}, reg.name
        assert "triggers[*]" in reg.replace_on_changes
        assert reg.inputs["delete"].startswith("state=$(docker inspect --type container "), reg.name
        # (a worker also passes the etcd it follows: `-e ASCEND_PD_FOLLOWS=<id>`)
        # and runs the script holding its lock, `bash -s` under `flock -o` (shell.in_container)
        assert re.search(rf"docker exec -i (-e \S+ )?{plan.cfg.container.name} bash -c .*\n(.*\n)*"
                         rf"flock -o -E 75 -w \"\$1\" \"\$0\" bash -s", reg.inputs["create"]), reg.name
    for reg in run.of_type(CONTAINER):
        assert reg.delete_before_replace, reg.name


@pytest.mark.parametrize("stack", STACKS)
def test_identity_values_reach_the_triggers(stack):
    """stateDir, yuanrong.port, livenessPath and etcd.dataDir decide what a delete stops and removes:
    a change replaces the Commands that use them instead of updating them."""
    run, plan = baseline(stack), plan_of(stack)
    worker = run.named(f"{plan.nodes[0].name}-worker")
    assert plan.state_dir in worker.inputs["triggers"]
    assert plan.worker(plan.nodes[0].name).address in worker.inputs["triggers"]
    assert plan.cfg.yuanrong.liveness_path in worker.inputs["triggers"]
    etcd = run.named(f"{plan.etcd.node}-etcd")
    assert plan.etcd.data_dir in etcd.inputs["triggers"]
    # Changing one: only what uses it changes (here: the workers' triggers and scripts, and what
    # a worker address appears in: the probes).
    raw = with_object(stack, "yuanrong", lambda y: y.update(port=18499))
    other = run_program(raw, stack=stack)
    changed = _changed(run, other)
    for n in plan.nodes:
        assert f"{n.name}-worker" in changed
        assert run.named(f"{n.name}-worker").inputs["triggers"] != other.named(f"{n.name}-worker").inputs["triggers"]
    assert not any(name.endswith(("-container", "-image", "-etcd")) for name in changed), changed


@pytest.mark.parametrize("stack", STACKS)
def test_container_survives_reboots_and_pulls_slowly(stack):
    run, plan = baseline(stack), plan_of(stack)
    for n in plan.nodes:
        c = run.named(f"{n.name}-container").inputs
        assert c["restart"] == "unless-stopped"
        assert {"label": "ascend-pd.node-address", "value": n.address} in c["labels"]
        image = run.named(f"{n.name}-image")
        assert image.custom_timeouts == {"create": "7200s", "update": "7200s"}
    for reg in run.of_type(COMMAND):
        conn = unwrap(reg.inputs["connection"])
        assert (conn["dialErrorLimit"], conn["perDialTimeout"]) == (40, 15), reg.name


def test_former_node_names_become_aliases():
    def rename(nodes):
        nodes[1]["name"] = "p1new"
        nodes[1]["formerNames"] = ["p1"]

    raw = with_object("a3-4node", "nodes", rename)
    prefill = json.loads(raw[f"{PROJECT}:prefill"])
    prefill["nodes"] = ["p0", "p1new"]
    raw[f"{PROJECT}:prefill"] = json.dumps(prefill)
    run = run_program(with_host_keys(raw), stack="a3-4node")
    for suffix in ("npu", "docker", "image", "container", "install-yuanrong", "worker", "launch", "probes",
                   "yuanrong", "hugepages", "nr-hugepages", "preflight", "preflight-gate"):
        reg = run.named(f"p1new-{suffix}")
        assert f"p1-{suffix}" in reg.aliases, suffix
    assert run.named("p0-worker").aliases == ()


@pytest.mark.parametrize("stack", STACKS)
def test_scripts_pass_through_unchanged(stack):
    """Components wrap the plan's text in transport; they never edit it."""
    run, plan = baseline(stack), plan_of(stack)
    name = plan.cfg.container.name
    expected = {}
    for n in plan.nodes:
        expected[f"{n.name}-preflight"] = scripts.preflight(plan, n.name)
        expected[f"{n.name}-nr-hugepages"] = scripts.hugepages(plan, n.name)
        expected[f"{n.name}-firewall"] = scripts.firewall(plan, n.name)
        expected[f"{n.name}-worker"] = scripts.worker(plan, n.name)
        expected[f"{n.name}-probes"] = probes(plan, n.name)
        for s in scripts.prepare(plan, n.name):
            expected[f"{n.name}-{s.name}"] = s
    expected[f"{plan.etcd.node}-etcd"] = scripts.etcd(plan)
    expected[f"{plan.proxy.node}-proxy"] = scripts.proxy(plan)
    for inst in plan.instances:
        for node in inst.nodes:
            expected[f"{node}-launch"] = scripts.launch(plan, inst, node)
    assert {r.name for r in script_commands(run)} == set(expected)
    for res_name, script in expected.items():
        reg = run.named(res_name)
        assert command_node(plan, reg) == script.node, res_name
        if script.where == "host":
            assert reg.inputs["create"] == shell.on_host(script.create)
            assert reg.inputs["delete"] == shell.on_host(script.delete)
        else:
            follows = ""
            if res_name.endswith("-worker"):  # it follows etcd: etcd's id in the script's environment
                etcd = run.named(f"{plan.etcd.node}-etcd")
                follows = etcd.id
                assert f"docker exec -i -e ASCEND_PD_FOLLOWS={etcd.id} " in reg.inputs["create"]
                assert etcd.urn in reg.property_dependencies["create"]
            # Create and delete take the same lock, one per script and node, beside the pid files.
            lock = shell.Lock(f"{plan.run_dir}/{script.name}.lock", restart_bound_s(plan.cfg))
            assert reg.inputs["create"] == shell.in_container(name, script.create, lock=lock, follows=follows)
            assert reg.inputs["delete"] == shell.in_container(name, script.delete, lock=lock, delete=True)


def test_a_role_image_goes_to_that_roles_nodes_only():
    """prefill.image / decode.image: each node pulls and runs its role's image; a node of neither
    role (etcd or the proxy alone) and the other role keep container.image."""
    raw = with_object("a3-4node", "decode", lambda d: d.update(image="quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild"))
    raw[f"{PROJECT}:nodes"] = json.dumps(json.loads(raw[f"{PROJECT}:nodes"])
                                         + [{"name": "x0", "address": "192.0.2.50", "nic": "enp3s0"}])
    raw[f"{PROJECT}:proxy"] = json.dumps({**json.loads(raw[f"{PROJECT}:proxy"]), "node": "x0"})
    raw = with_host_keys(raw)
    run = run_program(raw, stack="a3-4node")
    base = load_stack("a3-4node").container.image
    want = {"p0": base, "p1": base, "d0": "quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild",
            "d1": "quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild", "x0": base}
    for node, image in want.items():
        assert run.named(f"{node}-image").inputs["name"] == image, node
        assert run.named(f"{node}-container").inputs["image"] == mock_image_id(image), node
    # The node's preflight checks the image that node will pull.
    assert "image=quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild\n" in run.named("d0-preflight").inputs["create"]
    assert f"image={base}\n" in run.named("p0-preflight").inputs["create"]
    assert "image   quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild  on d0 d1" in summary(build_plan(load_config(
        {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith(f"{PROJECT}:")}), "a3-4node"))


@pytest.mark.parametrize(
    "stack, shm_mb, address", [("a2-8node", 800 * 1024, "192.0.2.10"), ("a3-4node", 500 * 1024, "192.0.2.30")]
)
def test_container_inputs(stack, shm_mb, address):
    run, plan = baseline(stack), plan_of(stack)
    cfg = plan.cfg
    for n in plan.nodes:
        provider = run.named(f"{n.name}-docker")
        assert provider.inputs["host"] == f"ssh://root@{n.address}:22"
        assert FAKE_KEY not in json.dumps(provider.inputs)
        image = run.named(f"{n.name}-image")
        assert image.inputs["name"] == cfg.container.image and image.inputs["keepLocally"] is True
        c = run.named(f"{n.name}-container")
        # Each node's resources go to that node's daemon.
        assert c.provider.startswith(provider.urn + "::") and image.provider.startswith(provider.urn + "::")
        i = c.inputs
        assert i["name"] == cfg.container.name
        assert i["image"] == mock_image_id(cfg.container.image)
        assert c.property_dependencies["image"] == {image.urn}
        assert i["shmSize"] == shm_mb
        assert (i["networkMode"], i["privileged"], i["init"], i["tty"], i["stdinOpen"], i["mustRun"]) == (
            "host", True, True, True, True, True)
        assert i["workingDir"] == "/home" and i["entrypoints"] == ["bash"]
        assert {d["hostPath"] for d in i["devices"]} == {"/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"}
        mounts = {(v["hostPath"], v["containerPath"]) for v in i["volumes"]}
        assert ("/home", "/home") in mounts and ("/usr/share/zoneinfo/Asia/Shanghai", "/etc/localtime") in mounts
    assert plan.node(plan.etcd.node).address == address


def test_container_extra_mounts_env_and_ssh_settings():
    def edit_container(c):
        c["extraMounts"] = [{"host": "/models", "container": "/models", "readOnly": True}]
        c["env"] = {"https_proxy": "http://proxy.example:3128", "A": "1"}

    raw = with_object("a3-4node", "container", edit_container)
    # Only p1 pinned: allowed by insecureIgnoreHostKeys alone; the others are not checked.
    raw[f"{PROJECT}:ssh"] = json.dumps({"user": "ops", "port": 2222, "hostKeys": {"p1": "ssh-ed25519 AAAAC3pinned"},
                                        "insecureIgnoreHostKeys": True})
    run, plan = run_program(raw, stack="a3-4node"), plan_of("a3-4node")
    for n in plan.nodes:
        assert run.named(f"{n.name}-docker").inputs["host"] == f"ssh://ops@{n.address}:2222"
        c = run.named(f"{n.name}-container").inputs
        assert {"hostPath": "/models", "containerPath": "/models", "readOnly": True} in c["volumes"]
        assert c["envs"] == ["A=1", "https_proxy=http://proxy.example:3128"]
    for reg in run.of_type(COMMAND):
        conn = unwrap(reg.inputs["connection"])
        assert (conn["user"], conn["port"]) == ("ops", 2222)
        assert "privateKey" not in conn  # no key configured: ssh-agent
        node = command_node(plan, reg)
        assert conn.get("hostKey") == ("ssh-ed25519 AAAAC3pinned" if node == "p1" else None), reg.name


def test_without_hugepages_workers_do_not_wait_for_them():
    def no_huge_tlb(y):
        y["hugeTlb"] = False

    raw = with_object("a2-8node", "yuanrong", no_huge_tlb)
    del raw[f"{PROJECT}:hugepages"]
    run = run_program(raw, stack="a2-8node")
    assert components(run, "HugepageHost") == []
    assert not any("hugepages" in r.name for r in run.regs)
    assert len(commands_under(run, "YuanrongWorker")) == 8


# ---------------------------------------------------------------------------------------------
# blast radius: a setting touches only what it should


def _changed(base: Run, other: Run) -> set[str]:
    before = {r.name: r.inputs for r in base.regs}
    after = {r.name: r.inputs for r in other.regs}
    assert set(before) == set(after)
    return {name for name in before if before[name] != after[name]}


def _edit_flags(key, value):
    def edit(obj):
        obj["flags"][key] = value
    return edit


@pytest.mark.parametrize(
    "key, edit, touched",
    [
        ("decode", _edit_flags("max-num-seqs", 24),
         {"d0-launch", "d1-launch", "d2-launch", "d3-launch"}),
        ("prefill", _edit_flags("max-num-batched-tokens", 4096),
         {"p0-launch", "p1-launch", "p2-launch", "p3-launch"}),
        # ... and every node's preflight, which checks the weights are there.
        ("model", lambda m: m.update(path="/data/other-weights"),
         {"p0-launch", "p1-launch", "p2-launch", "p3-launch",
          "d0-launch", "d1-launch", "d2-launch", "d3-launch"}
         | {f"{n}-preflight" for n in ("p0", "p1", "p2", "p3", "d0", "d1", "d2", "d3")}),
    ],
    ids=["decode-flag", "prefill-flag", "model-path"],
)
def test_blast_radius(key, edit, touched):
    base = baseline("a2-8node")
    other = run_program(with_object("a2-8node", key, edit), stack="a2-8node")
    assert _changed(base, other) == touched
    for name in touched:
        assert set(base.named(name).inputs) == set(other.named(name).inputs)
        assert base.named(name).inputs["create"] != other.named(name).inputs["create"]
        # Only the script changed: same node, same container trigger, same delete.
        assert base.named(name).inputs["triggers"] == other.named(name).inputs["triggers"]


def _engine_ops(base: Run, other: Run) -> dict[str, set[str]]:
    """Resource names by what `pulumi up` does to them going from `base` to `other` (engine model)."""
    out: dict[str, set[str]] = {}
    for step in plan_up(base.regs, other):
        if step.op != SAME and step.reg.custom:
            out.setdefault(step.op, set()).add(step.name)
    return out


def test_image_change_replaces_every_container_and_what_runs_in_it():
    base = baseline("a3-4node")
    other = run_program(with_object("a3-4node", "container", lambda c: c.update(image="quay.io/ascend/vllm-ascend:v0.18.0-a3-rebuild2")),
                        stack="a3-4node")
    ops = _engine_ops(base, other)
    inside = {r.name for r in base.of_type(COMMAND) if "docker exec" in r.inputs["create"]}
    nodes = [n.name for n in plan_of("a3-4node").nodes]
    assert ops[REPLACE] == {f"{n}-image" for n in nodes} | {f"{n}-container" for n in nodes} | inside
    # The old halves go first (deleteBeforeReplace), except the images (kept on the node anyway).
    assert ops[DELETE_REPLACED] == ops[REPLACE]
    # Each node's preflight checks the new image first (on the node, or its registry reachable).
    assert ops[UPDATE] == {f"{n}-preflight" for n in nodes}
    assert set(ops) == {REPLACE, DELETE_REPLACED, UPDATE}
    hugepages = {r.name for r in base.of_type(COMMAND)} - inside - ops[UPDATE]
    assert hugepages and not hugepages & ops[REPLACE]  # the host's huge pages stay


# ---------------------------------------------------------------------------------------------
# secrets


def _plain_strings(value, path="$"):
    """(path, string) of every string NOT inside a secret-wrapped value."""
    if is_rpc_secret(value):
        return
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _plain_strings(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _plain_strings(v, f"{path}[{i}]")


def test_private_key_stays_secret():
    raw = stack_config("a2-8node")
    raw[f"{PROJECT}:sshPrivateKey"] = FAKE_KEY
    run = run_program(raw, stack="a2-8node", secret_keys=[f"{PROJECT}:sshPrivateKey"])
    needle = "testkeyZZZ9"
    for reg in run.regs:
        leaks = [p for p, s in _plain_strings(reg.inputs) if needle in s]
        assert not leaks, f"{reg.name}: private key in plain input {leaks}"
    # pulumi-docker gets no key at all, not even as a secret: it uses the local ssh and its agent.
    for reg in run.of_type(DOCKER_PROVIDER):
        assert needle not in json.dumps(reg.inputs), reg.name
    # ... and it is really used: every SSH connection carries it, wrapped as a secret.
    cmds = run.of_type(COMMAND)
    plan = plan_of("a2-8node")
    # 51 + 8 firewalls, and the proxy's key file (proxy.auth)
    assert len(cmds) - 1 == sum(len(scripts.node_scripts(plan, n.name)) for n in plan.nodes) == 59
    for reg in cmds:
        assert is_rpc_secret(reg.inputs["connection"])
        assert unwrap(reg.inputs["connection"])["privateKey"] == FAKE_KEY
    stack = pulumi.runtime.get_root_resource()
    for name in stack.outputs:
        assert needle not in json.dumps(stack_output(name)), name


# ---------------------------------------------------------------------------------------------
# invalid configuration: refused before any resource exists


@pytest.mark.parametrize(
    "mutate, setting",
    [
        (lambda raw: raw.update({f"{PROJECT}:prefill": json.dumps(
            {**json.loads(raw[f"{PROJECT}:prefill"]), "tp": 3, "dp": 4})}), "ascend-pd:prefill.tp"),
        (lambda raw: raw.update({f"{PROJECT}:prefil": json.dumps({"tp": 4})}), "ascend-pd:prefil"),
        (lambda raw: raw.update({f"{PROJECT}:decode": json.dumps(
            {**json.loads(raw[f"{PROJECT}:decode"]), "maxNumSeqs": 30})}), "ascend-pd:decode.maxNumSeqs"),
        (lambda raw: raw.update({f"{PROJECT}:decode": json.dumps(
            {**json.loads(raw[f"{PROJECT}:decode"]), "flags": {"port": 9000}})}), "ascend-pd:decode.flags.port"),
    ],
    ids=["tp-exceeds-npus", "unknown-key", "unknown-nested-key", "derived-flag"],
)
def test_invalid_config_registers_nothing(mutate, setting):
    raw = stack_config("a2-8node")
    mutate(raw)
    run = run_program(raw, stack="a2-8node", expect_error=True)
    assert isinstance(run.error, pulumi.RunError), repr(run.error)
    assert setting in str(run.error), str(run.error)
    assert run.regs == []


# ---------------------------------------------------------------------------------------------
# stack outputs


@pytest.mark.parametrize(
    "stack, url, model, etcd, n_ranks",
    [("a2-8node", "http://192.0.2.10:18020", "deepseek_v4", "192.0.2.10:2379", 40),
     ("a3-4node", "http://192.0.2.30:8088", "glm-5.1", "192.0.2.30:2379", 4)],
)
def test_stack_outputs(stack, url, model, etcd, n_ranks):
    run = run_program(stack_config(stack), stack=stack)
    assert stack_output("proxyUrl") == url
    assert stack_output("servedModel") == model
    assert stack_output("etcdEndpoint") == etcd
    ranks = stack_output("ranks")
    assert len(ranks) == n_ranks
    assert set(ranks[0]) == {"role", "instance", "node", "address", "dpRank", "port", "devices"}
    for row in ranks:  # every advertised rank is one the launch script of its node really starts
        create = run.named(f"{row['node']}-launch").inputs["create"]
        assert f"--data-parallel-rank {row['dpRank']} " in create
        assert f"--host {row['address']} " in create and f"--port {row['port']} " in create
        assert f'ASCEND_RT_VISIBLE_DEVICES="{",".join(map(str, row["devices"]))}"' in create
    assert len({(r["address"], r["port"]) for r in ranks}) == n_ranks
    smoke = shlex.split(stack_output("smokeTest"))
    assert smoke[0] == "curl" and f"{url}/v1/chat/completions" in smoke
    assert json.loads(smoke[smoke.index("-d") + 1])["model"] == model


def test_config_from_pulumi_config_env(monkeypatch):
    """The CLI's other channel: the whole map in PULUMI_CONFIG; the result is the same graph."""
    base = baseline("a3-4node")
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(stack_config("a3-4node")))
    run = run_program({}, stack="a3-4node")
    assert _changed(base, run) == set() and len(run.regs) == len(base.regs)


@pytest.mark.parametrize(
    "size, mib",
    [("800g", 819200), ("512000m", 512000), ("65536k", 64), ("1500k", 2), ("1048576", 1), ("3145729", 4)],
)
def test_shm_size_mb(size, mib):
    from ascend_pd.config import docker_size_mib as shm_size_mb

    assert shm_size_mb(size) == mib


# ---------------------------------------------------------------------------------------------
# etcd in its own container (etcd.image)

ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.12"


def _etcd_image(obj):
    obj["image"] = ETCD_IMAGE


def test_etcd_image_mode_runs_etcd_in_its_own_container():
    stack = "a3-4node"
    run = run_program(with_object(stack, "etcd", _etcd_image), stack=stack)
    assert run.error is None, run.error
    raw = with_object(stack, "etcd", _etcd_image)
    plan = build_plan(load_config({k.split(":", 1)[1]: v for k, v in raw.items()}), stack)
    node = plan.etcd.node
    etcd = run.named(f"{node}-etcd")
    container = run.named(f"{node}-etcd-container")
    image = run.named(f"{node}-etcd-image")
    # On the etcd node's docker daemon, beside (not inside) its NPU container.
    provider = run.named(f"{node}-docker")
    assert container.provider.startswith(provider.urn) and image.provider.startswith(provider.urn)
    assert container.parent == image.parent == components(run, "EtcdSingle")[0].urn
    assert image.inputs["name"] == ETCD_IMAGE and image.inputs["keepLocally"] is True
    assert container.inputs["name"] == "ascend-pd-etcd"
    assert container.inputs["image"] == mock_image_id(ETCD_IMAGE)
    assert container.inputs["networkMode"] == "host"
    # The plan's argv is the container's command, URLs on the etcd node's address.
    assert container.inputs["command"] == list(plan.etcd.argv)
    assert f"http://{plan.etcd.address}:{plan.etcd.client_port}" in container.inputs["command"]
    assert container.delete_before_replace
    # Nothing installs the etcd binary; the health gate waits for the container, is replaced with it,
    # and the workers wait for the gate.
    assert not [r for r in run.of_type(COMMAND) if r.name.endswith("install-etcd")]
    assert run.waits_for(etcd, container)
    assert f"{node}-etcd-container-id" in etcd.inputs["triggers"]
    assert "etcd_container=ascend-pd-etcd" in etcd.inputs["create"] and "docker logs $etcd_container" in etcd.inputs["create"]
    # Every start of the etcd container begins with an empty data dir (a tmpfs), and docker starts it
    # again after a reboot; the workers are replaced with a new etcd container.
    assert container.inputs["mounts"] == [{"target": plan.etcd.data_dir, "type": "tmpfs"}]
    assert container.inputs["restart"] == "unless-stopped"
    for n in plan.nodes:  # the workers' scripts name the etcd they register in: a new one updates them
        assert f"container ascend-pd-etcd from {ETCD_IMAGE}" in run.named(f"{n.name}-worker").inputs["create"]
    assert "nohup" not in etcd.inputs["create"]  # the gate starts nothing
    for n in plan.nodes:
        assert run.waits_for(run.named(f"{n.name}-worker"), container)
    # Binary mode (the committed stacks) has no etcd container.
    assert not [r for r in baseline(stack).of_type(CONTAINER) if r.name.endswith("etcd-container")]


def test_etcd_image_change_touches_only_etcd():
    stack = "a3-4node"
    base = run_program(with_object(stack, "etcd", _etcd_image), stack=stack)
    newer = run_program(with_object(stack, "etcd", lambda o: o.update(image="quay.io/coreos/etcd:v3.5.17")), stack=stack)
    plan = plan_of(stack)
    node = plan.etcd.node
    # The new image replaces the etcd container (its image id), which replaces the health gate (its
    # trigger); every worker's script names that etcd, so every worker is updated and registers in
    # the new (empty) etcd. Nothing else.
    ops = _engine_ops(base, newer)
    assert ops[REPLACE] == {f"{node}-etcd-image", f"{node}-etcd-container", f"{node}-etcd"}
    assert ops[UPDATE] == {f"{n.name}-worker" for n in plan.nodes}
    assert set(ops) == {REPLACE, DELETE_REPLACED, UPDATE}


def test_etcd_image_mode_plan_render_and_scripts():
    raw = with_object("a3-4node", "etcd", _etcd_image)
    plan = build_plan(load_config({k.split(":", 1)[1]: v for k, v in raw.items()}), "a3-4node")
    binary = plan_of("a3-4node")
    assert plan.etcd.argv == binary.etcd.argv and binary.etcd.image is None
    assert f"on p0 (container ascend-pd-etcd, image {ETCD_IMAGE})" in summary(plan)
    assert "container ascend-pd-etcd" not in summary(binary)
    gate = scripts.etcd(plan)
    assert gate.where == "container" and f"client_url={plan.etcd.client_url}" in gate.create
    assert "rm -rf" not in gate.delete  # the data dir goes with the etcd container
    assert [s.name for s in scripts.prepare(binary, "p0")].count("install-etcd") == 1
    assert "install-etcd" not in [s.name for s in scripts.prepare(plan, "p0")]
