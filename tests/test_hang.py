"""Hang detection (ascend_pd/hang.py) and heal's restart budget, then both against a fake rank whose
engine-core process is SIGSTOPped while it holds a request: `/health` stays 200, and status and the
liveness probe call it hung once its counters have been flat for hang.seconds."""

from __future__ import annotations

import json
import os
import shutil
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from ascend_pd.hang import Activity, HangTracker, Observation
from ascend_pd.heal import Budget, HealReport, InstanceHeal
from ascend_pd.probes import probes, probe_dir
from ascend_pd.status import Timeouts, collect_status, format_table, hang_tracker
from status_support import Procs, clean_env, plan_of, rank_env, small_stack, wait_until


def busy(gen: float, succ: float, running: float = 1, start: float = 1000.0) -> Activity:
    return Activity(running=running, waiting=0, generation_tokens=gen, successes=succ, start_time=start)


def obs(rank: str, activity, healthy: bool = True, instance: str = "decode-0", reason: str = "") -> Observation:
    return Observation(rank, instance, healthy, reason, activity)


def test_flat_counters_while_busy_are_a_hang_after_hang_seconds():
    t = HangTracker(hang_s=10, split_s=600)
    (v,) = t.observe([obs("r0", busy(5, 1))], now=100)
    assert v.state == "ok" and v.ranks[0].state == "busy"
    (v,) = t.observe([obs("r0", busy(5, 1))], now=109)
    assert v.state == "ok"  # 9 s flat: not yet
    (v,) = t.observe([obs("r0", busy(5, 1))], now=110)
    assert v.state == "hung" and v.broken
    (why,) = v.evidence
    assert "vllm:generation_tokens_total flat at 5" in why and "vllm:request_success_total flat at 1" in why
    assert re.search(r"since \d\d:\d\d:\d\d UTC \(10s >= hang.seconds 10\)", why), why
    assert v.ranks[0].flat_since == 100


def test_moving_counters_idle_ranks_and_restarts_are_not_hangs():
    t = HangTracker(hang_s=10, split_s=600)
    for i, now in enumerate(range(100, 160, 5)):
        (v,) = t.observe([obs("r0", busy(5 + i, 1))], now=now)  # tokens flow: busy, never hung
        assert v.state == "ok"
    (v,) = t.observe([obs("r0", busy(100, 9, running=0))], now=200)
    assert v.ranks[0].state == "idle"
    t.observe([obs("r0", busy(100, 9))], now=300)
    (v,) = t.observe([obs("r0", busy(0, 0, start=2000))], now=315)  # another process: counters reset
    assert v.state == "ok", v.evidence  # its clock restarts with it
    (v,) = t.observe([obs("r0", busy(0, 0, start=2000))], now=326)
    assert v.state == "hung"


def test_dead_ranks_and_split_groups():
    t = HangTracker(hang_s=10, split_s=60)
    (v,) = t.observe([obs("r0", None, healthy=False, reason="connection refused"), obs("r1", busy(1, 1))], now=1)
    assert v.state == "dead" and v.evidence == ["r0 dead: connection refused"]
    # r1 started 200 s after r0: it cannot be in the group r0 formed.
    (v,) = t.observe([obs("r0", busy(1, 1, 0, start=1000)), obs("r1", busy(1, 1, 0, start=1200))], now=2)
    assert v.state == "split" and "r1 started 200s after r0" in v.evidence[0]
    # With history: one rank's process changed between polls, the other's did not.
    t = HangTracker(hang_s=10, split_s=600)
    t.observe([obs("r0", busy(1, 1, 0, start=1000)), obs("r1", busy(1, 1, 0, start=1001))], now=1)
    (v,) = t.observe([obs("r0", busy(0, 0, 0, start=1030)), obs("r1", busy(1, 1, 0, start=1001))], now=40)
    assert v.state == "split" and "r0 restarted since the last poll" in v.evidence[-1]
    # A rank whose /metrics fails but /health answers is not judged (status reports /metrics itself).
    (v,) = HangTracker(10, 60).observe([obs("r0", None)], now=1)
    assert v.state == "ok" and v.ranks[0].state == "unknown"


def test_restart_budget_backoff_and_persistence(tmp_path):
    b = Budget(max_restarts=3, window_s=600, backoff_s=10, path=tmp_path / "heal.json")
    assert b.wait_s("p0", 0) == 0 and not b.exhausted("p0", 0)
    b.record("p0", 100)
    assert b.wait_s("p0", 105) == 5  # 10 s after the first
    b.record("p0", 110)
    assert b.wait_s("p0", 110) == 20  # doubled
    b.record("p0", 130)
    assert b.exhausted("p0", 131) and not b.exhausted("p1", 131)
    assert not b.exhausted("p0", 100 + 601)  # the first fell out of the window
    again = Budget(max_restarts=3, window_s=600, path=tmp_path / "heal.json")
    assert again.recent("p0", 131) == [100, 110, 130]


def test_the_report_says_loudly_what_is_left_out():
    rep = HealReport("s", 0.0, broken=["prefill-1"], instances=[
        InstanceHeal("prefill-1", ["prefill-1-r0 dead: connection refused"], "left-out", "restarted 3 time(s)")])
    text = rep.text()
    assert "!!! prefill-1 IS OUT OF THE PROXY AND STAYS OUT: restarted 3 time(s)" in text
    assert "A PERSON MUST LOOK" in text and "--reset prefill-1" in text and not rep.ok


# ---------------------------------------------------------------------------------------------
# A real hang: the fake rank's engine core SIGSTOPped with a request in it

ADDRS = {"n0": "127.0.2.61", "n1": "127.0.2.62"}
HANG_S = 2


@pytest.fixture
def hung_rank(tmp_path):
    values = small_stack(tmp_path, ADDRS, prefill=["n0"], decode=["n1"], etcd_node="n0", proxy_node="n0",
                         prefill_dp=1, decode_dp=1, etcd_port=12679, port_base=17600, proxy_port=18620)
    values["hang"] = {"seconds": HANG_S}
    plan = plan_of(values)
    procs = Procs(tmp_path / "logs")
    victim, other = plan.ranks_of("decode")[0], plan.ranks_of("prefill")[0]
    try:
        for r in (victim, other):
            procs.start(f"rank-{r.name}", list(r.argv), rank_env(r, FAKE_VLLM_ENGINE_PROCESS="1"))
        for r in (victim, other):
            wait_until(lambda r=r: _health(r) == 200, 30, f"rank {r.name}")
        yield tmp_path, plan, procs, victim, other
    finally:
        for name in list(procs.procs):
            engine = _engine_pid(procs, name)
            if engine:
                try:
                    os.kill(engine, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        procs.stop_all()


def _health(r) -> int:
    try:
        return requests.get(f"http://{r.address}:{r.port}/health", timeout=2, proxies={"http": None}).status_code
    except requests.RequestException:
        return 0


def _engine_pid(procs: Procs, name: str):
    m = re.search(r"EngineCore pid (\d+)", procs.log(name))
    return int(m.group(1)) if m else None


@pytest.mark.integration
def test_a_stopped_engine_core_is_hung_in_status_and_the_probe(hung_rank):
    tmp, plan, procs, victim, other = hung_rank
    engine = _engine_pid(procs, f"rank-{victim.name}")
    assert engine, procs.log(f"rank-{victim.name}")
    os.kill(engine, signal.SIGSTOP)
    threading.Thread(target=lambda: _complete(plan, victim), daemon=True).start()  # never answered
    wait_until(lambda: "vllm:num_requests_running{" in _metrics(victim) and
               re.search(r"^vllm:num_requests_running\{.*\} 1", _metrics(victim), re.M), 10, "request running")
    assert _health(victim) == 200  # the API server still says healthy: the point of this check

    (tmp / "liveness").write_text("liveness check success")
    script = probes(plan, "n1")
    assert subprocess.run(["bash", "-s"], input=script.create, capture_output=True, text=True, timeout=30).returncode == 0
    probe = f"{probe_dir(plan)}/liveness.sh"
    first = subprocess.run(["bash", probe], capture_output=True, text=True, timeout=30, env=clean_env())
    assert first.returncode == 0, first.stdout  # its clock starts now

    tracker = hang_tracker(plan)
    t = Timeouts(connect_s=1, request_s=2, smoke_s=2)
    t0 = time.monotonic()
    rep = collect_status(plan, timeouts=t, smoke=False, tracker=tracker)
    verdicts = {v.instance: v for v in rep.instances}
    assert verdicts["decode-0"].state == "ok"
    while verdicts["decode-0"].state != "hung":
        assert time.monotonic() - t0 < HANG_S + 5, verdicts  # hang.seconds + one poll, with slack for load
        time.sleep(0.5)
        rep = collect_status(plan, timeouts=t, smoke=False, tracker=tracker)
        verdicts = {v.instance: v for v in rep.instances}
    detected = time.monotonic() - t0
    assert verdicts["prefill-0"].state == "ok"  # the other instance is not blamed
    problems = {p.component: p.reason for p in rep.problems}
    # The hung rank is a problem of its own, named with its node and address (as a dead one is).
    hung = problems[f"rank {victim.name} ({victim.node} {victim.address}:{victim.port})"]
    assert hung.startswith("hung: 1 request(s) running") and "vllm:generation_tokens_total flat at 0" in hung
    assert {r.name: r.state for r in rep.ranks}[victim.name] == "hung"
    assert "HUNG" in format_table(plan, rep)
    print(f"\nhung detected {detected:.1f}s after the first poll (hang.seconds {HANG_S})")

    time.sleep(max(0.0, HANG_S - (time.monotonic() - t0)) + 0.5)
    second = subprocess.run(["bash", probe], capture_output=True, text=True, timeout=30, env=clean_env())
    assert second.returncode == 1, second.stdout
    assert f"rank {victim.name}: hung: 1 request(s) running" in second.stdout
    assert "vllm:request_success_total flat at 0" in second.stdout

    # One poll alone cannot know: it says so instead of calling the rank fine.
    alone = collect_status(plan, timeouts=t, smoke=False)
    assert {v.instance: v.state for v in alone.instances}["decode-0"] == "ok"
    assert "hang detection needs counters from two polls" in alone.hang_note


def _complete(plan, r) -> None:
    try:
        requests.post(f"http://{r.address}:{r.port}/v1/completions", timeout=60, proxies={"http": None},
                      json={"model": plan.cfg.model.served_name, "prompt": "hello", "max_tokens": 4})
    except requests.RequestException:
        pass


def _metrics(r) -> str:
    try:
        return requests.get(f"http://{r.address}:{r.port}/metrics", timeout=2, proxies={"http": None}).text
    except requests.RequestException:
        return ""


# ---------------------------------------------------------------------------------------------
# The command line (a stack on loopback addresses where nothing runs: every connection is refused)


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    import sys

    from status_support import write_stack

    write_stack(tmp_path / "project", "idle", small_stack(
        tmp_path, {"n0": "127.0.2.81", "n1": "127.0.2.82"}, prefill=["n0"], decode=["n1"], etcd_node="n0",
        proxy_node="n0", etcd_port=12879, port_base=17800, proxy_port=18820))
    return subprocess.run([sys.executable, "-m", "ascend_pd", "heal", "--stack", "idle", "--project-dir",
                           str(tmp_path / "project"), "--state", str(tmp_path / "heal.json"), *args],
                          capture_output=True, text=True, timeout=60, env=clean_env(),
                          cwd=Path(__file__).resolve().parents[1])


def test_heal_cli_dry_run_says_what_it_would_do_and_changes_nothing(tmp_path):
    done = _cli(tmp_path, "--dry-run")
    assert done.returncode == 1, done.stdout + done.stderr  # everything broken stays broken: exit 1
    out = done.stdout
    assert "(dry run: nothing changed)" in out
    assert "prefill-0: planned: would restart on n0" in out and "decode-0: planned: would restart on n1" in out
    assert "because prefill-0-r0 dead: connection refused" in out
    assert "heal does not restart etcd" in out  # etcd is down too: said, not acted on
    assert not (tmp_path / "heal.json").exists()  # no restart recorded


def test_heal_cli_refuses_bad_options(tmp_path):
    done = _cli(tmp_path, "--max-restarts", "3")
    assert done.returncode == 2 and "--max-restarts and --window go together" in done.stderr
    done = _cli(tmp_path, "--dry-run", "--reset", "prefill-9")
    assert done.returncode == 2 and "--reset prefill-9: the stack has no such instance (prefill-0, decode-0)" in done.stderr
    done = _cli(tmp_path, "--window", "0", "--max-restarts", "1")
    assert done.returncode == 2 and "--window" in done.stderr



def test_heal_cli_over_ssh_blocks_instances_whose_nodes_ssh_cannot_reach(tmp_path):
    """No sshd on the nodes' addresses (nothing listens at all): `ssh true` fails on each node before
    anything is stopped, so both instances are blocked, naming the node and ssh's reason; nothing was
    restarted, so the budget file records none; exit 1."""
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client (setup.sh installs openssh-client)")
    done = _cli(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    for inst, node, address in (("prefill-0", "n0", "127.0.2.81"), ("decode-0", "n1", "127.0.2.82")):
        assert f"{inst}: blocked: {node} ({address}) does not answer: " in done.stdout, done.stdout
        assert f"{node}: unreachable over ssh root@{address}:22" in done.stdout
    assert not (tmp_path / "heal.json").exists() or json.loads((tmp_path / "heal.json").read_text()) == {}
