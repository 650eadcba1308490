"""The preflight gate in the resource graph (Pulumi mocks, each committed stack as the CLI loads it),
and the rendered checks' inputs: what each node's script checks is what the plan will bind and use."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pulumi_harness import COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, PROJECT, run_program, stack_config

from ascend_pd.errors import ConfigError
from ascend_pd.loader import load_config, load_stack
from ascend_pd.plan import build_plan
from ascend_pd.scripts.preflight import CHECKS, node_ports, ping_script, preflight_script, registry_of
from ascend_pd.shell import on_host

STACKS = ("a2-8node", "a3-4node")


def node_of(run, reg, addresses):
    """The node a custom resource acts on: its name's prefix (every per-node resource is <node>-...)."""
    prefix = reg.name.split("-", 1)[0]
    return prefix if prefix in addresses else None


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_on_a_node_waits_for_its_preflight(stack):
    run = run_program(stack_config(stack), stack=stack)
    plan = build_plan(load_stack(stack), stack)
    names = {n.name for n in plan.nodes}
    checked = 0
    for n in plan.nodes:
        gate = run.named(f"{n.name}-preflight")
        assert gate.type == COMMAND
        assert gate.inputs["create"] == on_host(preflight_script(plan, n.name, mode="enforce"))
        assert gate.dependencies == frozenset(), "the gate runs first, waiting for nothing"
        for reg in run.regs:
            if not reg.custom or reg is gate or node_of(run, reg, names) != n.name:
                continue
            assert run.waits_for(reg, gate), f"{reg.name} does not wait for {n.name}-preflight"
            if reg.type in (IMAGE, CONTAINER, DOCKER_PROVIDER) or reg.name.endswith("-nr-hugepages"):
                # A node's own setup never waits for another node's gate (its etcd-registered worker,
                # launches and the proxy do, through what they need from other nodes).
                for other in names - {n.name}:
                    assert not run.waits_for(reg, run.named(f"{other}-preflight")), (reg.name, other)
            checked += 1
    kinds = {r.type for r in run.regs if r.custom}
    assert {COMMAND, CONTAINER, IMAGE, DOCKER_PROVIDER} <= kinds
    assert checked >= 6 * len(plan.nodes)
    # Launches and the proxy, which span nodes, wait for the gates of the nodes they run on.
    proxy = next(r for r in run.of_type(COMMAND) if r.name == f"{plan.proxy.node}-proxy")
    assert run.waits_for(proxy, run.named(f"{plan.proxy.node}-preflight"))


@pytest.mark.parametrize("mode", ["off", "warn"])
def test_mode_off_removes_the_gate_and_warn_keeps_it_lenient(mode):
    stack = "a2-8node"
    run = run_program(stack_config(stack, {f"{PROJECT}:preflight": json.dumps({"mode": mode})}), stack=stack)
    gates = [r for r in run.regs if "-preflight" in r.name]
    if mode == "off":
        assert gates == []
        container = run.named("p0-container")
        assert not any("-preflight" in urn for urn in run.ancestors(container))
    else:
        assert len(gates) == 16  # 8 components, 8 Commands
        cmd = run.named("p0-preflight")
        assert "report_mode=warn" in cmd.inputs["create"] and cmd.type == COMMAND


@pytest.mark.parametrize("value, setting", [
    ({"mode": "strict"}, "preflight.mode"),
    ({"minCann": "8.5.x"}, "preflight.minCann"),
    ({"minDriver": "latest"}, "preflight.minDriver"),
    ({"maxClockSkewMs": 0}, "preflight.maxClockSkewMs"),
    ({"modes": "warn"}, "preflight.modes"),
])
def test_bad_preflight_settings_are_refused_by_name(value, setting):
    raw = dict(stack_config("a2-8node"))
    raw[f"{PROJECT}:preflight"] = json.dumps(value)
    with pytest.raises(ConfigError) as err:
        load_config({k.split(":", 1)[1]: v for k, v in raw.items()})
    assert setting in str(err.value)


def test_minimum_versions_per_profile_and_overrides():
    a2, a3 = load_stack("a2-8node"), load_stack("a3-4node")
    assert (a2.min_cann, a2.min_driver) == ("8.5.0", "25.2.3")
    assert (a3.min_cann, a3.min_driver) == ("8.5.0", "25.5.0")
    rh2d = a2.model_copy(update={"yuanrong": a2.yuanrong.model_copy(update={"rh2d_device_ids": [0]})})
    assert rh2d.min_driver == "25.5.0"  # seed 000: RH2D over RoCE needs HDK >= 25.5.0
    pinned = a2.model_copy(update={"preflight": a2.preflight.model_copy(update={"min_driver": "26.0.0"})})
    assert pinned.min_driver == "26.0.0"
    text = preflight_script(build_plan(a3, "a3-4node"), "p0", mode="enforce")
    assert "\nmin_driver=25.5.0\n" in text and "\nhardware=a3\n" in text and "\nnpus=16\n" in text
    # Host RAM the guides assume: seed 003's 1 T on A3 (as MemTotal reads it), none named for A2.
    assert (a2.min_host_memory_gib, a3.min_host_memory_gib) == (0, 960)
    assert f"\nmin_total_kib={960 * 1024 * 1024}\n" in text
    none = a3.model_copy(update={"preflight": a3.preflight.model_copy(update={"min_host_memory_gib": 0})})
    assert "\nmin_total_kib=0\n" in preflight_script(build_plan(none, "a3-4node"), "p0", mode="enforce")


@pytest.mark.parametrize("stack", STACKS)
def test_ports_checked_are_the_ports_the_plan_binds(stack):
    plan = build_plan(load_stack(stack), stack)
    cfg = plan.cfg
    for n in plan.nodes:
        ports = dict(node_ports(plan, n.name))
        assert len(ports) == len(node_ports(plan, n.name)), "one owner per port (the plan refuses collisions)"
        ranks = [r for r in plan.ranks if r.node == n.name]
        for r in ranks:
            assert r.port in ports
            kv = getattr(cfg, r.role).kv_port
            assert all(kv + r.dp_rank * r.tp + t in ports for t in range(r.tp))
        assert cfg.yuanrong.port in ports
        assert (cfg.etcd.client_port in ports) == (n.name == plan.etcd.node)
        assert (cfg.proxy.port in ports) == (n.name == plan.proxy.node)
        script = preflight_script(plan, n.name)
        line = next(x for x in script.splitlines() if x.startswith("ports="))
        assert len(line.split()) == len(ports)


def test_only_renders_the_asked_checks_and_refuses_unknown_ones():
    plan = build_plan(load_stack("a2-8node"), "a2-8node")
    text = preflight_script(plan, "p0", checks=["ports", "clock"])
    tail = text.rsplit("\n}\n", 1)[1]
    assert tail.split() == ["check_clock", "load_stack_pids", "check_ports", "finish"]
    with pytest.raises(ValueError, match="unknown preflight check"):
        preflight_script(plan, "p0", checks=["ping"])  # the ping round is ping_script's
    with pytest.raises(ValueError, match="ping target"):
        ping_script(plan, "p0", [(0, "ping", "10.0.0.1; reboot")])
    assert set(CHECKS) | {"ping"} == {"clock", "versions", "page-size", "memory", "npu", "fabric", "ports",
                                       "weights", "docker", "network", "firewall", "ping"}


def test_registry_of_image_references():
    assert registry_of("quay.io/ascend/vllm-ascend:v0.20.2rc1") == "quay.io"
    assert registry_of("vllm-ascend:latest") == "registry-1.docker.io"
    assert registry_of("ascend/vllm-ascend:v1") == "registry-1.docker.io"
    assert registry_of("localhost:5000/x:1") == "localhost:5000"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_fake_vendor_tools_pass_shellcheck():
    fakes = sorted(str(p) for p in (Path(__file__).parent / "fakes" / "preflight_bin").iterdir())
    assert len(fakes) >= 10
    proc = subprocess.run(["shellcheck", "-x", "--severity=style", *fakes], capture_output=True, text=True,
                          timeout=120, cwd=Path(fakes[0]).parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
