"""The rendered etcd create/delete, run for real with Debian's etcd on a loopback address."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import etcd3gw
import pytest
import requests

import run_harness as harness

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(workdir: Path) -> harness.Cluster:
    harness.require_tools(harness.ETCD_BINARY, "curl")
    return harness.Cluster("a3-4node", workdir)


def test_create_is_healthy_idempotent_and_delete_cleans(cluster: harness.Cluster):
    node, e = cluster.etcd_node, cluster.any_plan.etcd
    data_dir = Path(e.data_dir)

    first = cluster.run(node, "etcd")
    assert "etcd healthy at" in first.stdout
    pid = cluster.pid(node, "etcd")
    assert harness.alive(pid)
    assert requests.get(f"{e.client_url}/health", timeout=5).json()["health"] == "true"
    client = etcd3gw.client(host=e.address, port=e.client_port, timeout=5)
    client.put("/ascend-pd-itest/probe", "1")
    assert client.get("/ascend-pd-itest/probe") == [b"1"]
    assert data_dir.is_dir()
    # Exactly the rendered argv: the command line Pulumi shows is the one that runs.
    assert harness.cmdline(pid) == list(e.argv)
    # Started with the container's (proxy-laden) environment, but etcd only serves: nothing to check;
    # the health probe above went direct although http_proxy pointed at a dead proxy.

    again = cluster.run(node, "etcd")
    assert again.returncode == 0
    assert "already running" in again.stdout
    assert cluster.pid(node, "etcd") == pid and harness.alive(pid)
    assert again.elapsed < 20  # no start, no health wait; loose: CI is loaded

    gone = cluster.run(node, "etcd", "delete")
    assert gone.returncode == 0
    harness.wait_for(lambda: not harness.alive(pid), 5, what=f"etcd pid {pid} to exit")
    assert not harness.processes_matching([e.data_dir])
    assert not data_dir.exists()
    assert not (cluster.run_dir(node) / "etcd.pid").exists()

    # Deleting what is already gone is harmless (Pulumi may retry a delete).
    assert cluster.run(node, "etcd", "delete").returncode == 0


def test_create_after_delete_starts_empty(cluster: harness.Cluster):
    node, e = cluster.etcd_node, cluster.any_plan.etcd
    cluster.run(node, "etcd")
    client = etcd3gw.client(host=e.address, port=e.client_port, timeout=5)
    assert client.get("/ascend-pd-itest/probe") == []  # the data dir was removed, not reused
    cluster.run(node, "etcd", "delete")
    assert not harness.processes_matching([e.data_dir])


def test_killed_etcd_is_restarted_by_create(cluster: harness.Cluster):
    """A stale pid file (etcd died) must not make create report `already running`."""
    node, e = cluster.etcd_node, cluster.any_plan.etcd
    cluster.run(node, "etcd")
    pid = cluster.pid(node, "etcd")
    harness.kill_all([pid], grace=0)
    harness.wait_for(lambda: not harness.alive(pid), 5, what="killed etcd to exit")
    again = cluster.run(node, "etcd")
    assert "started pid" in again.stdout
    new = cluster.pid(node, "etcd")
    assert new != pid and harness.alive(new)
    assert requests.get(f"{e.client_url}/health", timeout=5).json()["health"] == "true"
    cluster.run(node, "etcd", "delete")
    assert not harness.alive(new)
    assert not Path(e.data_dir).exists()


def test_etcd_that_cannot_start_fails_with_its_log(cluster: harness.Cluster):
    """Port taken by someone else: create fails within its deadline and shows etcd's own error."""
    import socket

    node, e = cluster.etcd_node, cluster.any_plan.etcd
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind((e.address, e.client_port))
    blocker.listen(1)
    try:
        r = cluster.run(node, "etcd", check=False)
    finally:
        blocker.close()
    assert r.returncode != 0
    assert r.elapsed < cluster.any_plan.cfg.etcd.start_timeout_s + 15
    assert "etcd exited before it became healthy" in r.stderr or "not healthy" in r.stderr
    assert "--- last lines of" in r.stderr and "address already in use" in r.stderr
    assert not harness.processes_matching([e.data_dir])
    cluster.run(node, "etcd", "delete")


def test_image_mode_gate_waits_for_the_container_command(cluster: harness.Cluster):
    """etcd.image: docker runs the plan's argv as the etcd container's command. There is no docker
    engine here, so the test starts that very argv itself; the rendered health gate, run as in the
    NPU container, fails within its deadline naming the container's log while etcd is down, passes
    once it is healthy, and its delete leaves etcd alone (removing the container is docker's job)."""
    img = harness.Cluster(cluster.stack, cluster.tmp,
                          overrides={"etcd": {"image": "quay.io/coreos/etcd:v3.5.12", "startTimeoutS": 5}})
    node, e = img.etcd_node, img.any_plan.etcd
    assert e.argv == cluster.any_plan.etcd.argv  # same etcd either way

    down = img.run(node, "etcd", check=False)
    assert down.returncode == 1
    assert 4 <= down.elapsed < 15, down.elapsed  # bash's whole-second $SECONDS: up to 1 s short of 5
    assert "not healthy" in down.stderr and "docker logs ascend-pd-etcd" in down.stderr
    assert not harness.processes_matching([e.data_dir])  # the gate starts nothing itself

    etcd = subprocess.Popen(list(e.argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        up = img.run(node, "etcd")
        assert "etcd healthy at" in up.stdout
        assert img.run(node, "etcd", "delete").returncode == 0
        assert etcd.poll() is None
    finally:
        etcd.terminate()
        etcd.wait(timeout=10)
    shutil.rmtree(e.data_dir, ignore_errors=True)
