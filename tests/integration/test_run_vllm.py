"""The rendered per-(instance, node) launch scripts, run for real with the fake `vllm` first on PATH.

The fake speaks vLLM's CLI and HTTP surface (tests/fakes/fake_vllm.py): it refuses the argv the real
one would refuse, checks ASCEND_RT_VISIBLE_DEVICES against --tensor-parallel-size, and answers
/health once listening. The a2-8node decode node runs 8 ranks (DP32/TP1 over 4 nodes); the
a3-4node nodes run one TP16 rank each.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import run_harness as harness

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def a2(workdir: Path) -> harness.Cluster:
    harness.require_tools("curl", "setsid")
    c = harness.Cluster("a2-8node", workdir / "a2")
    yield c
    c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes], "delete", check=False)


@pytest.fixture(scope="module")
def a3(workdir: Path) -> harness.Cluster:
    harness.require_tools("curl", "setsid")
    c = harness.Cluster("a3-4node", workdir / "a3")
    yield c
    c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes], "delete", check=False)


def assert_ranks_up(c: harness.Cluster, node: str) -> dict[str, int]:
    pids = {}
    for r in harness.ranks_on(c, node):
        pid = c.pid(node, r.name)
        assert harness.alive(pid), f"{r.name} not running"
        assert harness.http_ok(f"http://{r.address}:{r.port}/health"), f"{r.name} not healthy"
        pids[r.name] = pid
    return pids


def assert_no_ranks(c: harness.Cluster, node: str) -> None:
    address, ports = c.address(node), [r.port for r in harness.ranks_on(c, node)]
    harness.wait_for(lambda: not harness.fake_vllm_pids(address, ports), 10,
                     what=f"no rank left on {address} ports {ports}")
    for r in harness.ranks_on(c, node):
        assert not (c.run_dir(node) / f"{r.name}.pid").exists(), r.name


DECODE_GROUP = ("d0", "d1", "d2", "d3")  # a2's one decode instance: DP32 over four nodes


def test_decode_node_runs_all_eight_ranks_as_planned(a2: harness.Cluster):
    c, node = a2, "d0"
    script = harness.launch_name(c, node)
    # The whole group: a launch keeps its ranks only while every rank of its DP group answers.
    results = c.run_many([(n, harness.launch_name(c, n)) for n in DECODE_GROUP])
    r = results[f"{node}/{script}"]
    assert "decode-0 on d0: 8/8 ranks healthy" in r.stdout
    ranks = harness.ranks_on(c, node)
    assert [x.name for x in ranks] == [f"decode-0-r{i}" for i in range(8)]
    pids = assert_ranks_up(c, node)
    for rank in ranks:
        pid = pids[rank.name]
        # The rendered command line is exactly what runs (the wrapper execs the fake in place).
        assert harness.cmdline(pid)[2:] == list(rank.argv[1:])
        # Its own session and process group: the launch's exit does not touch it, stop kills the group.
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid
        env = harness.environ(pid)
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == rank.visible_devices == str(rank.local_index)
        assert env["DS_WORKER_ADDR"] == f"{c.address(node)}:{harness.WORKER_PORT}"
        assert env["PYTHONHASHSEED"] == "0"
        assert env["HCCL_IF_IP"] == c.address(node)
        # The container's proxy must not reach the ranks (rank-to-rank and proxy-to-rank traffic).
        assert not {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} & set(env), rank.name
        # `$LD_PRELOAD` in the stack's env expanded (to nothing here) instead of staying literal.
        assert env["LD_PRELOAD"] == "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:"

    again = c.run(node, script)
    assert again.stdout.count("already running") == 8
    assert again.elapsed < 20  # no start, no health wait (the pids above prove no restart); loose: CI is loaded
    assert assert_ranks_up(c, node) == pids


def test_a_stale_spec_restarts_the_nodes_ranks_together(a2: harness.Cluster):
    """One rank recorded with another command: the node's ranks of the group restart together (a
    DP group cannot take one restarted rank back)."""
    c, node = a2, "d0"
    before = assert_ranks_up(c, node)
    (c.run_dir(node) / "decode-0-r3.spec").write_text("0000000000000000\n")
    r = c.run(node, harness.launch_name(c, node))
    assert "decode-0: its ranks' commands changed: restarting its ranks on d0" in r.stdout
    assert "already running" not in r.stdout
    after = assert_ranks_up(c, node)
    assert not set(after.values()) & set(before.values())


def test_changed_flag_restarts_the_changed_ranks_only(a2: harness.Cluster):
    """A decode flag changes every decode rank's command; prefill ranks (another script) and the
    decode ranks of nodes whose script has not run yet keep running untouched."""
    c = a2
    c.run("p0", harness.launch_name(c, "p0"))
    before = {n: assert_ranks_up(c, n) for n in ("p0", "d0", "d1")}

    changed = harness.Cluster(c.stack, c.tmp, overrides={"decode": {"flags": {
        **c.any_plan.cfg.decode.flags, "max-num-seqs": 31}}})
    script = harness.launch_name(changed, "d0")
    assert changed.script("d0", script).create != c.script("d0", script).create
    assert changed.script("p0", harness.launch_name(c, "p0")).create == c.script("p0", harness.launch_name(c, "p0")).create
    r = changed.run("d0", script)
    assert "decode-0: its ranks' commands changed: restarting its ranks on d0" in r.stdout
    assert r.stdout.count("started pid") == 8
    after = assert_ranks_up(changed, "d0")
    assert not set(after.values()) & set(before["d0"].values())
    for rank in harness.ranks_on(changed, "d0"):
        assert "31" == harness.cmdline(after[rank.name])[harness.cmdline(after[rank.name]).index("--max-num-seqs") + 1]
    assert assert_ranks_up(c, "p0") == before["p0"]
    assert assert_ranks_up(c, "d1") == before["d1"]
    # Converged: the changed text again is a no-op.
    assert changed.run("d0", script).stdout.count("already running") == 8


def test_smaller_dp_stops_the_ranks_no_longer_planned(a2: harness.Cluster):
    c = a2
    smaller = harness.Cluster(c.stack, c.tmp, overrides={"decode": {"dp": 16}})
    assert [r.name for r in harness.ranks_on(smaller, "d0")] == [f"decode-0-r{i}" for i in range(4)]
    gone = [c.pid("d0", f"decode-0-r{i}") for i in range(4, 8)]
    r = smaller.run("d0", harness.launch_name(smaller, "d0"))
    for i in range(4, 8):
        assert f"decode-0-r{i}: no longer planned on d0: stopping it" in r.stdout
        assert not (c.run_dir("d0") / f"decode-0-r{i}.pid").exists()
    assert not any(harness.alive(p) for p in gone)
    assert "4/4 ranks healthy" in r.stdout
    assert len(harness.fake_vllm_pids(c.address("d0"), range(7100, 7108))) == 4
    # Back to the committed layout: r4..r7 start again, r0..r3 restart with --data-parallel-size 32.
    back = c.run("d0", harness.launch_name(c, "d0"))
    assert "8/8 ranks healthy" in back.stdout
    assert len(harness.fake_vllm_pids(c.address("d0"), range(7100, 7108))) == 8


def test_rank_exiting_at_start_fails_the_launch_with_its_log(a2: harness.Cluster):
    c, node = a2, "d2"  # ranks decode-0-r16 .. r23
    c.run(node, harness.launch_name(c, node), "delete")  # started with its group by the first test
    env = {"FAKE_VLLM_EXIT_AT_START": "3", "FAKE_VLLM_EXIT_RANKS": "19"}
    r = c.run(node, harness.launch_name(c, node), env=env, check=False)
    assert r.returncode != 0
    assert r.elapsed < c.any_plan.cfg.vllm.ready_timeout_s
    assert "decode-0-r19 (pid" in r.stderr and "exited before answering /health" in r.stderr
    assert "--- last lines of" in r.stderr and "decode-0-r19.log" in r.stderr
    assert "fake engine core failed at start (FAKE_VLLM_EXIT_AT_START=3)" in r.stderr
    assert_no_ranks(c, node)  # the seven healthy ones were stopped too


def test_ranks_not_healthy_by_the_deadline_fail_with_their_log(a3: harness.Cluster):
    c, node = a3, "p1"
    timeout = c.any_plan.cfg.vllm.ready_timeout_s
    r = c.run(node, harness.launch_name(c, node), env={"FAKE_VLLM_STARTUP_DELAY": "3600"}, check=False)
    assert r.returncode != 0
    assert timeout - 1 <= r.elapsed < timeout + 30  # $SECONDS: whole seconds
    assert f"prefill-0 on p1: only 0 of 1 ranks healthy after {timeout}s" in r.stderr
    assert "Loading model weights (fake, 3600.0s)" in r.stderr  # the rank's log tail
    assert_no_ranks(c, node)


def test_a3_launches_bring_up_every_node(a3: harness.Cluster):
    c = a3
    results = c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes])
    for key, r in results.items():
        assert "1/1 ranks healthy" in r.stdout, key
    for n in c.nodes:
        (rank,) = harness.ranks_on(c, n)
        pid = assert_ranks_up(c, n)[rank.name]
        assert harness.environ(pid)["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(str(d) for d in range(16))


def test_rank_ignoring_term_is_killed_with_its_group(a3: harness.Cluster, workdir: Path):
    """stop_pidfiles: TERM the group, KILL it after the grace; nothing of the group survives."""
    c, node = a3, "d1"
    c.run(node, harness.launch_name(c, node), "delete")
    # A `vllm` that ignores TERM itself while its child (the fake server) exits on it.
    stubborn = workdir / "stubborn-bin"
    stubborn.mkdir(exist_ok=True)
    wrapper = stubborn / "vllm"
    wrapper.write_text(f"#!/usr/bin/env bash\ntrap '' TERM\npython3 {harness.FAKES / 'fake_vllm.py'} \"$@\"\n"
                       "while :; do sleep 1; done\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    path = os.pathsep.join([str(stubborn), str(harness.FAKES_BIN), harness.VENV_BIN, os.environ["PATH"]])
    c.run(node, harness.launch_name(c, node), env={"PATH": path})
    (rank,) = harness.ranks_on(c, node)
    leader = c.pid(node, rank.name)
    group = [p for p in harness.processes_matching([""]) if harness.alive(p) and _pgid(p) == leader]
    assert len(group) >= 2  # the wrapper and the fake server
    r = c.run(node, harness.launch_name(c, node), "delete")
    grace = c.any_plan.cfg.vllm.stop_timeout_s
    assert f"pid(s) {leader} ignored TERM for {grace}s: KILL" in r.stderr
    assert grace - 1 <= r.elapsed < grace + 15  # $SECONDS: whole seconds
    assert not any(harness.alive(p) for p in group)


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


def test_delete_stops_every_rank(a2: harness.Cluster, a3: harness.Cluster):
    for c in (a2, a3):
        results = c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes], "delete")
        for key, r in results.items():
            assert f"ranks on {key.split('/')[0]} stopped" in r.stdout, key
        for n in c.nodes:
            assert_no_ranks(c, n)
        # Deleting again is harmless.
        assert all(r.returncode == 0 for r in
                   c.run_many([(n, harness.launch_name(c, n)) for n in c.nodes], "delete").values())


def test_ranks_get_the_container_env_files(workdir: Path):
    """container.envFiles (CANN's set_env.sh in a real image) are sourced before the ranks start,
    leniently (those scripts reference unset variables), and absent ones are skipped."""
    env_file = workdir / "set_env.sh"
    env_file.write_text('export ASCEND_PD_FROM_ENV_FILE="toolkit:${SOME_UNSET_VARIABLE}"\n'
                        'export LD_LIBRARY_PATH=/opt/fake-cann/lib64:$LD_LIBRARY_PATH\n')
    c = harness.Cluster("a3-4node", workdir / "envf", overrides={"container": {
        "envFiles": [str(env_file), str(workdir / "absent.sh")]}})
    node = "d1"
    try:
        r = c.run(node, harness.launch_name(c, node))
        assert "1/1 ranks healthy" in r.stdout
        (rank,) = harness.ranks_on(c, node)
        env = harness.environ(c.pid(node, rank.name))
        assert env["ASCEND_PD_FROM_ENV_FILE"] == "toolkit:"
        # The stack's own LD_LIBRARY_PATH ($LD_LIBRARY_PATH:/usr/local/lib) builds on the sourced one.
        assert env["LD_LIBRARY_PATH"].startswith("/opt/fake-cann/lib64:")
        assert env["LD_LIBRARY_PATH"].endswith(":/usr/local/lib")
    finally:
        c.run(node, harness.launch_name(c, node), "delete", check=False)
