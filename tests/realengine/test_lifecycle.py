"""The real lifecycle of both stacks: `pulumi preview`, `up`, `refresh`, `destroy` by the real CLI
and providers against real nodes (sshd, dockerd), and the faults an operator meets by hand.

Each stack's steps run in order on one deployment, each from where the previous left it, as an
operator's day goes; a step that leaves debris fails the next. Sizes are shrunk as the integration
suite does (tests/realengine/stacks.py); the topology, ports, flags and placements are the stack's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time

import pytest

import cluster as rc
from engine import resource_key

from ascend_pd.engine.timing import first_deploy

pytestmark = pytest.mark.integration

COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
NODE_TYPES = (COMMAND, CONTAINER, "docker:index/remoteImage:RemoteImage")  # what acts on a node
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module", params=["a2-8node", "a3-4node"])
def dep(request, realdir):
    rc.require_real_engine()
    # a2-8node upgraded to vllm-ascend 0.23.0.post1 as docs/changes.md says (its rewritten proxy);
    # a3-4node as committed (0.18.0). The scenarios (test_scenarios.py) run a2-8node as committed (0.20.2rc1).
    c = rc.RealCluster(request.param, realdir / request.param, upgrade=request.param == "a2-8node")
    FIGURES[request.param] = {"fleet_start_s": round(c.fleet.start_seconds, 1),
                              "image_push_s": round(c.push_seconds, 1)}
    yield c
    try:
        if c.project.export().get("resources"):
            c.project.destroy()
    finally:
        c.close()
        print(f"\nreal-engine figures {request.param}: {json.dumps(FIGURES[request.param])}")


def on_a2_only(dep: rc.RealCluster) -> None:
    """A fault whose handling is the engine's and the scripts', the same on both layouts: run on a2-8node
    only (CI time is a budget; about 3 minutes for a3-4node's copies)."""
    if dep.stack != "a2-8node":
        pytest.skip("the engine handles this fault alike on both stacks: run on a2-8node")


def secret_lines(c: rc.RealCluster) -> list[str]:
    """Lines of the SSH private key that must never be printed (its body, not the armour)."""
    return [line for line in c.private_key.splitlines() if line and "PRIVATE KEY" not in line]


def test_preview_before_the_first_deploy(dep: rc.RealCluster):
    run = dep.project.preview()
    assert run.ok, run.error
    assert {s.op for s in run.steps} == {"create"}
    # The engine's resources are exactly the ones the program registers under the mocks (what diff
    # and the engine model work from), plus the stack and the default command provider.
    engine = {resource_key(s.urn) for s in run.steps if s.type != "pulumi:pulumi:Stack"
              and not s.name.startswith("default_")}
    assert engine == {resource_key(r.urn) for r in dep.model_graph().regs}
    assert run.summary == {"create": len(engine) + 1}  # + the stack
    for line in secret_lines(dep):
        assert line not in run.stdout
    FIGURES[dep.stack]["preview_s"] = round(run.seconds, 1)
    FIGURES[dep.stack]["resources"] = len(run.steps)


def test_first_up_serves(dep: rc.RealCluster):
    run = dep.project.up()
    assert run.ok, (run.error or "")[-6000:]
    assert not [s for s in run.steps if s.failed]
    report = dep.wait_serving()
    assert report
    # The bound on a step whose node goes silent (firewall.tcpRetries2; the kernel's default is 15).
    names = [n["name"] for n in dep.settings()["nodes"]]
    retries = {n: dep.fleet.nodes[n].sh("cat /proc/sys/net/ipv4/tcp_retries2").stdout.strip() for n in names}
    assert retries == {n: "8" for n in names}, retries
    FIGURES[dep.stack]["first_up_s"] = round(run.seconds, 1)
    # What the scripts, pulls and containers took, summed: against the wall time, the engine's own
    # cost and what its parallelism saves (components and the stack only wrap their children).
    FIGURES[dep.stack]["first_up_step_sum_s"] = round(sum(s.seconds for s in run.acting(NODE_TYPES)), 1)
    FIGURES[dep.stack]["first_up_slowest"] = [(s.name, round(s.seconds, 1)) for s in
                                              sorted(run.acting(NODE_TYPES), key=lambda s: -s.seconds)[:3]]
    lines = run.stdout.splitlines()
    FIGURES[dep.stack]["first_up_output"] = "\n".join(
        [ln for ln in lines if ln.startswith((" +  pulumi:pulumi:Stack", "Updating", "View"))][:3]
        + [ln for ln in lines if "created (" in ln and "command:remote:Command" in ln][-3:]
        + lines[next((i for i, ln in enumerate(lines) if ln.startswith("Resources:")), len(lines)):])
    # The engine model's schedule of the same first deploy, given each step's measured duration: its
    # makespan against the real wall time is the engine's own overhead plus any scheduling the model
    # gets wrong (a model that starts steps the engine holds back would come out far shorter).
    measured = {resource_key(s.urn): s.seconds for s in run.acting(NODE_TYPES)}
    model = first_deploy(dep.model_graph(), parallel=dep.project.parallel,
                         seconds=lambda step: measured.get(resource_key(step.reg.urn), 0.0))
    FIGURES[dep.stack]["model_makespan_s"] = round(model.makespan_s, 1)
    FIGURES[dep.stack]["model_critical_path_s"] = round(model.critical_path_s, 1)
    assert not model.stalled
    assert model.makespan_s <= run.seconds
    for line in secret_lines(dep):
        assert line not in run.stdout


SCAN = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    s = socket.socket()
    s.settimeout(1.5)
    try:
        s.connect(tuple(target))
        return True
    except OSError:
        return False
    finally:
        s.close()
targets = json.load(sys.stdin)
with ThreadPoolExecutor(256) as pool:
    print(json.dumps(list(pool.map(probe, targets))))
"""
LISTEN = "import socket, sys, time\ns = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n" \
         "print(s.getsockname()[1], flush=True); time.sleep(3600)\n"


def listening(node, address: str) -> list[int]:
    """The TCP ports a node listens on where another machine could reach (not loopback-only)."""
    ports = set()
    for line in node.sh("ss -Htln").stdout.splitlines():
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        if host.strip("[]") in ("0.0.0.0", "*", "::", address):
            ports.add(int(port))
    return sorted(ports)


def reached(stranger, targets: list[tuple[str, int]]) -> set[tuple[str, int]]:
    answers = json.loads(stranger.run("python3", "-c", SCAN, input=json.dumps(targets)).stdout)
    return {t for t, ok in zip(targets, answers) if ok}


def current_plan(dep: rc.RealCluster):
    from ascend_pd.loader import open_stack

    return open_stack(stack_file=dep.stack_file).build_plan()  # secure values read as placeholders


def test_a_stranger_reaches_ssh_and_the_authenticated_proxy_and_nothing_else(dep: rc.RealCluster):
    """A machine on the nodes' network that is not in the stack: every port every node listens on
    (the plan's, and one opened at random as vLLM, torch and HCCL do) tried with and without each node's
    firewall; with it, SSH everywhere and the proxy's port on its node only. The proxy refuses it
    without the key, serves it with the key, and refuses it /instances/... with the key too."""
    from ascend_pd.scripts import firewall

    plan = current_plan(dep)
    stranger = dep.fleet.stranger()
    random_port = None
    node0 = dep.fleet.nodes[plan.nodes[0].name]
    listener = subprocess.Popen(["nsenter", "-t", str(node0.pid), "-n", sys.executable, "-c", LISTEN],
                                stdout=subprocess.PIPE, text=True)
    try:
        random_port = int(listener.stdout.readline())
        targets = {n.name: [(n.address, p) for p in listening(dep.fleet.nodes[n.name], n.address)]
                   for n in plan.nodes}
        assert (plan.nodes[0].address, random_port) in targets[plan.nodes[0].name]
        after = {name: reached(stranger, t) for name, t in targets.items()}
        for n in plan.nodes:
            dep.fleet.nodes[n.name].sh(f"nft delete table inet {plan.cfg.firewall.table}")
        try:
            before = {name: reached(stranger, t) for name, t in targets.items()}
        finally:
            for n in plan.nodes:  # the node's own script puts it back, as the next `up` would
                dep.fleet.nodes[n.name].sh(firewall(plan, n.name).create)
        figures = {n.name: {"listening": len(targets[n.name]), "reached without": len(before[n.name]),
                            "reached with": len(after[n.name])} for n in plan.nodes}
        FIGURES[dep.stack]["stranger_ports"] = figures
        print(f"\nports a stranger reaches, {dep.stack}: {json.dumps(figures)}")
        for n in plan.nodes:
            allowed = {(n.address, 22)} | ({(n.address, plan.proxy.port)} if n.name == plan.proxy.node else set())
            assert after[n.name] == allowed, (n.name, sorted(after[n.name]))
            assert before[n.name] == set(targets[n.name]), n.name  # everything, without it
        assert (plan.nodes[0].address, random_port) in before[plan.nodes[0].name]

        def curl(*args: str) -> str:
            return stranger.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "30", *args,
                                check=False).stdout
        key = f"Authorization: Bearer {dep.secrets['proxyApiKey']}"
        body = json.dumps({"model": plan.cfg.model.served_name, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4})
        chat = [f"{plan.proxy.url}/v1/chat/completions", "-H", "Content-Type: application/json", "-d", body]
        assert curl(*chat) == "401"
        assert curl(*chat, "-H", key) == "200"
        assert curl(f"{plan.proxy.url}/healthcheck") == "401"
        take_over = json.dumps({"type": "decode", "instances": [f"{stranger.address}:8000"]})
        assert curl(f"{plan.proxy.url}/instances/add", "-H", key, "-H", "Content-Type: application/json",
                    "-d", take_over) == "403"
    finally:
        listener.kill()
        stranger.close()
    assert dep.wait_serving()  # nothing the stranger did changed the proxy's lists


def test_the_planted_secret_is_found_nowhere_in_clear(dep: rc.RealCluster):
    """`pulumi config set --secret --path ascend-pd:vllm.env.HF_TOKEN`: every rank has it in its
    environment, and it is in no preview, state, process list, log or support bundle."""
    secret = rc.PLANTED_SECRET
    plan = current_plan(dep)
    for n in plan.nodes:
        node = dep.fleet.nodes[n.name]
        ps = node.sh("ps -eo pid=,args=").stdout
        assert secret not in ps, n.name
        ranks = [line.split()[0] for line in ps.splitlines() if "fake_vllm.py" in line]
        if plan.instance_on(n.name) is not None:
            assert ranks, n.name
            environ = node.sh(f"tr '\\0' '\\n' < /proc/{ranks[0]}/environ").stdout
            assert f"{rc.PLANTED_NAME}={secret}" in environ.splitlines(), n.name  # delivered, as a variable
        name = plan.cfg.container.name
        logs = node.docker("exec", name, "sh", "-c", f"cat {plan.log_dir}/*.log", check=False).stdout
        assert logs and secret not in logs, n.name
    preview = dep.project.preview(diff=True)
    assert preview.ok and secret not in preview.stdout
    state = "".join(p.read_text(errors="replace") for p in (dep.project.dir / "state").rglob("*") if p.is_file())
    assert state and secret not in state
    out = dep.project.dir / "bundle.tar.gz"
    made = dep.cli("bundle", "--out", str(out), "--identity", str(dep.fleet.key), "--known-hosts",
                   str(dep.fleet.known_hosts))
    assert made.returncode == 0, made.stderr[-2000:]
    with tarfile.open(out) as tar:
        text = "".join(tar.extractfile(m).read().decode(errors="replace") for m in tar if m.isfile())
    assert len(text) > 10000 and secret not in text


def test_no_change_after_up(dep: rc.RealCluster):
    run = dep.project.preview(expect_no_changes=True)
    assert run.ok, run.stdout[-6000:]
    t0 = time.monotonic()
    again = dep.project.up()
    assert again.ok and again.acting() == [], again.ops()
    FIGURES[dep.stack]["no_change_up_s"] = round(time.monotonic() - t0, 1)


def test_refresh_reads_back_no_change(dep: rc.RealCluster):
    run = dep.project.refresh()
    assert run.ok, run.error
    FIGURES[dep.stack]["refresh_s"] = round(run.seconds, 1)
    after = dep.project.preview(expect_no_changes=True)
    assert after.ok, after.stdout[-6000:]


def test_a_failed_launch_then_the_fixed_stack_converges(dep: rc.RealCluster):
    """A flag this vLLM refuses: the decode launches fail and `up` says so. The engine keeps a failed
    update's OLD inputs in the state (pulumi-command's update returns a plain error), so the stack
    reverted to what it was is no change to the engine and the dead decode ranks stay dead: `converge`
    bumped re-runs every service script, and the idempotent scripts restart only what is dead."""
    on_a2_only(dep)
    flags = dep.settings()["decode"].get("flags", {})
    dep.configure(decode={"flags": {**flags, "no-such-flag": True}},
                  vllm={"allowUnknownFlags": ["no-such-flag"]})
    bad = dep.project.up()
    assert not bad.ok
    failed = {s.name for s in bad.steps if s.failed}
    decode_launches = {f"{n}-launch" for n in dep.settings()["decode"]["nodes"]}
    assert failed and failed <= decode_launches, failed
    assert "no-such-flag" in bad.error
    dep.configure()
    reverted = dep.project.up()
    assert reverted.ok, (reverted.error or "")[-6000:]
    assert not {n for op, n in reverted.ops() if n in decode_launches}, reverted.ops()  # no change to the engine
    rc_, report = dep.status()
    assert rc_ == 1 and any(r["role"] == "decode" and not r["ok"] for r in report["ranks"])
    dep.overrides["converge"] = 1
    dep.configure()
    converge = dep.project.up()
    assert converge.ok, (converge.error or "")[-6000:]
    dep.wait_serving()
    assert dep.project.preview(expect_no_changes=True).ok


def test_a_container_stopped_by_hand(dep: rc.RealCluster):
    """`docker stop` on a decode node: refresh keeps the container, `up` starts it again (same
    container), and `ascend-pd heal` restarts the services that died with it."""
    on_a2_only(dep)
    node = dep.fleet.nodes["d1"]
    name = dep.settings()["container"]["name"]
    before = node.docker("inspect", "--format", "{{.Id}}", name).stdout.strip()
    node.docker("stop", "-t", "1", name)
    assert dep.status()[0] == 1
    assert dep.project.refresh().ok
    up = dep.project.up()
    assert up.ok, (up.error or "")[-6000:]
    assert [(op, n) for op, n in up.ops() if op != "same"] == [("update", "d1-container")], up.ops()
    assert node.docker("inspect", "--format", "{{.Id}} {{.State.Running}}", name).stdout.split() == [before, "true"]
    healed = dep.heal()
    assert healed.returncode == 0, healed.stdout[-4000:] + healed.stderr[-2000:]
    dep.wait_serving()
    assert dep.project.preview(expect_no_changes=True).ok


def test_a_readdressed_node_converges(dep: rc.RealCluster):
    """The last decode node gets a new address (the same machine): its container and everything in
    it are replaced, the peers that name it follow, and the cluster serves on the new address."""
    on_a2_only(dep)
    last = list(dep.fleet.nodes)[-1]
    node = dep.fleet.nodes[last]
    new = dep.fleet.prefix + "99"
    dep.fleet.add_address(last, new)
    nodes_ = [dict(n) for n in dep.settings()["nodes"]]
    for n in nodes_:
        if n["name"] == last:
            n["address"] = new
    dep.overrides["nodes"] = nodes_
    dep.configure()
    up = dep.project.up()
    assert up.ok, (up.error or "")[-6000:]
    assert ("replace", f"{last}-container") in up.ops(), up.ops()
    report = dep.wait_serving()
    assert new in json.dumps(report)
    assert dep.project.preview(expect_no_changes=True).ok
    assert node.docker("ps", "-q").stdout.split()  # the node's one container is the new one


def test_a_container_removed_by_hand_comes_back_with_refresh_and_up(dep: rc.RealCluster):
    """`docker rm -f` on a prefill node: refresh drops the container from the state, `up` creates a
    new one and, its id being in every Command's triggers, runs everything of that node in it again.
    On a3, p1 is half of a two-node prefill instance whose ranks on p0 run on, unchanged for the
    engine: a DP group takes no member back, so the instance serves again only once `heal` restarts
    it as a whole (what docs/changes.md says to run)."""
    node = dep.fleet.nodes["p1"]
    node.docker("rm", "-f", dep.settings()["container"]["name"])
    assert dep.status()[0] == 1
    refresh = dep.project.refresh()
    assert refresh.ok, refresh.error
    up = dep.project.up()
    assert up.ok, (up.error or "")[-6000:]
    ops = up.ops()
    assert ("create", "p1-container") in ops, ops
    assert {n for op, n in ops if op == "replace"} >= {"p1-install-yuanrong", "p1-worker", "p1-launch"}, ops
    assert not [n for op, n in ops if not n.startswith("p1-") and n not in ("proxy", "probes")], ops
    group = [n for n in dep.settings()["prefill"]["nodes"]][: dep.settings()["prefill"].get("nodesPerInstance", 1)]
    if len(group) > 1:
        healed = dep.heal()
        assert healed.returncode == 0, healed.stdout[-4000:] + healed.stderr[-2000:]
    dep.wait_serving()
    assert dep.project.preview(expect_no_changes=True).ok


def test_a_container_removed_by_hand_does_not_block_destroy(dep: rc.RealCluster):
    node = dep.fleet.nodes["p1"]
    node.docker("rm", "-f", dep.settings()["container"]["name"])
    run = dep.project.destroy()
    assert run.ok, (run.error or "")[-6000:]
    for name in dep.fleet.nodes:
        left = dep.leftovers(name)
        # tcp_retries2 back to the node's own (the kernel's default in the node's fresh network namespace)
        assert left == {"containers": [], "processes": [], "ports": [], "files": [], "hugepages": "0",
                        "tcp_retries2": "15"}, (name, left)


def test_up_after_destroy_serves_again(dep: rc.RealCluster):
    on_a2_only(dep)
    run = dep.project.up()
    assert run.ok, (run.error or "")[-6000:]
    dep.wait_serving()


def test_destroy_leaves_nothing(dep: rc.RealCluster):
    run = dep.project.destroy()
    assert run.ok, run.error
    FIGURES[dep.stack]["destroy_s"] = round(run.seconds, 1)
    for name in dep.fleet.nodes:
        left = dep.leftovers(name)
        # tcp_retries2 back to the node's own (the kernel's default in the node's fresh network namespace)
        assert left == {"containers": [], "processes": [], "ports": [], "files": [], "hugepages": "0",
                        "tcp_retries2": "15"}, (name, left)
        assert "ascend_pd" not in dep.fleet.nodes[name].sh("nft list tables").stdout, name  # the firewall too
