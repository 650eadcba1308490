"""The second `pulumi up`: every kind of change to a running a2-8node deployment, run as the engine
would run it (tests/integration/engine_harness.py: the program's graphs before and after, the
engine model's steps, each step's real command on its loopback node), must converge: every
planned rank healthy, nothing unplanned running, no port or NPU held twice, etcd holding exactly
the planned workers, the proxy serving every instance.

The scenarios that the real engine runs (tests/realengine/test_scenarios.py and test_lifecycle.py:
a decode flag, a renamed node with and without `formerNames`, a failed launch then the stack put
back, a rotated SSH key) are no longer run here; these are the ones it cannot run yet (a DP group
regrouped, a SIGKILLed rank, a rebooted node) or that check the scripts' own transport (a stopped
container started by the next script).

The scenarios run in order on one deployment, each from where the previous one left it (as an
operator's changes do), so a scenario that leaves debris fails the next one too. The a2 topology
is kept (8 nodes: 4 one-node prefill instances, a 4-node decode group); decode is DP8 (2 ranks per
node) instead of DP32 to keep the number of fake ranks small.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

import engine_harness as eh
import proxy_release
import release_upgrade
import run_harness as harness

from ascend_pd.engine.model import CREATE, DELETE, DELETE_REPLACED, REPLACE, UPDATE

pytestmark = pytest.mark.integration

STACK = "a2-8node"
# yuanrong.stopTimeoutS at its floor: a worker's delete waits that long for `dscli stop` before it
# terminates the worker, and the scenarios stop workers many times.
BASE = {"decode": {"dp": 8}, "yuanrong": {"stopTimeoutS": 5}}
DECODE = ("d0", "d1", "d2", "d3")


@pytest.fixture(scope="module")
def dep(workdir: Path):
    harness.require_tools(harness.ETCD_BINARY, "curl", "dscli", "setsid")
    d = eh.Deployment(STACK, workdir / "scn", base=BASE)
    yield d
    if d.state:
        d.destroy()


def test_first_up_converges_and_a_second_changes_nothing(dep: eh.Deployment):
    run = dep.up()
    assert run.outcome.ok, run.failures()
    eh.converged(dep)
    before = eh.pids_of_ranks(dep)
    again = dep.up()
    assert again.outcome.ok and again.ops() == []
    assert eh.pids_of_ranks(dep) == before


def decode_pids(dep: eh.Deployment) -> dict[str, int]:
    return {k: v for k, v in eh.pids_of_ranks(dep).items() if k.startswith("decode-")}


def prefill_pids(dep: eh.Deployment) -> dict[str, int]:
    return {k: v for k, v in eh.pids_of_ranks(dep).items() if k.startswith("prefill-")}


def test_decode_split_into_two_groups_and_back(dep: eh.Deployment):
    """nodesPerInstance 4 -> 2 renames ranks (decode-0-r4.. on d2 become decode-1-r0..) and
    regroups the nodes: each node's launch stops what its node no longer runs before it starts."""
    run = dep.up({"decode": {"nodesPerInstance": 2, "dp": 4}})
    assert run.outcome.ok, run.failures()
    assert {n for op, n in run.ops()} >= {f"{n}-launch" for n in DECODE}
    assert not run.names(CREATE) and not run.names(DELETE)
    eh.converged(dep)
    assert [i.name for i in dep.cluster.any_plan.instances_of("decode")] == ["decode-0", "decode-1"]
    run = dep.up({"decode": {"nodesPerInstance": None, "dp": 8}})
    assert run.outcome.ok, run.failures()
    eh.converged(dep)


def test_prefill_loses_a_node_and_gets_it_back(dep: eh.Deployment):
    """[p0..p3] -> [p0, p2, p3]: p2's and p3's instances are renumbered (prefill-2 -> prefill-1 ...)
    and p1's launch leaves the program, so its ranks stop only at the very end of the run."""
    run = dep.up({"prefill": {"nodes": ["p0", "p2", "p3"]}})
    assert run.outcome.ok, run.failures()
    assert (DELETE, "p1-launch") in run.ops()
    assert run.ops().index((DELETE, "p1-launch")) > run.ops().index((UPDATE, "p2-launch"))
    eh.converged(dep)
    run = dep.up({"prefill": {"nodes": None}})
    assert run.outcome.ok, run.failures()
    assert (CREATE, "p1-launch") in run.ops()
    eh.converged(dep)


def start_spread_s(dep: eh.Deployment, prefix: str) -> float:
    """Seconds between the first and the last start of the ranks named `prefix`* (their processes' start
    times): a DP group whose ranks start apart is split (status judges it by the same clock)."""
    hz = os.sysconf("SC_CLK_TCK")
    starts = [int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) / hz
              for name, pid in eh.pids_of_ranks(dep).items() if name.startswith(prefix)]
    return max(starts) - min(starts)


def test_the_decode_group_on_one_node_fewer_restarts_together(dep: eh.Deployment):
    """`replan`'s layout when a decode group cannot keep its node count: d3 leaves the group, DP 8 -> 6
    on d0-d2. Every rank of the new group answered before the run, so the lead (d0) drains it as a
    serving instance: it takes out every endpoint the proxy lists for the role, d3's too. Taking
    out only the new plan's endpoints left d3's listed until the run's end (d3's launch is deleted
    last): the role never counted 0, and d0 restarted its ranks a whole drain timeout (300 s) after
    the rest of its group, a split DP group."""
    t0 = time.monotonic()
    run = dep.up({"decode": {"nodes": ["d0", "d1", "d2"], "nodesPerInstance": 3, "dp": 6}})
    took = time.monotonic() - t0
    assert run.outcome.ok, run.failures()
    eh.converged(dep)
    assert dep.cluster.any_plan.instances_of("decode")[0].nodes == ("d0", "d1", "d2")
    assert start_spread_s(dep, "decode-") < 30 and took < 240, (start_spread_s(dep, "decode-"), took)
    run = dep.up({"decode": {"nodes": None, "nodesPerInstance": None, "dp": 8}})
    assert run.outcome.ok, run.failures()
    eh.converged(dep)
    assert start_spread_s(dep, "decode-") < 30


def test_identity_settings_replace_with_the_old_delete_first(dep: eh.Deployment):
    """stateDir, yuanrong.port and etcd.dataDir decide which processes and files a script manages:
    a change replaces (old delete first), so no old etcd, worker or rank is left beside the new."""
    run = dep.up({
        "stateDir": lambda d: str(d / "state2"),
        "yuanrong": {"port": harness.WORKER_PORT + 7},
        "etcd": {"dataDir": str(dep.tmp / "etcd-data-2")},
    })
    assert run.outcome.ok, run.failures()
    ops = run.ops()
    for name in ("p0-etcd", "p0-worker", "d1-worker", "d1-launch", "p0-proxy"):
        assert ops.index((DELETE_REPLACED, name)) < ops.index((REPLACE, name)), name
    eh.converged(dep)
    assert not (dep.tmp / "etcd-data").exists()
    run = dep.up({"stateDir": None, "yuanrong": {"port": None}, "etcd": {"dataDir": None}})  # and back
    assert run.outcome.ok, run.failures()
    eh.converged(dep)


def test_etcd_moves_into_its_own_container_and_back(dep: eh.Deployment):
    run = dep.up({"etcd": {"image": "quay.io/coreos/etcd:v3.5.12"}})
    assert run.outcome.ok, run.failures()
    ops = run.ops()
    # The engine creates the etcd container (a new resource) before the replaced etcd command's old
    # delete stops the binary etcd on the same ports: the container's etcd fails to bind and docker
    # restarts it (restart: unless-stopped) until the port is free; the health gate runs after the
    # old delete. Every worker's script names the etcd it registers in: they are updated after the
    # gate, find themselves unregistered in the new etcd, and restart into it.
    assert ops.index((CREATE, "p0-etcd-container")) < ops.index((DELETE_REPLACED, "p0-etcd")) \
        < ops.index((REPLACE, "p0-etcd"))
    assert run.names(UPDATE) == {f"{n}-worker" for n in dep.cluster.nodes}
    for n in dep.cluster.nodes:
        assert ops.index((REPLACE, "p0-etcd")) < ops.index((UPDATE, f"{n}-worker"))
    eh.converged(dep)
    run = dep.up({"etcd": {"image": None}})
    assert run.outcome.ok, run.failures()
    assert (DELETE, "p0-etcd-container") in run.ops()
    eh.converged(dep)


def test_a_new_image_replaces_every_container_and_what_runs_in_it(dep: eh.Deployment):
    # The documented upgrade to vllm-ascend 0.23.0.post1 (docs/changes.md): a new image everywhere, and
    # the release's rewritten PD proxy behind the launcher; the scenarios after this one run on it.
    run = dep.up(release_upgrade.overrides(STACK))
    assert run.outcome.ok, run.failures()
    p = dep.cluster.any_plan.proxy
    assert str(proxy_release.for_release(release_upgrade.RELEASE)) in harness.cmdline(dep.cluster.pid(p.node, "proxy"))
    ops = run.ops()
    for n in dep.cluster.nodes:
        assert ops.index((DELETE_REPLACED, f"{n}-launch")) < ops.index((DELETE_REPLACED, f"{n}-container"))
        assert ops.index((DELETE_REPLACED, f"{n}-container")) < ops.index((REPLACE, f"{n}-container"))
        assert ops.index((REPLACE, f"{n}-container")) < ops.index((REPLACE, f"{n}-launch"))
    eh.converged(dep)


def converge_bump(dep: eh.Deployment) -> dict:
    return {"converge": dep.settings().get("converge", 0) + 1}


def test_a_killed_rank_is_brought_back_with_its_group(dep: eh.Deployment):
    """After a rank dies, `ascend-pd:converge` makes the next up run every service script again:
    the idempotent scripts restart the dead rank's whole DP group and leave everything else alone."""
    prefill, decode = prefill_pids(dep), decode_pids(dep)
    dep.kill_rank("d2", "decode-0-r5")
    run = dep.up(converge_bump(dep))
    assert run.outcome.ok, run.failures()
    assert not run.names(REPLACE) and not run.names(DELETE)
    eh.converged(dep)
    assert prefill_pids(dep) == prefill
    assert not set(decode_pids(dep).values()) & set(decode.values())


def test_a_launch_left_running_by_a_killed_up_and_the_next_run_start_each_rank_once(dep: eh.Deployment, workdir: Path):
    """A `pulumi up` killed while p1's launch runs (a laptop asleep, a jump host gone): the launch goes
    on in the container, its caller gone. The next run of that launch (the next `up`, or `heal`)
    waits for it (the script's lock), then finds the rank it started: no rank runs twice."""
    c, node, rank = dep.cluster, "p1", "prefill-1-r0"
    others = {k: v for k, v in prefill_pids(dep).items() if not k.startswith("prefill-1-")}
    old = dep.kill_rank(node, rank)
    # The orphan's rank answers /health only after this: the second run comes while it still waits.
    orphan = c.start(node, "launch", output=workdir / "orphan.out", env={"FAKE_VLLM_STARTUP_DELAY": "15"})
    harness.wait_for(lambda: c.pid(node, rank) not in (None, old) and harness.alive(c.pid(node, rank)), 30,
                     what=f"the orphaned launch starting {rank}")
    orphan.kill()  # the caller only (the SSH session): what runs in the container goes on
    orphan.wait()
    second = c.run(node, "launch")
    orphaned = (workdir / "orphan.out").read_text()
    assert "another run of this script holds" in second.stdout, second.stdout
    # The orphan finished its run (its ranks healthy, its instance back in the proxy) before the
    # second one started, which then kept every rank the orphan had started.
    assert "prefill-1 on p1: 2/2 ranks healthy" in orphaned and "prefill-1: back in the proxy" in orphaned, orphaned
    started = {r: int(pid) for r, pid in re.findall(r"(prefill-1-r\d): started pid (\d+)", orphaned)}
    assert len(started) == 2 and "started pid" not in second.stdout, second.stdout
    assert {r: c.pid(node, r) for r in started} == started
    eh.converged(dep)  # one process per planned rank, nothing else
    assert {k: v for k, v in prefill_pids(dep).items() if not k.startswith("prefill-1-")} == others


def test_a_rebooted_node_converges(dep: eh.Deployment):
    prefill = prefill_pids(dep)
    dep.reboot("p1")
    run = dep.up(converge_bump(dep))
    assert run.outcome.ok, run.failures()
    eh.converged(dep)
    after = prefill_pids(dep)
    assert after["prefill-1-r0"] != prefill["prefill-1-r0"]
    assert {k: v for k, v in after.items() if not k.startswith("prefill-1-")} == \
        {k: v for k, v in prefill.items() if not k.startswith("prefill-1-")}


def test_a_stopped_container_is_started_again_and_converges(dep: eh.Deployment):
    """`docker stop` (or a reboot of a node whose container an operator had stopped): every script's
    transport starts the container first, and the group of the node restarts as a whole."""
    prefill = prefill_pids(dep)
    dep.stop_container("d3")
    run = dep.up(converge_bump(dep))
    assert run.outcome.ok, run.failures()
    # The first of d3's scripts to run found it stopped and started it.
    assert any("is stopped: starting it" in out for i, out in run.output.items() if run.steps[i].name.startswith("d3-"))
    eh.converged(dep)
    assert prefill_pids(dep) == prefill


def test_destroy_with_a_stopped_container_leaves_nothing(dep: eh.Deployment, workdir: Path):
    dep.stop_container("d1")
    run = dep.destroy()
    assert run.outcome.ok, run.failures()
    assert dep.state == []
    assert eh.any_container_processes() == []
    assert harness.our_processes(workdir) == []
