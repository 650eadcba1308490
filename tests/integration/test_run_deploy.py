"""A whole a3-4node deployment in the resource graph's order, every script sent exactly as the
components send it (`docker exec -i <container> bash -s <<'HEREDOC'`, with a stand-in `docker` that
execs locally), then destroyed in reverse order, leaving nothing behind.

    etcd (p0) -> worker (every node) -> launch (every instance x node) -> proxy (p0) -> probes (every node)

The probes it installs are then run against the live deployment.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import requests

import run_harness as harness
from proxy_key import AUTH

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def deployment(workdir: Path):
    harness.require_tools(harness.ETCD_BINARY, "curl", "dscli", "setsid")
    c = harness.Cluster("a3-4node", workdir, transport="pulumi")
    yield c
    destroy(c, check=False)


def launches(c: harness.Cluster) -> list[tuple[str, str]]:
    return [(n, "launch") for inst in c.any_plan.instances for n in inst.nodes]


def destroy(c: harness.Cluster, check: bool = True) -> None:
    c.run_many([(n, "probes") for n in c.nodes], "delete", check=check)
    c.run(c.any_plan.proxy.node, "proxy", "delete", check=check)
    c.run_many(launches(c), "delete", check=check)
    c.run_many([(n, "worker") for n in c.nodes], "delete", check=check)
    c.run(c.etcd_node, "etcd", "delete", check=check)


def test_deploy_in_graph_order(deployment: harness.Cluster):
    c = deployment
    plan = c.any_plan
    c.run(c.etcd_node, "etcd")
    c.run_many([(n, "worker") for n in c.nodes])
    c.run_many(launches(c))
    r = c.run(plan.proxy.node, "proxy")
    assert "smoke completion ok" in r.stdout
    c.run_many([(n, "probes") for n in c.nodes])

    # Every rank's DS_WORKER_ADDR names a worker registered in etcd, on the rank's own node.
    registered = {k.rsplit("/", 1)[1] for k in harness.etcd_keys(c, "/datasystem/cluster/")}
    assert registered == {c.plans[n].worker(n).address for n in c.nodes}
    for n in c.nodes:
        for rank in harness.ranks_on(c, n):
            env = harness.environ(c.pid(n, rank.name))
            assert env["DS_WORKER_ADDR"] in registered
            assert env["DS_WORKER_ADDR"].split(":")[0] == c.address(n)
    # Daemons hold neither the exec session's stdin (the script) nor its output.
    for n in c.nodes:
        (pid,) = harness.worker_pids(c.plans[n].worker(n).address)
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        for rank in harness.ranks_on(c, n):
            assert os.readlink(f"/proc/{c.pid(n, rank.name)}/fd/0") == "/dev/null"

    # Served end to end: proxy -> prefill rank -> decode rank.
    answer = requests.post(f"{plan.proxy.url}/v1/chat/completions", timeout=10, headers=AUTH, json={
        "model": plan.cfg.model.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
    }).json()
    assert answer["choices"][0]["message"]["content"]
    # And the KV pool spans the nodes: written through a prefill node's worker, read on a decode node.
    assert harness.kv(c, "p1", "set", "deploy-key", "pooled").returncode == 0
    assert harness.kv(c, "d0", "get", "deploy-key").stdout.strip() == "pooled"


def test_second_up_changes_nothing(deployment: harness.Cluster):
    c = deployment
    pids = {(n, r.name): c.pid(n, r.name) for n in c.nodes for r in harness.ranks_on(c, n)}
    workers = {n: harness.worker_pids(c.plans[n].worker(n).address) for n in c.nodes}
    etcd, proxy = c.pid(c.etcd_node, "etcd"), c.pid(c.any_plan.proxy.node, "proxy")
    c.run(c.etcd_node, "etcd")
    c.run_many([(n, "worker") for n in c.nodes])
    c.run_many(launches(c))
    c.run(c.any_plan.proxy.node, "proxy")
    assert {(n, r.name): c.pid(n, r.name) for n in c.nodes for r in harness.ranks_on(c, n)} == pids
    assert {n: harness.worker_pids(c.plans[n].worker(n).address) for n in c.nodes} == workers
    assert (c.pid(c.etcd_node, "etcd"), c.pid(c.any_plan.proxy.node, "proxy")) == (etcd, proxy)


def probe(c: harness.Cluster, node: str, name: str, *, proxy_env: bool = False) -> subprocess.CompletedProcess:
    """Run an installed probe as a monitor would (`docker exec <container> <probe>`), by default
    without the container's proxy variables."""
    env = c.env(node)
    if not proxy_env:
        for k in harness.PROXY_ENV:
            env.pop(k, None)
    path = Path(c.plans[node].cfg.state_dir) / "probes" / name
    return subprocess.run([str(path)], env=env, capture_output=True, text=True, timeout=150)


def test_installed_probes_pass_on_the_live_deployment(deployment: harness.Cluster):
    c = deployment
    for n in c.nodes:
        r = probe(c, n, "liveness.sh")
        assert r.returncode == 0 and f"liveness {n}: OK" in r.stdout, r.stdout + r.stderr
    r = probe(c, c.any_plan.proxy.node, "readiness.sh")
    assert r.returncode == 0, r.stdout + r.stderr


def test_installed_probes_ignore_the_container_proxy(deployment: harness.Cluster):
    c = deployment
    r = probe(c, c.etcd_node, "liveness.sh", proxy_env=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_probe_names_a_dead_rank_and_up_heals_it(deployment: harness.Cluster):
    c = deployment
    node = "d0"
    (rank,) = harness.ranks_on(c, node)
    pid = c.pid(node, rank.name)
    os.killpg(pid, 9)
    harness.wait_for(lambda: not harness.alive(pid), 10, what="killed rank to exit")
    r = probe(c, node, "liveness.sh")
    assert r.returncode == 1 and rank.name in r.stdout, r.stdout
    others = {n: c.pid(n, x.name) for n in c.nodes for x in harness.ranks_on(c, n) if n != node}
    # `pulumi up` runs the launch again: the dead rank starts, nothing else moves.
    up = c.run(node, "launch")
    assert f"{rank.name}: started pid" in up.stdout
    assert {n: c.pid(n, x.name) for n in c.nodes for x in harness.ranks_on(c, n) if n != node} == others
    assert probe(c, node, "liveness.sh").returncode == 0


def test_destroy_in_reverse_order_leaves_nothing(deployment: harness.Cluster):
    c = deployment
    destroy(c)
    assert harness.our_processes(c.tmp) == []
    assert not Path(c.any_plan.etcd.data_dir).exists()
    for n in c.nodes:
        assert not (Path(c.plans[n].worker(n).workdir) / "datasystem").exists()
        assert not (c.home(n) / ".datasystem").exists()
        assert list(c.run_dir(n).glob("*.pid")) == []
        assert not (Path(c.plans[n].cfg.state_dir) / "probes").exists()


def test_delete_when_the_container_is_gone_is_a_no_op(deployment: harness.Cluster):
    c = deployment
    r = c.run("d1", "worker", "delete", env={"FAKE_DOCKER_NO_CONTAINER": "1"})
    assert "container yr_glm5 is gone: nothing to do" in r.stdout
