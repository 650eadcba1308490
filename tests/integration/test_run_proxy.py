"""The rendered PD proxy create/delete, run for real against live fake ranks of the a3-4node stack,
with the fake proxy (tests/fakes/fake_proxy.py, same CLI and /healthcheck as vLLM-Ascend's) as
`ascend-pd:proxy.script` and this interpreter as `ascend-pd:proxy.python`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

import run_harness as harness

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 10  # the config's minimum: the failure cases wait this long


@pytest.fixture(scope="module")
def stack(workdir: Path) -> harness.Cluster:
    harness.require_tools("curl", "setsid")
    c = harness.Cluster("a3-4node", workdir, overrides={"proxy": {"readyTimeoutS": READY_TIMEOUT_S}})
    c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes])
    yield c
    c.run(c.any_plan.proxy.node, "proxy", "delete", check=False)
    c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes], "delete", check=False)


def proxy_pids(c: harness.Cluster) -> list[int]:
    p = c.any_plan.proxy
    return [pid for pid in harness.processes_matching(["fake_proxy.py", p.address])
            if dict(zip(harness.cmdline(pid), harness.cmdline(pid)[1:])).get("--port") == str(p.port)]


def test_proxy_passes_healthcheck_and_smoke_and_delete_stops_it(stack: harness.Cluster):
    c = stack
    p = c.any_plan.proxy
    r = c.run(p.node, "proxy")
    assert "smoke completion ok" in r.stdout
    assert f"proxy ready at {p.url} (2 prefill, 2 decode)" in r.stdout
    assert r.stderr == ""  # polling before the proxy listens must stay quiet
    pid = c.pid(p.node, "proxy")
    assert harness.alive(pid)
    assert harness.cmdline(pid) == list(p.argv)
    assert not {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"} & set(harness.environ(pid))
    health = requests.get(f"{p.url}/healthcheck", timeout=5).json()
    assert (health["prefill_instances"], health["decode_instances"]) == (2, 2)
    answer = requests.post(f"{p.url}/v1/completions", timeout=10, json={
        "model": c.any_plan.cfg.model.served_name, "prompt": "hello", "max_tokens": 4}).json()
    assert answer["choices"][0]["text"]

    again = c.run(p.node, "proxy")
    assert "proxy: already running" in again.stdout and "smoke completion ok" in again.stdout
    assert c.pid(p.node, "proxy") == pid

    gone = c.run(p.node, "proxy", "delete")
    assert "proxy stopped" in gone.stdout
    assert not harness.alive(pid) and not proxy_pids(c)
    assert not (c.run_dir(p.node) / "proxy.pid").exists()
    assert c.run(p.node, "proxy", "delete").returncode == 0


@pytest.mark.parametrize("hook, shown", [
    ({"FAKE_PROXY_REPORT_PREFILL": "1"}, r'"prefill_instances":\s*1\b'),
    ({"FAKE_PROXY_REPORT_DECODE": "3"}, r'"decode_instances":\s*3\b'),
], ids=["prefill-count", "decode-count"])
def test_wrong_instance_counts_fail_within_the_deadline(stack: harness.Cluster, hook: dict, shown: str):
    c = stack
    p = c.any_plan.proxy
    r = c.run(p.node, "proxy", env=hook, check=False)
    assert r.returncode != 0
    # Deadlines count bash's whole $SECONDS: up to one second short of the nominal value.
    assert READY_TIMEOUT_S - 1 <= r.elapsed < READY_TIMEOUT_S + 20
    assert f"did not report 2 prefill + 2 decode instances within {READY_TIMEOUT_S}s" in r.stderr
    assert "last /healthcheck:" in r.stderr and re.search(shown, r.stderr), r.stderr
    assert "--- last lines of" in r.stderr
    assert not proxy_pids(c), "a proxy that failed its check must not stay up"
    assert not (c.run_dir(p.node) / "proxy.pid").exists()


def test_proxy_that_exits_at_start_fails_with_its_log(stack: harness.Cluster, workdir: Path):
    broken = harness.Cluster("a3-4node", workdir, overrides={"proxy": {
        "readyTimeoutS": READY_TIMEOUT_S, "script": str(workdir / "missing_proxy.py")}})
    p = broken.any_plan.proxy
    r = broken.run(p.node, "proxy", check=False)
    assert r.returncode != 0
    assert r.elapsed < READY_TIMEOUT_S
    assert "the proxy exited before /healthcheck answered" in r.stderr
    assert "missing_proxy.py" in r.stderr and "No such file or directory" in r.stderr  # the log tail
    broken.run(p.node, "proxy", "delete")


def test_smoke_completion_failure_fails_create_and_stops_the_proxy(stack: harness.Cluster):
    """Counts are right (they come from the argv) but the decoders are down: the functional check
    catches it."""
    c = stack
    p = c.any_plan.proxy
    decode_nodes = sorted({r.node for r in c.any_plan.ranks_of("decode")})
    c.run_many([(n, harness.launch_name(c, n)) for n in decode_nodes], "delete")
    try:
        r = c.run(p.node, "proxy", check=False)
        assert r.returncode != 0
        assert "smoke completion" in r.stderr and "smoke completion through the proxy failed" in r.stderr
        assert not proxy_pids(c)
    finally:
        c.run_many([(n, harness.launch_name(c, n)) for n in decode_nodes])
