"""forget-node without a CLI: which resources are a node's (the naming contract it relies on, held to
where every resource of both committed stacks really connects), the refusals that keep it from
touching a stack it should not, and the cleanup script it leaves for a machine that comes back.

The command against the real engine (a decode node's machine gone, the spare in its place, one
forget-node, serving again) is in tests/realengine/test_scenarios.py."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pulumi_harness import COMMAND, CONTAINER, DOCKER_PROVIDER, PROJECT, plain, run_program, stack_config, \
    with_host_keys
from ports import free_port
from ascend_pd.forget import Endpoint, Forget, ForgetError, StateResource, answers, cleanup_script, node_endpoint, \
    node_resources, owner, state_nodes

ROOT = Path(__file__).resolve().parent.parent


def graph(stack: str, monitoring_on: str | None = None):
    raw = with_host_keys(stack_config(stack))
    if monitoring_on:
        raw[f"{PROJECT}:monitoring"] = json.dumps({"node": monitoring_on})
    return run_program(raw, stack=stack)


def as_state(g) -> list[StateResource]:
    """The registrations as `pulumi stack export` lists them (urn, type, custom, inputs)."""
    return [StateResource(urn=r.urn, type=r.type, name=r.name, custom=r.custom, inputs=plain(r.inputs))
            for r in g.regs]


def connects_to(g, reg, addresses: dict[str, str]) -> str | None:
    """The node a custom resource acts on, from what it dials: a Command's connection host, a docker
    resource's provider (whose host is ssh://user@address:port)."""
    by_address = {a: n for n, a in addresses.items()}
    if reg.type == COMMAND:
        return by_address[plain(reg.inputs)["connection"]["host"]]
    if reg.type == DOCKER_PROVIDER:
        return by_address[plain(reg.inputs)["host"].split("@", 1)[1].rsplit(":", 1)[0]]
    if reg.provider:
        provider = g.by_urn(reg.provider.rsplit("::", 1)[0])  # a provider reference is <urn>::<id>
        if provider is not None and provider.type == DOCKER_PROVIDER:
            return connects_to(g, provider, addresses)
    return None


@pytest.mark.parametrize("stack,monitoring_on", [("a2-8node", "p3"), ("a3-4node", None)])
def test_every_resource_of_a_node_is_named_after_it(stack, monitoring_on):
    """The contract forget-node selects by: whatever dials a node is named `<node>-...`, and nothing
    named after a node dials another. Checked on what each resource really connects to."""
    g = graph(stack, monitoring_on)
    state = as_state(g)
    nodes = state_nodes(state)
    addresses = {n["name"]: n["address"] for n in json.loads(stack_config(stack)[f"{PROJECT}:nodes"])}
    assert nodes == sorted(addresses)
    checked = 0
    for reg in g.regs:
        if not reg.custom or reg.type.startswith("pulumi:providers:") and reg.type != DOCKER_PROVIDER:
            continue
        target = connects_to(g, reg, addresses)
        assert target is not None, f"{reg.name} ({reg.type}): cannot tell which node it acts on"
        assert owner(reg.name, nodes) == target, f"{reg.name} acts on {target}"
        checked += 1
    assert checked > 10 * len(nodes)
    # And the selection is exactly those, plus the node's own components.
    for node in nodes:
        picked = {r.name for r in node_resources(state, node)}
        acting = {r.name for r in g.regs if r.custom and owner(r.name, nodes) == node and
                  (not r.type.startswith("pulumi:providers:") or r.type == DOCKER_PROVIDER)}
        assert acting <= picked
        assert {f"{node}-npu", f"{node}-docker", f"{node}-container", f"{node}-worker", f"{node}-firewall"} <= picked
        assert not any(n.startswith(("prefill-", "decode-")) or n in ("etcd", "proxy") for n in picked)


def test_a_name_two_nodes_prefix_belongs_to_the_longer():
    nodes = ["p0", "p0-b", "prefill"]
    assert owner("p0-b-worker", nodes) == "p0-b"
    assert owner("p0-worker", nodes) == "p0"
    assert owner("p0-bx-worker", nodes) == "p0"
    assert owner("prefill-0", nodes) == "prefill"  # a node named `prefill`: its groups are components...
    state = [StateResource(f"urn:x::{n}", "ascend-pd:index:VllmDpGroup", n, False, {}) for n in ["prefill-0"]]
    state += [StateResource(f"urn:x::{n}-npu", "ascend-pd:index:NpuContainer", f"{n}-npu", False, {}) for n in nodes]
    # ...which are not a node's: only custom resources and the per-node components are.
    assert [r.name for r in node_resources(state, "prefill")] == ["prefill-npu"]


def test_the_node_address_comes_from_its_docker_provider():
    g = graph("a3-4node")
    state = as_state(g)
    addresses = {n["name"]: n["address"] for n in json.loads(stack_config("a3-4node")[f"{PROJECT}:nodes"])}
    for node, address in addresses.items():
        assert node_endpoint(state, node) == Endpoint("root", address, 22)
    # The user and port the stack reaches it with, for the cleanup hint.
    provider = next(r for r in state if r.name == "d0-docker")
    moved = [StateResource(r.urn, r.type, r.name, r.custom, {**r.inputs, "host": "ssh://ops@10.1.2.3:2222"})
             if r is provider else r for r in state]
    where = node_endpoint(moved, "d0")
    assert where == Endpoint("ops", "10.1.2.3", 2222) and where.ssh() == "ssh -p 2222 ops@10.1.2.3"
    assert node_endpoint(state, "p0").ssh() == f"ssh root@{addresses['p0']}"
    with pytest.raises(ForgetError, match="no docker provider `ghost-docker`"):
        node_endpoint(state, "ghost")


def test_answers_tells_a_listener_a_refusal_and_silence_apart():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        assert "accepts connections" in answers("127.0.0.1", port, 2)
    finally:
        srv.close()
    assert "refuses connections" in answers("127.0.0.1", port, 2)  # nothing listens now: the machine is up
    # A listener whose queue is full never completes the handshake: a machine that drops packets.
    from status_support import Blackhole

    hole = Blackhole("127.0.0.1", port)
    try:
        assert answers("127.0.0.1", port, 1) is None
    finally:
        hole.close()


def test_the_cleanup_script_undoes_the_node_dependents_first(tmp_path):
    g = graph("a2-8node")
    state = as_state(g)
    mine = node_resources(state, "d1")
    script, secret = cleanup_script(mine, "d1", Endpoint("ops", "10.0.0.5", 2222))
    assert secret == [] and "#   ssh -p 2222 ops@10.0.0.5 bash -s < THIS_FILE" in script
    order = [line[len("echo '--- "):-1] for line in script.splitlines() if line.startswith("echo '--- ")]
    # The launch is stopped before the worker, the container removed after both and before the host's
    # huge pages and firewall are given back.
    assert order.index("d1-launch") < order.index("d1-worker") < order.index("d1-container")
    assert order.index("d1-container") < order.index("d1-nr-hugepages")
    assert order.index("d1-container") < order.index("d1-firewall")
    assert "docker rm -f" in script
    for r in mine:
        if r.type == COMMAND and r.inputs.get("delete"):
            assert r.inputs["delete"].rstrip() in script
    f = tmp_path / "cleanup.sh"
    f.write_text(script)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    # A delete kept secret in the state is left out and named.
    sealed = [StateResource(r.urn, r.type, r.name, r.custom,
                            {**r.inputs, "delete": {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
                                                    "ciphertext": "x"}} if r.name == "d1-worker" else r.inputs)
              for r in mine]
    script, secret = cleanup_script(sealed, "d1", Endpoint("root", "10.0.0.5", 22))
    assert secret == ["d1-worker"] and "ciphertext" not in script and "--- d1-launch" in script


def job(tmp_path, node="d1", nodes=None, **kw) -> Forget:
    nodes = nodes if nodes is not None else {n: [] for n in ["p0", "p1", "p2", "p3", "d0", "x0", "d2", "d3"]}
    return Forget(stack="a2-8node", node=node, stack_nodes=nodes, pulumi="pulumi", cwd=tmp_path,
                  backup_dir=tmp_path / "backups", connect_timeout_s=1, log=lambda m: None, **kw)


def test_a_node_still_in_the_stack_file_is_refused(tmp_path):
    with pytest.raises(ForgetError, match="d1 is still a node of the stack file.*remove d1, or put the machine"):
        job(tmp_path, nodes={"d0": [], "d1": []}).check_stack()
    with pytest.raises(ForgetError, match="nodes `x0` lists d1 in formerNames"):
        job(tmp_path, nodes={"d0": [], "x0": ["d1"]}).check_stack()
    job(tmp_path).check_stack()


def deployment_with(address: str, port: int) -> dict:
    """The a2 stack's registrations as an exported state, d1 at address:port."""
    g = graph("a2-8node")
    res = []
    for r in g.regs:
        inputs = plain(r.inputs)
        if r.name == "d1-docker":
            inputs = {**inputs, "host": f"ssh://root@{address}:{port}"}
        res.append({"urn": r.urn, "type": r.type, "custom": r.custom, "inputs": inputs})
    return {"resources": res}


def test_a_node_that_answers_is_not_forgotten_and_nothing_runs(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    calls = []
    try:
        with pytest.raises(ForgetError, match=r"d1 answers \(127.0.0.1:\d+ accepts connections\).*--force"):
            job(tmp_path).run(lambda argv: calls.append(argv) or 0, deployment_with("127.0.0.1", srv.getsockname()[1]))
    finally:
        srv.close()
    assert calls == [] and not (tmp_path / "backups").exists()
    with pytest.raises(ForgetError, match="has no resource of node ghost"):
        job(tmp_path, node="ghost").run(lambda argv: 0, deployment_with("127.0.0.1", 1))


@contextlib.contextmanager
def silent_node():
    """A deployment whose d1 drops every packet to its SSH port (a listener with a full queue)."""
    from status_support import Blackhole

    port = free_port()
    hole = Blackhole("127.0.0.1", port)
    try:
        yield deployment_with("127.0.0.1", port)
    finally:
        hole.close()


def test_the_pulumi_steps_in_order_and_a_failed_up_stops_before_the_state_is_touched(tmp_path):
    """What forget-node asks of the CLI: export, then `up` with exactly the node's resources excluded,
    then `state delete` of exactly them, then a plain `up` (what only held them, e.g. the group of an
    instance that went with the node, could not be deleted before). A failed up leaves the state as
    it was."""
    calls: list[list[str]] = []

    def pulumi(argv, fails=""):
        calls.append(argv)
        if argv[:2] == ["stack", "export"]:
            Path(argv[argv.index("--file") + 1]).write_text("{}")
        return 1 if argv[0] == fails else 0

    with silent_node() as dep:
        assert job(tmp_path).run(pulumi, dep) == 0
    assert [c[0] for c in calls] == ["stack", "up", "state", "up"]
    assert "--exclude" not in calls[3]
    up = calls[1]
    excluded = {up[i + 1] for i, a in enumerate(up) if a == "--exclude"}
    picked = {r.urn for r in node_resources([StateResource.of(x) for x in dep["resources"]], "d1")}
    assert excluded == picked and len(picked) > 10
    assert all(u.rsplit("::", 1)[-1].startswith("d1-") for u in excluded)
    assert set(calls[2][calls[2].index("--yes") + 1:]) == picked
    backups = sorted((tmp_path / "backups").iterdir())
    assert [b.suffix for b in backups] == [".json", ".sh"]
    assert oct(backups[0].stat().st_mode & 0o777) == "0o600"

    calls.clear()
    with silent_node() as dep:
        assert job(tmp_path).run(lambda argv: pulumi(argv, fails="up"), dep) == 1
    assert [c[0] for c in calls] == ["stack", "up"]  # no state delete after a failed up

    calls.clear()
    with silent_node() as dep:
        assert job(tmp_path, dry_run=True).run(pulumi, dep) == 0
    assert [c[0] for c in calls] == ["preview"]


def test_the_command_line_refuses_a_node_still_in_the_stack():
    p = subprocess.run([sys.executable, "-m", "ascend_pd", "forget-node", "--stack", "a2-8node", "d1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "forget-node: d1 is still a node of the stack file" in p.stderr and "Traceback" not in p.stderr
