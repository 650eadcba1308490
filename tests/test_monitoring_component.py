"""Prometheus deployed by `pulumi up` (`monitoring.node`, ascend_pd/components/prometheus_server.py).

Under the SDK's mocks: unset, nothing of it exists; set, its Commands, image and container sit on that
node (its SSH address, its docker provider) after the proxy, with the exact container arguments,
mounts and name; the config Command carries exactly `monitoring.files(...)`; a changed rule re-runs
the config and the reload but leaves the container alone, and `diff` says so (reload, no restart; an
image: a restart; neither a serving impact). The settings are validated by name.

For real: the rendered config script, wrapped as Pulumi sends it, writes the files byte for byte
into a temp directory and removes stale ones; a real Prometheus (Debian's) runs on them as nobody
with the container's arguments; the rendered reload makes it take a changed threshold in place (and
fails with Prometheus' own error on a broken rule); the delete keeps the files while a container
mounts them, otherwise removes config/ and keeps data/. Hostile values never execute, and shellcheck
passes on every script and wrapper.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from pulumi_harness import COMMAND, CONTAINER, DOCKER_PROVIDER, IMAGE, PROJECT, run_program, stack_config, with_host_keys, \
    stack_output, unwrap

from ascend_pd import docs, scripts, shell
from ascend_pd.change import compare
from ascend_pd.change.sources import Side, working_tree
from ascend_pd.engine.capture import mock_image_id
from ascend_pd.engine.model import DELETE_REPLACED, REPLACE, UPDATE, plan_up
from ascend_pd.errors import ConfigError
from ascend_pd.loader import PROJECT_DIR, cli_config_map, load_config
from ascend_pd.monitoring import files
from ascend_pd.plan import build_plan
from ascend_pd.render import write_scripts
from ascend_pd.scripts.prometheus import (CONTAINER_CONFIG, CONTAINER_DATA, FILE_DELIMITER, PROMETHEUS_UID, digest,
                                          server)

STACKS = ("a2-8node", "a3-4node")
STACK = "a3-4node"
NODE = "d1"  # not the proxy's or etcd's node (p0): the resources must go where monitoring.node says
PARTS = ("config", "image", "container", "reload")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def monitoring_raw(stack: str = STACK, **settings) -> dict[str, str]:
    """The stack's CLI map with `ascend-pd:monitoring` set to `settings`."""
    raw = stack_config(stack)
    raw[f"{PROJECT}:monitoring"] = json.dumps(settings)
    return raw


def plan_with(stack: str = STACK, name: str | None = None, **settings):
    flat = cli_config_map(stack)
    flat["monitoring"] = json.dumps(settings)
    return build_plan(load_config(flat), name or stack)


def inner(wrapped: str) -> str:
    """The script inside the transport wrapper (`bash -s <<'ASCEND_PD_SCRIPT' ... ASCEND_PD_SCRIPT`)."""
    head = f"bash -s <<'{shell.SCRIPT_DELIMITER}'\n"
    assert wrapped.startswith(head) and wrapped.endswith(f"\n{shell.SCRIPT_DELIMITER}\n"), wrapped[:200]
    return wrapped[len(head):-len(f"{shell.SCRIPT_DELIMITER}\n")]


FILE_BLOCK = re.compile(rf"^cat > \"\$config_dir\"/(\S+) <<'{FILE_DELIMITER}'\n(.*?)^{FILE_DELIMITER}\n", re.S | re.M)


def carried_files(script: str) -> dict[str, str]:
    """The files a rendered config script writes: each heredoc's body under its path."""
    out = {}
    for token, body in FILE_BLOCK.findall(script):
        (path,) = shlex.split(token)
        assert path.endswith(".tmp")
        out[path[: -len(".tmp")]] = body
    listed = re.search(r"^files=\((.*)\)$", script, re.M)
    assert listed and shlex.split(listed.group(1)) == list(out), "the files array names every written file"
    return out


# ---------------------------------------------------------------------------------------------
# The graph


@pytest.mark.parametrize("stack", STACKS)
def test_unset_deploys_nothing(stack):
    plan = plan_with(stack)
    assert plan.cfg.monitoring.node is None and server(plan) is None
    run = run_program(stack_config(stack), stack=stack)
    assert not run.of_type("ascend-pd:index:PrometheusServer")
    assert not [r.name for r in run.regs if "prometheus" in r.name]
    assert stack_output("proxyUrl")
    with pytest.raises(KeyError):
        stack_output("prometheusUrl")
    assert not [s for n in plan.nodes for s in scripts.node_scripts(plan, n.name) if s.name.startswith("prometheus")]


def test_set_runs_prometheus_on_that_node():
    run = run_program(monitoring_raw(node=NODE), stack=STACK)
    plan = plan_with(node=NODE)
    node = plan.node(NODE)
    (component,) = run.of_type("ascend-pd:index:PrometheusServer")
    assert component.name == "prometheus"
    for part in PARTS:  # every resource of it is a child of it
        assert run.named(f"{NODE}-prometheus-{part}").parent == component.urn
    assert {r.name for r in run.regs if "prometheus" in r.name} == {"prometheus"} | {
        f"{NODE}-prometheus-{p}" for p in PARTS}

    # Docker: the node's own provider (the NPU container's), not another node's.
    provider = run.named(f"{NODE}-docker")
    assert provider.type == DOCKER_PROVIDER and f"@{node.address}:" in provider.inputs["host"]
    image, container = run.named(f"{NODE}-prometheus-image"), run.named(f"{NODE}-prometheus-container")
    for reg in (image, container):
        assert reg.provider.rsplit("::", 1)[0] == provider.urn, reg.name
    assert image.type == IMAGE
    assert image.inputs["name"] == "quay.io/prometheus/prometheus:v2.53.4" and image.inputs["keepLocally"] is True

    c = container.inputs
    assert container.type == CONTAINER
    assert c["name"] == "ascend-pd-prometheus"
    assert c["networkMode"] == "host"
    assert c["command"] == ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                            "--storage.tsdb.retention.time=15d", "--web.listen-address=:9090",
                            "--web.enable-lifecycle"]
    assert c["volumes"] == [
        {"hostPath": "/var/lib/ascend-pd/prometheus/config", "containerPath": "/etc/prometheus", "readOnly": True},
        {"hostPath": "/var/lib/ascend-pd/prometheus/data", "containerPath": "/prometheus", "readOnly": False}]
    assert c["restart"] == "unless-stopped" and c["mustRun"] is True
    assert c["user"] == f"{PROMETHEUS_UID}:{PROMETHEUS_UID}"
    assert c["image"] == mock_image_id("quay.io/prometheus/prometheus:v2.53.4")  # the pulled image's id
    assert {"label": "ascend-pd.node-address", "value": node.address} in c["labels"]
    assert container.delete_before_replace  # a fixed name

    # The Commands run on that node's host, over its SSH.
    for part in ("config", "reload"):
        cmd = run.named(f"{NODE}-prometheus-{part}")
        assert cmd.type == COMMAND and unwrap(cmd.inputs["connection"])["host"] == node.address
        assert cmd.delete_before_replace and cmd.inputs["addPreviousOutputInEnv"] is False
        assert inner(cmd.inputs["create"]).startswith("#!/usr/bin/env bash\n")
    assert stack_output("prometheusUrl") == f"http://{node.address}:9090"

    # Other settings reach the same places.
    run = run_program(monitoring_raw(node=NODE, port=19090, retentionDays=3, containerName="prom",
                                     dir="/srv/prom", image="registry.example:5000/prom/prometheus:v2.53.4"),
                      stack=STACK)
    c = run.named(f"{NODE}-prometheus-container").inputs
    assert c["name"] == "prom"
    assert "--storage.tsdb.retention.time=3d" in c["command"] and "--web.listen-address=:19090" in c["command"]
    assert [v["hostPath"] for v in c["volumes"]] == ["/srv/prom/config", "/srv/prom/data"]
    assert run.named(f"{NODE}-prometheus-image").inputs["name"] == "registry.example:5000/prom/prometheus:v2.53.4"
    assert stack_output("prometheusUrl") == f"http://{node.address}:19090"


def test_it_waits_for_the_proxy_and_nothing_serving_waits_for_it():
    run = run_program(monitoring_raw(node=NODE), stack=STACK)
    proxy = run.named("p0-proxy")  # the proxy's Command (PdProxy's only child)
    mine = [run.named(f"{NODE}-prometheus-{p}") for p in PARTS]
    for reg in mine + [run.named("prometheus")]:
        assert run.waits_for(reg, proxy), reg.name
    for reg in mine:  # and, as everything on a node, for that node's preflight gate
        assert run.waits_for(reg, run.named(f"{NODE}-preflight")), reg.name
    container, config, image = (run.named(f"{NODE}-prometheus-{p}") for p in ("container", "config", "image"))
    assert run.waits_for(container, config) and run.waits_for(container, image)
    assert run.waits_for(run.named(f"{NODE}-prometheus-reload"), container)
    urns = {r.urn for r in mine}
    for reg in run.regs:
        if "prometheus" not in reg.name:
            assert not run.ancestors(reg) & urns, reg.name
    # The container's inputs do not derive from the configuration: order only.
    assert not any(config.urn in deps for deps in container.property_dependencies.values())


def test_the_config_command_carries_exactly_the_generated_files():
    plan = plan_with(node=NODE)
    run = run_program(monitoring_raw(node=NODE), stack=STACK)
    cmd = run.named(f"{NODE}-prometheus-config")
    script = inner(cmd.inputs["create"])
    assert script == scripts.prometheus_config(plan).create  # passed through untouched
    want = files(plan, plan.cfg.monitoring)
    assert carried_files(script) == want
    assert set(want) >= {"prometheus.yml", "rules/recording.yml", "rules/alerts.yml", "targets/prefill.json",
                         "targets/decode.json", "targets/etcd.json"}
    sha = digest(want)
    assert sha in cmd.inputs["triggers"] and sha in run.named(f"{NODE}-prometheus-reload").inputs["triggers"]
    assert plan.node(NODE).address in cmd.inputs["triggers"]


def test_a_changed_rule_reruns_config_and_reload_not_the_container():
    before = run_program(monitoring_raw(node=NODE), stack=STACK)
    after = run_program(monitoring_raw(node=NODE, hitRateDropPercent=50), stack=STACK)
    cfg_before, cfg_after = before.named(f"{NODE}-prometheus-config"), after.named(f"{NODE}-prometheus-config")
    assert cfg_before.inputs["triggers"] != cfg_after.inputs["triggers"]
    assert "0.5 *" in cfg_after.inputs["create"] and "0.7 *" in cfg_before.inputs["create"]
    for part in ("container", "image"):
        a, b = before.named(f"{NODE}-prometheus-{part}"), after.named(f"{NODE}-prometheus-{part}")
        assert a.inputs == b.inputs, part
    assert before.named(f"{NODE}-prometheus-reload").inputs["triggers"] != \
        after.named(f"{NODE}-prometheus-reload").inputs["triggers"]
    # The engine model: the configuration and the reload are replaced (old delete first), nothing else acts.
    acting = {(s.op, s.name) for s in plan_up(before.regs, after) if s.acts}
    assert acting == {(op, f"{NODE}-prometheus-{part}") for op in (DELETE_REPLACED, REPLACE)
                      for part in ("config", "reload")}


def test_converge_reruns_the_config_and_the_reload_as_updates():
    before = run_program(monitoring_raw(node=NODE), stack=STACK)
    raw = monitoring_raw(node=NODE)
    raw[f"{PROJECT}:converge"] = "7"
    after = run_program(raw, stack=STACK)
    ops = {s.name: s.op for s in plan_up(before.regs, after) if s.acts and "prometheus" in s.name}
    assert ops == {f"{NODE}-prometheus-config": UPDATE, f"{NODE}-prometheus-reload": UPDATE}


def test_former_node_names_become_aliases():
    raw = monitoring_raw(node="d1new")
    nodes = json.loads(raw[f"{PROJECT}:nodes"])
    d1 = next(n for n in nodes if n["name"] == "d1")
    d1.update(name="d1new", formerNames=["d1"])
    raw[f"{PROJECT}:nodes"] = json.dumps(nodes)
    decode = json.loads(raw[f"{PROJECT}:decode"])
    decode["nodes"] = ["d1new" if n == "d1" else n for n in decode["nodes"]]
    raw[f"{PROJECT}:decode"] = json.dumps(decode)
    run = run_program(with_host_keys(raw), stack=STACK)
    for part in PARTS:
        assert f"d1-prometheus-{part}" in run.named(f"d1new-prometheus-{part}").aliases, part


def test_diff_says_reload_for_a_rule_and_restart_for_an_image():
    base = working_tree(STACK, PROJECT_DIR)

    def side(**m) -> Side:
        return Side("edited", {**base.config, f"{PROJECT}:monitoring": json.dumps(m)})

    on = side(node=NODE)
    rule = compare(STACK, on, side(node=NODE, hitRateDropPercent=50))
    assert {(s.op, s.name) for s in rule.steps if s.op == REPLACE} == {
        (REPLACE, f"{NODE}-prometheus-config"), (REPLACE, f"{NODE}-prometheus-reload")}
    assert not [s for s in rule.steps if "container" in s.name or "image" in s.name]
    (note,) = [n for n in rule.effect.notes if "Prometheus" in n]
    assert "reloads its configuration" in note and "no restart" in note and "no serving impact" in note
    assert [r.verdict for r in rule.effect.roles] == ["unaffected", "unaffected"] and not rule.effect.processes

    image = compare(STACK, on, side(node=NODE, image="quay.io/prometheus/prometheus:v2.55.0"))
    assert (REPLACE, f"{NODE}-prometheus-container") in {(s.op, s.name) for s in image.steps}
    (note,) = [n for n in image.effect.notes if "Prometheus" in n]
    assert "restarts in a new container" in note and "v2.55.0" in note and "is kept" in note
    assert "no serving impact" in note
    assert not [n for n in image.effect.notes if "NPU container" in n]  # not mistaken for the NPU container
    assert [r.verdict for r in image.effect.roles] == ["unaffected", "unaffected"]

    added = compare(STACK, base, on)
    assert any(n.startswith(f"Prometheus starts on {NODE}") for n in added.effect.notes)
    removed = compare(STACK, on, base)
    assert any("removed at the end of the run" in n and "stays on the node" in n for n in removed.effect.notes)


def test_render_out_writes_its_scripts_on_that_node_only(tmp_path):
    plan = plan_with(node=NODE)
    write_scripts(plan, tmp_path)
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*prometheus*"))
    n = len(scripts.node_scripts(plan, NODE))
    assert found == [f"{NODE}/{n - 2:02d}-prometheus-config.create.sh", f"{NODE}/{n - 2:02d}-prometheus-config.delete.sh",
                     f"{NODE}/{n - 1:02d}-prometheus-reload.create.sh", f"{NODE}/{n - 1:02d}-prometheus-reload.delete.sh"]


def test_the_component_is_documented_for_the_reference_page():
    comp = next(c for c in docs.components() if c.name == "PrometheusServer")
    assert comp.token == "ascend-pd:index:PrometheusServer"
    assert set(comp.after) == {"NpuContainer", "PdProxy"} and "monitoring.node" in comp.per


# ---------------------------------------------------------------------------------------------
# Validation


def refused(**settings) -> str:
    with pytest.raises(ConfigError) as err:
        plan_with(**settings)
    return str(err.value)


def test_an_unknown_node_is_refused_by_name_with_a_suggestion():
    msg = refused(node="d11")
    assert "ascend-pd:monitoring.node: unknown node 'd11'" in msg
    assert "did you mean 'd1'?" in msg and "['p0', 'p1', 'd0', 'd1']" in msg
    assert "did you mean" not in refused(node="zz") and "ascend-pd:monitoring.node" in refused(node="zz")


@pytest.mark.parametrize("node, clash, setting", [
    ("p0", "the PD proxy", "proxy.port"),  # p0 runs the proxy and etcd
    ("p0", "etcd client", "etcd.clientPort"),
    ("d1", "decode rank port", "decode.portBase"),
    ("d1", "the openYuanrong worker", "yuanrong.port"),  # every node
])
def test_a_port_clash_names_monitoring_port(node, clash, setting):
    cfg = plan_with().cfg
    port = {"proxy.port": cfg.proxy.port, "etcd.clientPort": cfg.etcd.client_port,
            "decode.portBase": cfg.decode.port_base, "yuanrong.port": cfg.yuanrong.port}[setting]
    msg = refused(node=node, port=port)
    assert (f"ascend-pd:monitoring.port: port {port} on node {node} is also used by {clash} "
            f"(ascend-pd:{setting})") in msg, msg
    if setting in ("proxy.port", "etcd.clientPort"):
        assert server(plan_with(node="d1", port=port)).port == port  # where nothing else uses it, it is fine


def test_a_port_in_mooncakes_range_on_a_rank_node_is_refused():
    msg = refused(node="d1", port=21000)  # AscendDirect draws from 20000-36000 on 16-NPU nodes
    assert "ascend-pd:monitoring.port: Prometheus port 21000 on node d1 lies in Mooncake's AscendDirect range" in msg


def test_other_monitoring_settings_are_checked_only_when_deployed():
    assert "ascend-pd:monitoring.port" in refused(node="p1", port=9100)  # the node_exporter's
    assert "ascend-pd:monitoring.containerName" in refused(node="p1", containerName=plan_with().cfg.container.name)
    assert "ascend-pd:monitoring.dir" in refused(node="p1", dir="/etc/prometheus")
    assert "ascend-pd:monitoring.dir" in refused(node="p1", dir=plan_with().cfg.model.path)
    # Unset: nothing is deployed, so nothing of it can clash.
    plan_with(port=plan_with().cfg.proxy.port, containerName=plan_with().cfg.container.name)


# ---------------------------------------------------------------------------------------------
# For real: the rendered scripts in bash, a real Prometheus on the files

DOCKER_STUB = """#!/bin/sh
# docker as the scripts use it: STUB_DOCKER=absent says there is no such container; otherwise it
# runs (status $STUB_STATUS), mounts $STUB_MOUNTS, and its log is the file $STUB_LOG.
case "$1" in
  inspect)
    if [ "${STUB_DOCKER:-}" = absent ]; then echo "Error: No such container: ascend-pd-prometheus" >&2; exit 1; fi
    case "$*" in
      *Mounts*) printf '%s\\n' "${STUB_MOUNTS:-}" ;;
      *Status*) echo "${STUB_STATUS:-running}" ;;
      *) echo true ;;
    esac ;;
  logs) cat "${STUB_LOG:-/dev/null}" ;;
  start) echo "$2" ;;
esac
"""


def free_port() -> int:
    """A free port no planned service uses (and outside Mooncake's range the plan refuses on rank nodes)."""
    for port in range(19090, 19190):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 19090-19189")


@pytest.fixture()
def host_dir():
    """Outside pytest's private (0700) tmp tree: Prometheus runs as nobody and must read the files."""
    d = Path(tempfile.mkdtemp(prefix="apd-prom-", dir="/tmp"))
    d.chmod(0o755)
    (d / "bin").mkdir()
    (d / "bin" / "docker").write_text(DOCKER_STUB)
    (d / "bin" / "docker").chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_wrapped(script: str, host: Path, **env: str) -> subprocess.CompletedProcess:
    """`script` wrapped exactly as pulumi-command sends it, run by sh as the SSH session would."""
    full = {"PATH": f"{host / 'bin'}:/usr/bin:/bin", "HOME": str(host), "LC_ALL": "C", **env}
    return subprocess.run(["sh", "-c", shell.on_host(script)], env=full, capture_output=True, text=True, timeout=120)


def on_disk(config: Path) -> dict[str, bytes]:
    return {p.relative_to(config).as_posix(): p.read_bytes() for p in sorted(config.rglob("*")) if p.is_file()}


def rules(url: str) -> dict[str, str]:
    r = requests.get(f"{url}/api/v1/rules", timeout=5, proxies={"http": None})
    r.raise_for_status()
    return {rule["name"]: rule["query"] for g in r.json()["data"]["groups"] for rule in g["rules"]}


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the config script gives data/ to uid 65534: needs root, as on a node")
@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus (apt-get install prometheus)")
def test_the_rendered_scripts_for_real(host_dir: Path):
    port = free_port()
    mon = dict(node=NODE, dir=str(host_dir / "prom"), port=port)
    plan = plan_with(**mon)
    s = server(plan)
    config, data = Path(s.config_dir), Path(s.data_dir)
    want = {k: v.encode() for k, v in files(plan, plan.cfg.monitoring).items()}

    # Create: byte-identical files, data/ given to the container's user.
    r = run_wrapped(scripts.prometheus_config(plan).create, host_dir)
    assert r.returncode == 0, r.stderr
    assert on_disk(config) == want
    assert (data.stat().st_uid, data.stat().st_gid) == (PROMETHEUS_UID, PROMETHEUS_UID)
    assert all((config / f).stat().st_mode & 0o777 == 0o644 for f in want)
    # A stale file of an earlier configuration goes; a second run changes nothing.
    (config / "targets" / "gone.json").write_text("[]\n")
    (config / "old").mkdir()
    (config / "old" / "x.yml").write_text("x\n")
    r = run_wrapped(scripts.prometheus_config(plan).create, host_dir)
    assert r.returncode == 0, r.stderr
    assert "removed targets/gone.json" in r.stdout
    assert on_disk(config) == want and not (config / "old").exists()
    inode = config.stat().st_ino

    # Before Prometheus answers: a container that docker keeps restarting (its port taken, say) fails the
    # reload at once, with its log, not at the 300 s deadline.
    (host_dir / "crash.log").write_text("err=\"listen tcp :9090: bind: address already in use\"\n")
    t0 = time.monotonic()
    r = run_wrapped(scripts.prometheus_reload(plan).create, host_dir, STUB_STATUS="restarting",
                    STUB_LOG=str(host_dir / "crash.log"))
    assert r.returncode == 1 and "exits at start (its container is restarting)" in r.stderr, r.stderr
    assert "address already in use" in r.stderr and time.monotonic() - t0 < 30

    # Prometheus as the container runs it: its arguments, the two mounts mapped to the host paths, as nobody.
    args = [a.replace(CONTAINER_CONFIG, str(config)).replace(f"={CONTAINER_DATA}", f"={data}") for a in s.args]
    assert args[:2] == [f"--config.file={config}/prometheus.yml", f"--storage.tsdb.path={data}"]
    log = (host_dir / "prometheus.log").open("w")
    proc = subprocess.Popen(["setpriv", f"--reuid={PROMETHEUS_UID}", f"--regid={PROMETHEUS_UID}", "--clear-groups",
                             PROMETHEUS, *args, "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": "/usr/bin:/bin"}, cwd=host_dir, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        # The reload: waits for /-/ready, then POST /-/reload.
        r = run_wrapped(scripts.prometheus_reload(plan).create, host_dir)
        assert r.returncode == 0, r.stderr + (host_dir / "prometheus.log").read_text()
        assert "reloaded its configuration" in r.stdout
        assert "0.7 * " in rules(url)["AscendPdKvPoolHitRateDrop"]
        assert any(p.name.startswith("wal") or p.name == "lock" for p in data.iterdir())  # nobody writes the TSDB

        # A changed threshold: the same directory rewritten in place, reloaded, no restart.
        changed = plan_with(**mon, hitRateDropPercent=50)
        r = run_wrapped(scripts.prometheus_config(changed).create, host_dir)
        assert r.returncode == 0, r.stderr
        assert on_disk(config) == {k: v.encode() for k, v in files(changed, changed.cfg.monitoring).items()}
        assert config.stat().st_ino == inode  # what a running container's bind mount keeps seeing
        r = run_wrapped(scripts.prometheus_reload(changed).create, host_dir)
        assert r.returncode == 0, r.stderr
        assert "0.5 * " in rules(url)["AscendPdKvPoolHitRateDrop"]
        assert proc.poll() is None

        # A rule Prometheus refuses fails the reload with Prometheus' own words (why POST, not SIGHUP).
        alerts = config / "rules" / "alerts.yml"
        good = alerts.read_text()
        alerts.write_text(good.replace("expr: up{", "expr: up{{", 1))
        r = run_wrapped(scripts.prometheus_reload(changed).create, host_dir, STUB_LOG=str(host_dir / "prometheus.log"))
        assert r.returncode == 1 and "Prometheus refused the configuration (HTTP 500)" in r.stderr, r.stderr
        assert "rules/alerts.yml" in r.stderr.split("from its log", 1)[1]  # the log names the file
        assert proc.poll() is None  # and it serves on with the previous configuration
        assert "0.5 * " in rules(url)["AscendPdKvPoolHitRateDrop"]
        alerts.write_text(good)

        # The delete while a container mounts the directory (a replacement, old delete first): files stay.
        r = run_wrapped(scripts.prometheus_config(changed).delete, host_dir, STUB_MOUNTS=f"{data}\n{config}")
        assert r.returncode == 0, r.stderr
        assert on_disk(config) and "its files stay" in r.stdout
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()

    # Destroy: the container went first, so the configuration goes; the data stays.
    r = run_wrapped(scripts.prometheus_config(changed).delete, host_dir, STUB_DOCKER="absent")
    assert r.returncode == 0, r.stderr
    assert not config.exists() and data.is_dir() and any(data.iterdir())
    assert "the data in" in r.stdout
    # A docker that cannot answer stops the delete instead of guessing.
    config.mkdir()
    (host_dir / "bin" / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    r = run_wrapped(scripts.prometheus_config(changed).delete, host_dir)
    assert r.returncode == 1 and "Cannot connect" in r.stderr and config.exists()


@pytest.mark.integration
def test_hostile_values_never_execute(tmp_path):
    """Every string setting of `monitoring`, and the stack's name (which reaches the files' text), set to
    hostile text: refused naming the setting, or rendered into scripts that run (as nobody, stub
    docker and curl) without executing anything injected and write the files byte for byte."""
    from hostile_support import INJECTIONS, Sandbox, bash_n

    root = Path(tempfile.mkdtemp(prefix="apd-prom-hostile-", dir="/tmp"))
    root.chmod(0o755)
    try:
        box = Sandbox(root / "sb")
        (box.bin / "curl").write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = POST ] && { printf '\\n200'; exit 0; }; done\n"
                                      "exit 0\n")
        paths = root / "sb" / "paths"
        base = {"node": NODE, "dir": f"{paths}/prom"}
        tried = refused_n = ran = 0
        unnamed, failures = [], []

        def run(plan, label) -> None:
            nonlocal ran
            for script in scripts.prometheus(plan):
                for kind in ("create", "delete"):
                    text = getattr(script, kind)
                    assert bash_n(text).returncode == 0 and bash_n(shell.on_host(text), "sh").returncode == 0
                    r = box.run(shell.on_host(text), counts=(1, 1))
                    ran += 1
                    if r.returncode:
                        failures.append((label, script.name, kind, r.stderr[-300:]))
                    if kind == "create" and script.name == "prometheus-config":
                        got = on_disk(Path(server(plan).config_dir))
                        if got != {k: v.encode() for k, v in files(plan, plan.cfg.monitoring).items()}:
                            failures.append((label, "files differ"))

        for key in ("node", "dir", "image", "containerName", "exporter"):
            for value in INJECTIONS + tuple(f"{paths}/{h}" for h in INJECTIONS):
                tried += 1
                try:
                    plan = plan_with(**{**base, key: value})
                except ConfigError as exc:
                    refused_n += 1
                    if f"ascend-pd:monitoring.{key}" not in str(exc):
                        unnamed.append((key, value, str(exc)[:200]))
                    continue
                run(plan, (key, value))
        for value in INJECTIONS:  # the stack's name is in the files' text (labels, runbooks)
            tried += 1
            try:
                plan = plan_with(name=value, **base)
                run(plan, ("stack", value))
            except shell.UnsafeText:
                refused_n += 1  # its heredoc delimiter as a line: never rendered
        print(f"{tried} values tried: {refused_n} refused, {ran} scripts run")
        assert box.executions() == "", f"injected commands ran: {box.executions()}"
        assert not unnamed, unnamed[:3]
        assert not failures, failures[:3]
        assert refused_n and ran >= 4 * len(INJECTIONS), (tried, refused_n, ran)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("stack", STACKS)
def test_shellcheck_passes_on_the_scripts_and_their_wrappers(stack, tmp_path):
    plan = plan_with(stack, node=plan_with(stack).nodes[-1].name)
    names = []
    for script in scripts.prometheus(plan):
        for kind in ("create", "delete"):
            text = getattr(script, kind)
            assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
            (tmp_path / f"{script.name}.{kind}.sh").write_text(text)
            (tmp_path / f"{script.name}.{kind}.pulumi.sh").write_text("#!/bin/sh\n" + shell.on_host(text))
            names += [f"{script.name}.{kind}.sh", f"{script.name}.{kind}.pulumi.sh"]
    assert len(names) == 8
    proc = subprocess.run(["shellcheck", "--severity=style", *names], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_render_names_where_prometheus_and_the_exporter_run():
    from ascend_pd.render import summary

    plain = summary(plan_with())
    assert "prometheus" not in plain and "exporter" not in plain
    plan = plan_with(node=NODE, port=9191, exporter="10.0.0.9:9478")
    address = next(n.address for n in plan.nodes if n.name == NODE)
    text = summary(plan)
    assert f"prometheus http://{address}:9191  on {NODE} (container ascend-pd-prometheus, image " in text
    assert f"exporter   http://10.0.0.9:9478/metrics  (run `ascend-pd exporter --stack {STACK}` there)" in text
