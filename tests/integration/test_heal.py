"""`heal` against a running deployment on loopback: the exact rendered scripts, sent as the components
send them (`docker exec -i <container> bash -s`, a stand-in docker), real etcd and openYuanrong
workers, the release's PD proxy (`/instances/remove|add` for real), fake ranks that form their DP
group like vLLM's (one dies: the group dies) with a separate engine-core process (SIGSTOP it: the
rank hangs with /health 200).

Topology: the a2-8node stack cut to what shows the behaviour on a loaded 2-core machine: p0
(prefill-0, etcd, proxy), p1 (prefill-1), and the 4-node decode group d0..d3 at DP4 (one rank per
node instead of eight). The scenarios run in order on one deployment, each healing it back.

Every scenario measures fault -> healthy and compares it with what a restart must cost anyway: the
stop (the launch deletes, measured) plus the fakes' known start delay. The rest (detection, the
launch's health polling every 5 s, proxy calls, the one-request check) is heal's overhead: < 10 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

import run_harness as harness
from proxy_key import AUTH

from ascend_pd import heal
from ascend_pd.status import Timeouts

pytestmark = pytest.mark.integration

STACK = "a2-8node"
NODES = ["p0", "p1", "d0", "d1", "d2", "d3"]
START_DELAY_S = 2.0  # the fakes' model load
HANG_S = 3
OVERHEAD_LIMIT_S = 10.0
RANK_ENV = {"FAKE_VLLM_DP_GROUP": "1", "FAKE_VLLM_STARTUP_DELAY": str(START_DELAY_S),
            "FAKE_VLLM_ENGINE_PROCESS": "1"}
T = Timeouts()  # status' defaults: on this loaded machine a 2 s deadline makes healthy ranks look dead
MEASURED: dict[str, dict] = {}


def _overrides() -> dict:
    nodes = [n for n in json.loads(harness.cli_config_map(STACK)["nodes"]) if n["name"] in NODES]
    proxy = {}
    try:
        import proxy_release

        proxy = {"proxy": {"script": str(proxy_release.for_stack(STACK))}}
    except (ImportError, FileNotFoundError):
        pass  # the fake proxy: /instances/* answer 404 and heal says so
    return {"nodes": nodes, "prefill": {"nodes": ["p0", "p1"]},
            "decode": {"nodes": ["d0", "d1", "d2", "d3"], "dp": 4, "nodesPerInstance": 4},
            "yuanrong": {"stopTimeoutS": 5}, "hang": {"seconds": HANG_S}, **proxy}


class Runner:
    """heal's transport on loopback: the host command run here by `sh -c`, with a node's environment
    (its own HOME and state dir, the stand-in docker); `env[node]` adds variables to one node's runs."""

    def __init__(self, c: harness.Cluster):
        self.c, self.env, self.calls, self.outputs, self.probes = c, {}, [], [], []

    def __call__(self, node: str, command: str, timeout_s: float) -> tuple[int, str, str]:
        if command == "true":  # heal's `ssh true` before it stops a group: not a script
            self.probes.append(node)
            return 0, "", ""
        self.calls.append(node)
        r = harness.run_script("", env=self.c.env(node, {**RANK_ENV, **self.env.get(node, {})}),
                               cwd=self.c.node_dir(node), timeout=timeout_s, check=False, what=f"heal on {node}",
                               argv=["sh", "-c", command])
        self.outputs.append((node, r.returncode, r.stdout, r.stderr))
        return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def cluster(workdir: Path):
    harness.require_tools(harness.ETCD_BINARY, "curl", "dscli", "setsid")
    import sys

    sys.path.insert(0, str(harness.PROJECT_DIR / "tests"))
    c = harness.Cluster(STACK, workdir / "heal", overrides=_overrides(), transport="pulumi")
    plan = c.any_plan
    env = RANK_ENV
    c.run(c.etcd_node, "etcd")
    c.run_many([(n, "worker") for n in c.nodes])
    c.run_many([(n, "launch") for i in plan.instances for n in i.nodes], env=env)
    c.run(plan.proxy.node, "proxy")
    yield c
    c.run(plan.proxy.node, "proxy", "delete", check=False)
    c.run_many([(n, "launch") for i in plan.instances for n in i.nodes], "delete", check=False)
    c.run_many([(n, "worker") for n in c.nodes], "delete", check=False)
    c.run(c.etcd_node, "etcd", "delete", check=False)


def healer(c: harness.Cluster, **budget) -> tuple[heal.Healer, Runner]:
    run = Runner(c)
    b = heal.Budget(**{"max_restarts": 5, "window_s": 600, "backoff_s": 0.0, **budget})
    return heal.Healer(c.any_plan, run, budget=b, plan_for=lambda n: c.plans[n], timeouts=T), run


def pids(c: harness.Cluster) -> dict[str, int]:
    return {r.name: c.pid(n, r.name) for n in c.nodes for r in harness.ranks_on(c, n)}


def all_healthy(c: harness.Cluster) -> bool:
    return all(harness.http_ok(f"http://{r.address}:{r.port}/health", 2) for r in c.any_plan.ranks)


def complete(c: harness.Cluster, timeout: float = 20) -> tuple[int, float]:
    """One chat completion through the proxy: (HTTP status or 0, seconds)."""
    t0 = time.monotonic()
    try:
        code = requests.post(f"{c.any_plan.proxy.url}/v1/chat/completions", timeout=timeout, headers=AUTH, json={
            "model": c.any_plan.cfg.model.served_name, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}).status_code
    except requests.RequestException:
        code = 0
    return code, time.monotonic() - t0


READY: dict[str, float] = {}  # instance -> when all its ranks first answered /health again (epoch s)


def supervise(h: heal.Healer, until, limit_s: float, every_s: float = 1.0) -> list[heal.HealReport]:
    """What `heal --watch every_s` does, until `until(reports)` or limit_s. Meanwhile a watcher
    records when each instance's ranks answer /health again after being down: what the ranks took
    to start on this machine, apart from what heal added."""
    reports, t0, stop = [], time.monotonic(), threading.Event()
    READY.clear()

    def watcher() -> None:
        down: set[str] = set()
        while not stop.is_set():
            for inst in h.plan.instances:
                up = all(harness.http_ok(f"http://{r.address}:{r.port}/health", 1) for r in inst.ranks)
                if not up:
                    down.add(inst.name)
                    READY.pop(inst.name, None)
                elif inst.name in down and inst.name not in READY:
                    READY[inst.name] = time.time()
            time.sleep(0.2)

    w = threading.Thread(target=watcher, daemon=True)
    w.start()
    try:
        while True:
            reports.append(h.heal_once())
            if until(reports):
                return reports
            assert time.monotonic() - t0 < limit_s, "".join(r.text() for r in reports)
            time.sleep(every_s)
    finally:
        stop.set()
        w.join(10)


def healed(name: str):
    return lambda reps: any(x.instance == name and x.outcome == "healed" for x in reps[-1].instances)


def account(scenario: str, fault_at: float, reports: list[heal.HealReport], names: list[str],
            threshold_s: float = 0.0) -> dict:
    """Time to recovery per healed instance, and heal's overhead: fault -> healthy minus what any
    restart costs (the stop, measured; the ranks' own start until they answer /health, measured by
    the watcher: the fakes' START_DELAY_S plus whatever this machine's load adds; a dead worker's
    restart) and minus the configured detection threshold (hang.seconds for a hang)."""
    out = {}
    workers = sum(sum(r.worker_restart_s.values()) for r in reports)  # a dead worker's restart comes first
    for rep in reports:
        for x in rep.instances:
            if x.instance in names and x.outcome == "healed":
                total = x.healthy_at - fault_at
                created = x.healthy_at - x.timings["check"] - x.timings["start"]
                startup = READY.get(x.instance, created + START_DELAY_S) - created
                out[x.instance] = {
                    "fault_to_healthy_s": round(total, 1), "detected_after_s": round(rep.polled_at - fault_at, 1),
                    "stop_s": round(x.timings["stop"], 1), "ranks_start_s": round(startup, 1),
                    "start_delay_s": START_DELAY_S, "launch_s": round(x.timings["start"], 1),
                    "worker_restart_s": round(workers, 1),
                    "overhead_s": round(total - x.timings["stop"] - startup - workers - threshold_s, 1)}
    MEASURED[scenario] = out
    print(f"\n{scenario}: {json.dumps(out)}")
    for name in names:
        assert name in out, f"{name} not healed: {''.join(r.text() for r in reports)}"
        assert out[name]["overhead_s"] < OVERHEAD_LIMIT_S, out
    return out


def test_nothing_broken_nothing_done(cluster):
    c = cluster
    h, run = healer(c)
    rep = h.heal_once()
    assert rep.ok and rep.broken == [] and rep.instances == [] and run.calls == [], rep.text()
    assert "nothing broken" in rep.text()
    assert complete(c)[0] == 200


def test_dry_run_changes_nothing(cluster):
    c = cluster
    victim = harness.ranks_on(c, "p1")[0]
    before = pids(c)
    os.killpg(before[victim.name], signal.SIGKILL)
    harness.wait_for(lambda: not harness.http_ok(f"http://{victim.address}:{victim.port}/health", 1), 20,
                     what="prefill-1 down")
    h, run = healer(c)
    rep = h.heal_once(dry_run=True)
    assert [(x.instance, x.outcome) for x in rep.instances] == [("prefill-1", "planned")], rep.text()
    assert "would restart on p1" in rep.text() and "dry run: nothing changed" in rep.text()
    assert run.calls == [] and h.budget.restarts == {}
    assert pids(c) == before and not harness.alive(before[victim.name])
    # Then for real, so the next scenario starts whole.
    fault = time.time()
    reps = supervise(h, healed("prefill-1"), 120)
    account("dead prefill rank (one-node instance)", fault, reps, ["prefill-1"])
    assert all_healthy(c)


def test_sigkill_one_decode_rank_restarts_the_whole_group(cluster):
    c = cluster
    before = pids(c)
    decode = {k: v for k, v in before.items() if k.startswith("decode-")}
    prefill = {k: v for k, v in before.items() if k.startswith("prefill-")}
    results: list[tuple[int, float]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            results.append(complete(c, timeout=30))
            time.sleep(0.3)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    fault = time.time()
    os.kill(before["decode-0-r2"], signal.SIGKILL)  # on d2: the group's collectives break everywhere
    h, _ = healer(c)
    try:
        reps = supervise(h, healed("decode-0"), 180)
    finally:
        stop.set()
        t.join(40)
    account("SIGKILL one rank of the 4-node decode group", fault, reps, ["decode-0"])
    after = pids(c)
    assert all(after[k] != v for k, v in decode.items()), "every decode rank restarted"
    assert {k: after[k] for k in prefill} == prefill, "prefill untouched"
    assert all_healthy(c)
    # No request hung while decode was gone: each one ended (answered or refused) well within its timeout.
    assert results and all(s < 29 for _, s in results), results  # none ran into the client's 30 s
    assert complete(c)[0] == 200
    # `pulumi up` after the heal: every launch finds its ranks running with the planned command.
    c.run_many([(n, "launch") for n in c.nodes if c.any_plan.instance_on(n)], env=RANK_ENV)
    assert pids(c) == after


def _engine_pid(c: harness.Cluster, node: str, rank: str) -> int:
    log = (c.log_dir(node) / f"{rank}.log").read_text()
    return int(re.findall(r"EngineCore pid (\d+)", log)[-1])


def test_sigstop_a_rank_with_running_requests_is_hung_then_healed(cluster):
    c = cluster
    plan = c.any_plan
    victim = harness.ranks_on(c, "p0")[1]
    engine = _engine_pid(c, "p0", victim.name)
    os.kill(engine, signal.SIGSTOP)
    url = f"http://{victim.address}:{victim.port}"
    body = {"model": plan.cfg.model.served_name, "prompt": "hello", "max_tokens": 4}
    threading.Thread(target=lambda: _swallow(lambda: requests.post(f"{url}/v1/completions", json=body, timeout=60)),
                     daemon=True).start()
    harness.wait_for(lambda: re.search(r"^vllm:num_requests_running\{.*\} 1", requests.get(f"{url}/metrics").text,
                                       re.M), 10, what="a request running on the stopped engine")
    fault = time.time()
    h, run = healer(c)
    reps = supervise(h, healed("prefill-0"), HANG_S + 120, every_s=1.0)
    detected = next(r for r in reps if "prefill-0" in r.broken)
    # hang.seconds + one cycle (1 s apart, a poll within its 5 s deadline) + slack for the load
    assert detected.polled_at - fault <= HANG_S + 1.0 + T.request_s + 2.0, detected.polled_at - fault
    why = next(x for x in reps[-1].instances if x.instance == "prefill-0").why
    assert any(f"{victim.name} hung" in w and "vllm:generation_tokens_total flat" in w for w in why), why
    account("SIGSTOP engine core with a request running (hung)", fault, reps, ["prefill-0"], threshold_s=HANG_S)
    harness.wait_for(lambda: not harness.alive(engine), 10,
                     what=f"the stopped engine core {engine} gone: {_stat(engine)}")
    assert all_healthy(c)


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"


def _swallow(fn) -> None:
    try:
        fn()
    except requests.RequestException:
        pass


def test_crash_loop_hits_the_budget_and_stays_out(cluster):
    c = cluster
    h, run = healer(c, max_restarts=2, backoff_s=0.5)
    run.env["p1"] = {"FAKE_VLLM_EXIT_AT_START": "1"}  # every start on p1 dies
    victim = harness.ranks_on(c, "p1")[0]
    os.killpg(c.pid("p1", victim.name), signal.SIGKILL)
    others = {k: v for k, v in pids(c).items() if not k.startswith("prefill-1")}
    reps = supervise(h, lambda reps: any(x.outcome == "left-out" for x in reps[-1].instances), 120)
    outcomes = [x.outcome for r in reps for x in r.instances if x.instance == "prefill-1"]
    assert outcomes.count("failed") == 2 and outcomes[-1] == "left-out", outcomes
    text = reps[-1].text()
    assert "!!! prefill-1 IS OUT OF THE PROXY AND STAYS OUT" in text and "--max-restarts 2" in text, text
    assert "exited before answering /health" in "".join(r.text() for r in reps)
    again = h.heal_once()  # and it stays out, without another restart
    assert [x.outcome for x in again.instances] == ["left-out"] and run.calls.count("p1") == 4
    assert run.probes == ["p1", "p1"]  # each restart asked p1 first; the left-out one did not
    assert {k: v for k, v in pids(c).items() if not k.startswith("prefill-1")} == others
    assert complete(c)[0] == 200  # the cluster serves without it
    # A person fixes the cause and gives it its budget back.
    del run.env["p1"]
    h.reset("prefill-1")
    reps = supervise(h, healed("prefill-1"), 120)
    assert all_healthy(c)


def test_a_dead_worker_is_restarted_first_then_its_nodes_instance(cluster):
    c = cluster
    address = c.plans["p1"].worker("p1").address
    (wpid,) = harness.worker_pids(address)
    before = pids(c)
    os.kill(wpid, signal.SIGKILL)
    harness.wait_for(lambda: not harness.alive(wpid), 10, what="worker gone")
    fault = time.time()
    h, run = healer(c)
    reps = supervise(h, healed("prefill-1"), 180)
    first = next(r for r in reps if r.workers)
    assert any(w.startswith("p1: restarted") for w in first.workers), first.text()
    assert run.calls[0] == "p1"  # the worker's create ran before anything else
    assert harness.worker_pids(address) and harness.worker_pids(address) != [wpid]
    after = pids(c)
    assert all(after[r.name] != before[r.name] for r in harness.ranks_on(c, "p1"))
    assert all(after[k] == v for k, v in before.items() if not k.startswith("prefill-1"))
    account("dead openYuanrong worker on p1, then prefill-1", fault, reps, ["prefill-1"])
    assert all_healthy(c)


def test_two_failures_at_once_on_different_instances(cluster):
    c = cluster
    before = pids(c)
    fault = time.time()
    os.killpg(before["prefill-0-r0"], signal.SIGKILL)
    os.kill(before["decode-0-r1"], signal.SIGKILL)
    h, _ = healer(c)
    reps = supervise(h, lambda reps: {x.instance for r in reps for x in r.instances if x.outcome == "healed"}
                     >= {"prefill-0", "decode-0"}, 180)
    account("two failures at once: prefill-0 and decode-0", fault, reps, ["prefill-0", "decode-0"])
    after = pids(c)
    assert all(after[k] == v for k, v in before.items() if k.startswith("prefill-1"))
    assert all_healthy(c) and complete(c)[0] == 200
    out = Path(os.environ.get("ASCEND_PD_HEAL_TIMINGS", "/tmp/ascend-pd-heal-timings.json"))
    out.write_text(json.dumps(MEASURED, indent=1))
