"""The rendered openYuanrong worker create/delete, run for real: one datasystem_worker per simulated
node of the a3-4node stack (via the real `dscli`), registered in a real etcd started by the
rendered etcd script. The tests run in file order and share the pool."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import run_harness as harness
from ascend_pd.scripts.worker import WORKER_KILL_GRACE_S
from ascend_pd.shell import FOLLOWS_ENV

pytestmark = pytest.mark.integration

CLUSTER_PREFIX = "/datasystem/cluster/"


@pytest.fixture(scope="module")
def pool(workdir: Path):
    harness.require_tools(harness.ETCD_BINARY, "curl", "dscli")
    c = harness.Cluster("a3-4node", workdir)
    c.run(c.etcd_node, "etcd")
    yield c
    # Best effort, in destroy order; the workdir fixture then kills whatever is left.
    c.run_many([(n, "worker") for n in c.nodes], "delete", check=False)
    c.run(c.etcd_node, "etcd", "delete", check=False)


def addresses(c: harness.Cluster) -> dict[str, str]:
    return {n: c.plans[n].worker(n).address for n in c.nodes}


def the_worker(c: harness.Cluster, node: str) -> int:
    pids = harness.worker_pids(addresses(c)[node])
    assert len(pids) == 1, f"{node}: expected one worker, found {pids}"
    return pids[0]


def workdir_of(c: harness.Cluster, node: str) -> Path:
    return Path(c.plans[node].worker(node).workdir)


def liveness_ok(c: harness.Cluster, node: str, patience: float = 5.0) -> bool:
    """The worker's liveness file says success within `patience` seconds. The worker rewrites the file
    continuously, so one read can land between its truncation and its new text (a CI run met an empty
    read on a loaded machine); the rendered script polls it the same way."""
    deadline = time.monotonic() + patience
    while True:
        try:
            if "liveness check success" in c.liveness(node).read_text():
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def registered(c: harness.Cluster) -> list[str]:
    return [k[len(CLUSTER_PREFIX):] for k in harness.etcd_keys(c, CLUSTER_PREFIX)]


def test_workers_start_register_and_write_liveness(pool: harness.Cluster):
    c = pool
    results = c.run_many([(n, "worker") for n in c.nodes])
    for key, r in results.items():
        assert "ready, registered with etcd" in r.stdout, key
    addr = addresses(c)
    assert sorted(registered(c)) == sorted(addr.values())
    for node in c.nodes:
        pid = the_worker(c, node)
        argv = harness.cmdline(pid)
        # The rendered flags reached the worker (dscli rewrites them as --flag=value).
        y = c.plans[node].cfg.yuanrong
        for flag in (f"--worker_address={addr[node]}", f"--etcd_address={c.etcd_endpoint}",
                     f"--shared_memory_size_mb={y.shared_memory_mb}", f"--liveness_check_path={c.liveness(node)}",
                     f"--node_timeout_s={y.node_timeout_s}", f"--node_dead_timeout_s={y.node_dead_timeout_s}"):
            assert flag in argv, (node, flag)
        # ./datasystem resolved against the fixed working directory of this node.
        assert os.readlink(f"/proc/{pid}/cwd") == str(workdir_of(c, node))
        assert (workdir_of(c, node) / "datasystem" / "rocksdb").is_dir()
        assert liveness_ok(c, node)
    # The liveness file is rewritten continuously (a probe may rely on its age).
    stamps = {n: c.liveness(n).stat().st_mtime_ns for n in c.nodes}
    harness.wait_for(lambda: all(c.liveness(n).stat().st_mtime_ns > stamps[n] for n in c.nodes), 5,
                     what="every liveness file to be rewritten")


def test_kv_put_through_one_worker_reads_through_another(pool: harness.Cluster):
    c = pool
    pairs = [("p0", "d1"), ("d0", "p1")]
    for writer, reader in pairs:
        key, value = f"ascend-pd-itest-{writer}", f"written on {writer} at {time.time()}"
        put = harness.kv(c, writer, "set", key, value)
        assert put.returncode == 0, put.stderr
        got = harness.kv(c, reader, "get", key)
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == value
    # The client keeps its logs in $HOME/.datasystem of the node it runs on (what delete must clean).
    for node in ("p0", "d1", "d0", "p1"):
        assert (c.home(node) / ".datasystem").is_dir(), node


def test_create_again_is_harmless(pool: harness.Cluster):
    c = pool
    before = {n: the_worker(c, n) for n in c.nodes}
    results = c.run_many([(n, "worker") for n in c.nodes])
    for key, r in results.items():
        assert "already running" in r.stdout, key
        assert r.elapsed < 90, key  # no start, no wait (the pids below prove it); loose: CI is loaded
    assert {n: the_worker(c, n) for n in c.nodes} == before


def test_changed_flags_restart_only_that_worker(pool: harness.Cluster):
    c = pool
    before = {n: the_worker(c, n) for n in c.nodes}
    changed = harness.Cluster(c.stack, c.tmp, overrides={"yuanrong": {"flags": {"max_client_num": 150}}})
    assert changed.script("p1", "worker").create != c.script("p1", "worker").create
    r = changed.run("p1", "worker")
    assert "running with older flags: restarting" in r.stdout
    assert "ready, registered" in r.stdout
    pid = the_worker(c, "p1")
    assert pid != before["p1"] and not harness.alive(before["p1"])
    assert "--max_client_num=150" in harness.cmdline(pid)
    assert {n: the_worker(c, n) for n in c.nodes if n != "p1"} == {n: p for n, p in before.items() if n != "p1"}
    # The changed text is now the running one: running it again changes nothing.
    assert "already running" in changed.run("p1", "worker").stdout
    # The restarted worker serves the pool again.
    assert harness.kv(c, "p1", "set", "after-restart", "v").returncode == 0
    got = harness.kv(c, "p0", "get", "after-restart")
    assert got.stdout.strip() == "v", got.stderr


def test_a_worker_that_joined_a_replaced_etcd_restarts_though_registered(pool: harness.Cluster):
    """Pulumi runs the worker's create again with the new etcd's resource id ($ASCEND_PD_FOLLOWS,
    components.transport) when etcd was replaced by its node's container: the worker restarts into
    it even when it finds itself registered. The same id, or no id (heal, a run by hand), keeps it."""
    c = pool
    before = {n: the_worker(c, n) for n in c.nodes}
    # A worker started before the id was kept adopts the etcd it runs with: no restart on upgrade.
    adopted = c.run("d0", "worker", env={FOLLOWS_ENV: "etcd-1"})
    assert "already running" in adopted.stdout and the_worker(c, "d0") == before["d0"]
    assert "already running" in c.run("d0", "worker", env={FOLLOWS_ENV: "etcd-1"}).stdout
    assert "already running" in c.run("d0", "worker").stdout
    assert the_worker(c, "d0") == before["d0"]
    replaced = c.run("d0", "worker", env={FOLLOWS_ENV: "etcd-2"})
    assert "etcd " in replaced.stdout and "was replaced since it joined: restarting" in replaced.stdout
    assert "ready, registered" in replaced.stdout
    assert the_worker(c, "d0") != before["d0"] and not harness.alive(before["d0"])
    assert {n: the_worker(c, n) for n in c.nodes if n != "d0"} == {n: p for n, p in before.items() if n != "d0"}
    assert "already running" in c.run("d0", "worker", env={FOLLOWS_ENV: "etcd-2"}).stdout
    assert sorted(registered(c)) == sorted(addresses(c).values())


def test_killed_worker_is_cleaned_by_delete_and_recreated(pool: harness.Cluster):
    c = pool
    node = "d0"
    assert harness.kv(c, node, "set", "before-kill", "x").returncode == 0
    pid = the_worker(c, node)
    os.kill(pid, 9)  # no chance to deregister or flush anything
    harness.wait_for(lambda: not harness.alive(pid), 10, what="killed worker to exit")

    r = c.run(node, "worker", "delete")
    assert "stopped and cleaned" in r.stdout
    assert not harness.worker_pids(addresses(c)[node])
    assert not (workdir_of(c, node) / "datasystem").exists()
    assert not (c.home(node) / ".datasystem").exists()
    assert not c.liveness(node).exists()

    r = c.run(node, "worker")
    assert "ready, registered" in r.stdout, r.stdout + r.stderr
    assert liveness_ok(c, node)
    assert addresses(c)[node] in registered(c)
    assert harness.kv(c, node, "set", "after-recreate", "y").returncode == 0
    got = harness.kv(c, "p0", "get", "after-recreate")
    assert got.returncode == 0 and got.stdout.strip() == "y", got.stderr


def test_killed_worker_is_restarted_by_create_alone(pool: harness.Cluster):
    """`pulumi up` after a crash (no destroy in between): create must bring the worker back."""
    c = pool
    node = "d1"
    pid = the_worker(c, node)
    os.kill(pid, 9)
    harness.wait_for(lambda: not harness.alive(pid), 10, what="killed worker to exit")
    r = c.run(node, "worker")
    assert "ready, registered" in r.stdout, r.stdout + r.stderr
    assert harness.alive(the_worker(c, node))
    assert harness.kv(c, node, "set", "after-crash", "z").returncode == 0
    got = harness.kv(c, "p1", "get", "after-crash")
    assert got.returncode == 0 and got.stdout.strip() == "z", got.stderr


def test_worker_killed_while_starting_is_started_again(pool: harness.Cluster):
    """The worker can be SIGKILLed while it (re)joins the pool (seen on a loaded machine right after a
    restart): create starts it again, up to yuanrong.startAttempts, instead of failing the deploy."""
    c = pool
    node = "d0"
    c.run(node, "worker", "delete")
    address = addresses(c)[node]
    killed: list[int] = []

    def kill_first_worker():
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid in harness.worker_pids(address):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_first_worker)
    killer.start()
    try:
        r = c.run(node, "worker")
    finally:
        killer.join()
    assert killed, "the worker never appeared"
    assert f"worker {address}: killed while starting (attempt 1 of 3): starting again" in r.stdout
    assert "ready, registered" in r.stdout
    pid = the_worker(c, node)
    assert pid != killed[0]
    assert liveness_ok(c, node)
    # The first attempt's dscli output is kept beside the log of the attempt that worked.
    logs = Path(c.plans[node].cfg.state_dir) / "logs"
    assert "Worker exited with code -9" in (logs / "dscli-start.log.1").read_text()
    assert harness.kv(c, node, "set", "after-retry", "r").returncode == 0
    got = harness.kv(c, "p1", "get", "after-retry")
    assert got.returncode == 0 and got.stdout.strip() == "r", got.stderr


def test_worker_that_cannot_start_fails_at_once_with_the_reason(pool: harness.Cluster):
    """A start failure that is not a kill (here a flag the worker rejects) is not retried: create
    fails within seconds and its error carries dscli's and the worker's own words."""
    c = pool
    node = "d0"
    bad = harness.Cluster(c.stack, c.tmp, overrides={"yuanrong": {"flags": {"no_such_worker_flag": 1}}})
    r = bad.run(node, "worker", check=False)
    assert r.returncode == 1
    assert "running with older flags: restarting" in r.stdout
    assert "starting again" not in r.stdout
    assert f"openYuanrong worker {addresses(c)[node]} failed to start" in r.stderr
    assert "attempt 1 of 3" in r.stderr
    assert "unknown command line flag 'no_such_worker_flag'" in r.stderr
    assert "Starting with numactl command" not in r.stderr  # dscli's whole argv line stays in the log
    assert r.elapsed < 60, r.elapsed  # three attempts of a worker that exits at once; loose: CI is loaded
    assert not harness.worker_pids(addresses(c)[node])
    # The stack's own script brings it back.
    assert "ready, registered" in c.run(node, "worker").stdout
    assert liveness_ok(c, node)


def test_delete_of_a_hung_worker_is_bounded(pool: harness.Cluster):
    """A worker that ignores dscli stop (SIGSTOPped here): delete gives dscli its bound, TERMs,
    KILLs after the grace, and still cleans up, instead of waiting dscli's own 180 s + shm/40 s."""
    c = pool
    node = "d1"
    quick = harness.Cluster(c.stack, c.tmp, overrides={"yuanrong": {"stopTimeoutS": 5}})
    pid = the_worker(c, node)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = quick.run(node, "worker", "delete", check=False)
    finally:
        if harness.alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dscli stop failed or did not finish within 5s: terminating the worker" in r.stderr
    # `timeout 5`, then the grace counted in bash's whole $SECONDS (up to a second short).
    assert 5 + WORKER_KILL_GRACE_S - 1 <= r.elapsed < 5 + WORKER_KILL_GRACE_S + 15
    assert not harness.alive(pid) and not harness.worker_pids(addresses(c)[node])
    assert not (workdir_of(c, node) / "datasystem").exists()
    assert not c.liveness(node).exists()


def test_delete_stops_every_worker_within_its_bound_and_cleans(pool: harness.Cluster):
    c = pool
    y = c.any_plan.cfg.yuanrong
    bound = y.stop_timeout_s + WORKER_KILL_GRACE_S + 15
    results = c.run_many([(n, "worker") for n in c.nodes], "delete")
    for node in c.nodes:
        r = results[f"{node}/worker"]
        assert r.elapsed < bound, (node, r.elapsed)
        assert "stopped and cleaned" in r.stdout
        assert "No such file" not in r.stderr, r.stderr
        assert not harness.worker_pids(addresses(c)[node])
        assert not (workdir_of(c, node) / "datasystem").exists()
        assert not (c.home(node) / ".datasystem").exists()
        assert not c.liveness(node).exists()
        assert not (c.run_dir(node) / "worker.spec").exists()
    # A second delete finds nothing to do.
    for key, r in c.run_many([(n, "worker") for n in c.nodes], "delete").items():
        assert r.returncode == 0 and r.elapsed < 20, key


def test_worker_pids_matches_exactly_one_address(tmp_path: Path):
    """The delete/create scripts find the worker by `--worker_address=ADDR` exactly: not a worker
    whose address merely contains ADDR, not a shell whose command line carries the script."""
    import subprocess

    from ascend_pd.shell import library

    fake = f"exec -a {tmp_path}/datasystem_worker {harness.PYTHON} -c 'import time; time.sleep(30)'"
    procs = [subprocess.Popen(["bash", "-c", f"{fake} --etcd_address=127.0.1.99:1 --worker_address={a} --x=1"])
             for a in ("127.0.1.99:18481", "127.0.1.199:18481")]
    try:
        for pr in procs:
            # argv[0] itself: bash's own command line (before its exec) holds the name too, and a scan
            # that meets the process inside its exec reads an empty command line.
            harness.wait_for(lambda: harness.cmdline(pr.pid)[:1] == [f"{tmp_path}/datasystem_worker"], 5)
        script = library("worker_lib") + 'worker_pids "$1"; worker_pids "$2" | tr "\\n" " "; echo; worker_pids "$3"\n'
        out = subprocess.run(["bash", "-c", script, "worker_pids", "127.0.1.99:18481", "27.0.1.99:18481",
                              "127.0.1.199:18481"], capture_output=True, text=True, timeout=30)
        assert out.stderr == ""
        lines = out.stdout.split("\n")
        assert lines[0] == str(procs[0].pid)
        assert lines[1].strip() == ""  # a suffix of both addresses matches neither
        assert lines[2] == str(procs[1].pid)
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
