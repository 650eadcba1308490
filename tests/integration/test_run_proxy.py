"""The rendered PD proxy create/delete, run for real: the release's own proxy script (vllm-ascend
0.18.0 for a3-4node, 0.20.2rc1 for a2-8node and 0.23.0.post1 for a2-8node upgraded as docs/changes.md
says, fetched by tests/proxy_release.py) with the argv the plan
renders, in front of fake ranks that hand KV from prefill to decode the way the Mooncake connector
does. The smoke completion must prove that a prefill and a decode rank both served it; a broken decode
side, a decode-only fallback and a bypassed prefill are each reported as such."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import requests

import proxy_release
import release_upgrade
import run_harness as harness
from proxy_key import AUTH

from ascend_pd import releases

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 120  # the release proxy needs 2-7 s to listen, over 30 s at a load average of 400
SHORT_READY_TIMEOUT_S = 10  # the config's minimum, where a proxy already runs and the wait is the test
PD_SMOKE = harness.PROJECT_DIR / "ascend_pd" / "shell" / "pd_smoke.py"


def launches(c: harness.Cluster, nodes=None) -> list[tuple[str, str]]:
    return [(n, harness.launch_name(c, n)) for n in (nodes or c.nodes)]


@pytest.fixture(scope="module")
def stack(workdir: Path) -> harness.Cluster:
    harness.require_tools("curl", "setsid")
    c = harness.Cluster("a3-4node", workdir / "a3", overrides={"proxy": {"readyTimeoutS": READY_TIMEOUT_S}})
    c.run_many(launches(c))
    yield c
    c.run(c.any_plan.proxy.node, "proxy", "delete", check=False)
    c.run_many(launches(c), "delete", check=False)


def role_nodes(c: harness.Cluster, role: str) -> list[str]:
    return sorted({r.node for r in c.any_plan.ranks_of(role)})


def proxy_pids(c: harness.Cluster) -> list[int]:
    p = c.any_plan.proxy
    return [pid for pid in harness.processes_matching([proxy_release.SCRIPT_NAME, p.address])
            if dict(zip(harness.cmdline(pid), harness.cmdline(pid)[1:])).get("--port") == str(p.port)]


def counter(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and 'finished_reason="error"' not in line)


def relaunch(c: harness.Cluster, role: str, env: dict | None = None) -> None:
    """Restart a role's ranks, with `env` (a fault switch) or without."""
    nodes = role_nodes(c, role)
    c.run_many(launches(c, nodes), "delete")
    c.run_many(launches(c, nodes), env=env)


def test_release_proxy_serves_through_prefill_and_decode(stack: harness.Cluster):
    c = stack
    p = c.any_plan.proxy
    r = c.run(p.node, "proxy")
    assert f"proxy ready at {p.url} (2 prefill, 2 decode)" in r.stdout
    assert re.search(rf"smoke completion ok via {re.escape(p.url)}: prefill http://\S+ and decode http://\S+ in "
                     r"[0-9.]+s: '\S", r.stdout), r.stdout
    assert r.stderr == ""  # polling before the proxy listens must stay quiet
    pid = c.pid(p.node, "proxy")
    assert harness.alive(pid)
    assert harness.cmdline(pid) == list(p.argv)
    # The release's script, unedited, through the launcher that keeps removed instances out.
    assert harness.cmdline(pid)[1] == str(c.run_dir(p.node) / "pd_proxy_launch.py")
    assert str(proxy_release.for_stack("a3-4node")) in harness.cmdline(pid)
    assert "pd_proxy_launch: proxy-state: an instance given to /instances/remove stays out" in \
        (c.log_dir(p.node) / "proxy.log").read_text()
    assert not {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"} & set(harness.environ(pid))
    health = requests.get(f"{p.url}/healthcheck", timeout=5).json()
    assert (health["prefill_instances"], health["decode_instances"]) == (2, 2)

    plan = c.any_plan
    prefill = [f"http://{r.address}:{r.port}" for r in plan.ranks_of("prefill")]
    decode = [f"http://{r.address}:{r.port}" for r in plan.ranks_of("decode")]
    served = sum(counter(u, "vllm:request_success_total") for u in prefill)
    loaded = sum(counter(u, "vllm:external_prefix_cache_hits_total") for u in decode)
    answer = requests.post(f"{p.url}/v1/completions", timeout=30, headers=AUTH, json={
        "model": plan.cfg.model.served_name, "prompt": "hello " * 50, "max_tokens": 4}).json()
    assert answer["choices"][0]["text"]
    # The prompt (300 characters, 75 tokens) was computed by prefill and loaded by decode.
    assert sum(counter(u, "vllm:request_success_total") for u in prefill) == served + 1
    assert sum(counter(u, "vllm:external_prefix_cache_hits_total") for u in decode) == loaded + 75

    again = c.run(p.node, "proxy")
    assert "proxy: already running" in again.stdout and "smoke completion ok" in again.stdout
    assert c.pid(p.node, "proxy") == pid

    gone = c.run(p.node, "proxy", "delete")
    assert "proxy stopped" in gone.stdout
    assert not harness.alive(pid) and not proxy_pids(c)
    assert not (c.run_dir(p.node) / "proxy.pid").exists()
    assert c.run(p.node, "proxy", "delete").returncode == 0


def assert_failed_and_stopped(c: harness.Cluster, r) -> None:
    assert r.returncode != 0
    assert "smoke completion through the proxy failed" in r.stderr, r.stderr
    assert not proxy_pids(c), "a proxy that failed its check must not stay up"
    assert not (c.run_dir(c.any_plan.proxy.node) / "proxy.pid").exists()


def test_broken_decode_side_is_reported(stack: harness.Cluster):
    """Every decode fails its KV load: the release proxy answers HTTP 200 with an empty body."""
    c = stack
    relaunch(c, "decode", {"FAKE_VLLM_FAULT": "transfer-fail"})
    try:
        r = c.run(c.any_plan.proxy.node, "proxy", check=False)
        assert_failed_and_stopped(c, r)
        assert re.search(r"HTTP 200 with an empty body: the decode side failed \(decode rank http://\S+ failed "
                         r"the request\)", r.stderr), r.stderr
    finally:
        relaunch(c, "decode")


def test_decode_only_fallback_is_reported(stack: harness.Cluster):
    """Prefill answers without kv_transfer_params: decode computes the prompt itself and answers."""
    c = stack
    relaunch(c, "prefill", {"FAKE_VLLM_FAULT": "no-kv-params"})
    try:
        r = c.run(c.any_plan.proxy.node, "proxy", check=False)
        assert_failed_and_stopped(c, r)
        assert re.search(r"decode-only fallback '[^']+': decode rank http://\S+ computed the prompt itself; "
                         r"no decode rank received KV from prefill", r.stderr), r.stderr
    finally:
        relaunch(c, "prefill")


def test_bypassed_prefill_is_reported(stack: harness.Cluster, workdir: Path):
    """The llm-d failure: a port mismatch points the proxy's prefill list at decode ranks. The release
    proxy serves every request, healthcheck green; no prefill rank ever sees one."""
    c = stack
    plan = c.any_plan
    decoders = plan.proxy.decoders
    port = plan.proxy.port + 7
    argv = [harness.PYTHON, str(proxy_release.for_stack("a3-4node")), "--host", plan.proxy.address,
            "--port", str(port), "--prefiller-hosts", *[h for h, _ in decoders],
            "--prefiller-ports", *[str(p) for _, p in decoders],
            "--decoder-hosts", *[h for h, _ in decoders], "--decoder-ports", *[str(p) for _, p in decoders]]
    log = open(workdir / "mismatched-proxy.log", "wb")
    # Without the container's http_proxy, as the proxy script starts it: httpx would obey it.
    env = {k: v for k, v in c.env(plan.proxy.node).items() if k not in harness.PROXY_ENV}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://{plan.proxy.address}:{port}"
    try:
        harness.wait_for(lambda: harness.http_ok(f"{url}/healthcheck"), READY_TIMEOUT_S, what="mismatched proxy")
        done = subprocess.run([harness.PYTHON, str(PD_SMOKE), url, plan.cfg.model.served_name, "30",
                               plan.proxy.backends_json, "8"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stdout
        assert re.search(r"decode-only answer '[^']+': no prefill rank of 2 served the request \(prefill bypassed\)",
                         done.stderr), done.stderr
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


def test_proxy_missing_an_instance_fails_within_the_deadline(stack: harness.Cluster):
    """A running proxy that lost a decode instance (removed through /instances/remove and never added
    back): the create finds it running, and its /healthcheck never reports the plan's counts."""
    stack.run(stack.any_plan.proxy.node, "proxy")
    # The same nodes and files, with the config's shortest deadline for the failing run.
    c = harness.Cluster("a3-4node", stack.tmp, overrides={"proxy": {"readyTimeoutS": SHORT_READY_TIMEOUT_S}})
    p = c.any_plan.proxy
    host, port = p.decoders[0]
    removed = requests.post(f"{p.url}/instances/remove", timeout=10,
                            json={"type": "decode", "instances": [f"{host}:{port}"]}).json()
    assert f"{host}:{port}" not in removed["current_decode_instances"]
    r = c.run(p.node, "proxy", check=False)
    assert r.returncode != 0
    # Deadlines count bash's whole $SECONDS: up to one second short of the nominal value.
    assert SHORT_READY_TIMEOUT_S - 1 <= r.elapsed < SHORT_READY_TIMEOUT_S + 60  # a loaded machine: generous
    assert f"did not report 2 prefill + 2 decode instances within {SHORT_READY_TIMEOUT_S}s" in r.stderr
    assert re.search(r'"decode_instances":\s*1\b', r.stderr), r.stderr
    assert "--- last lines of" in r.stderr
    assert not proxy_pids(c)


def test_proxy_that_exits_at_start_fails_with_its_log(stack: harness.Cluster, workdir: Path):
    broken = harness.Cluster("a3-4node", workdir / "a3", overrides={"proxy": {
        "readyTimeoutS": READY_TIMEOUT_S, "script": str(workdir / "missing_proxy.py")}})
    p = broken.any_plan.proxy
    r = broken.run(p.node, "proxy", check=False)
    assert r.returncode != 0
    assert r.elapsed < READY_TIMEOUT_S
    assert "the proxy exited before /healthcheck answered" in r.stderr
    assert "missing_proxy.py" in r.stderr and "No such file or directory" in r.stderr  # the log tail
    broken.run(p.node, "proxy", "delete")


def test_decoders_down_fail_the_smoke(stack: harness.Cluster):
    """Counts are right (they come from the argv) but the decoders are down: the release proxy still
    answers HTTP 200, with nothing in it."""
    c = stack
    nodes = role_nodes(c, "decode")
    c.run_many(launches(c, nodes), "delete")
    try:
        r = c.run(c.any_plan.proxy.node, "proxy", check=False)
        assert_failed_and_stopped(c, r)
        assert "HTTP 200 with an empty body: the decode side failed (no decode rank finished it)" in r.stderr
    finally:
        c.run_many(launches(c, nodes))


@pytest.fixture(scope="module", params=["0.20.2rc1", release_upgrade.RELEASE])
def a2(request, workdir: Path) -> harness.Cluster:
    """a2-8node as committed (0.20.2rc1), and upgraded to 0.23.0.post1 as docs/changes.md says."""
    harness.require_tools("curl", "setsid")
    upgrade = release_upgrade.overrides("a2-8node") if request.param == release_upgrade.RELEASE else {}
    c = harness.Cluster("a2-8node", workdir / f"a2-{request.param}",
                        overrides={**upgrade, "proxy": {"readyTimeoutS": READY_TIMEOUT_S}})
    yield c
    c.run(c.any_plan.proxy.node, "proxy", "delete", check=False)
    c.run_many(launches(c), "delete", check=False)


def test_a2_release_proxy_serves_all_forty_ranks(a2: harness.Cluster):
    """Each release's proxy in front of 4 prefill instances (8 ranks, tp 4) and one DP32 decode instance:
    0.20.2rc1's `ProxyState` and 0.23.0.post1's rewritten `SharedProxyScheduler`, both through the launcher."""
    c = a2
    c.run_many(launches(c))
    p = c.any_plan.proxy
    r = c.run(p.node, "proxy")
    assert f"proxy ready at {p.url} (8 prefill, 32 decode)" in r.stdout
    assert "smoke completion ok" in r.stdout
    release = releases.release_named(c.any_plan.node(p.node).image)
    assert release == ("0.20.2rc1" if "0.20.2rc1" in c.tmp.name else release_upgrade.RELEASE)
    assert str(proxy_release.for_release(release)) in harness.cmdline(c.pid(p.node, "proxy"))
    # Every prefill rank's side channel is where the plan put it (kv_port + dp_rank * tp).
    for rank in c.any_plan.ranks_of("prefill"):
        log = (c.log_dir(rank.node) / f"{rank.name}.log").read_text()
        kv = json.loads(rank.kv_transfer_config)
        first = int(kv["kv_connector_extra_config"]["connectors"][0]["kv_port"]) + rank.dp_rank * rank.tp
        assert f"{rank.address}:{first}-{first + rank.tp - 1}" in log, rank.name
