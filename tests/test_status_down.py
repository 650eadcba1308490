"""What `status` and `heal` say about a cluster that is down, partly down or hung (issue 22, items 3
and 7): a per-node summary first, an unreachable node folded into one line, registrations unknown
rather than 0, no "serving" while nothing is healthy, hung ranks hung in every view, heal's one-poll
note about hangs and its dry run's exit code.

A dead cluster is a plan whose addresses nothing listens on (127.0.5.x: every connect is refused at
once); a live or hung one is `status_support.hostile` servers answering as a healthy cluster does, with
chosen ranks busy and their counters flat."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ascend_pd import heal
from ascend_pd.status import Timeouts, run
from status_support import Blackhole, a2_8node_on_loopback, clean_env, plan_of, small_stack, write_stack
from status_support.hostile import Hostile, Routes, accept_only, respond
from test_status_robust import endpoints, healthy_routes

MAIN = Path(__file__).resolve().parents[1]
QUICK = Timeouts(connect_s=0.5, request_s=1.0, smoke_s=1.0)  # refused connects fail at once
CALM = Timeouts(connect_s=5, request_s=10, smoke_s=10)  # live servers on a loaded machine
REFUSED = "connection refused (nothing listening)"


def dead_a2_8node(tmp: Path) -> dict:
    """The committed a2-8node stack (8 nodes, 40 ranks; etcd and proxy on p0) on 127.0.5.1-8."""
    values = a2_8node_on_loopback(tmp)
    for i, node in enumerate(values["nodes"]):
        node["address"] = f"127.0.5.{i + 1}"
    return values


def poll_text(plan, **kw) -> str:
    out = io.StringIO()
    assert run(plan, timeouts=QUICK, out=out, err=io.StringIO(), **kw) == 1
    return out.getvalue()


def problem_lines(text: str) -> list[str]:
    return text.split("\nPROBLEMS (")[1].split("\n\n")[0].splitlines()[1:]  # up to the LOGS section


# ---------------------------------------------------------------------------------------------
# A dead cluster (nothing listens anywhere)


def test_dead_cluster_is_one_line_per_node_first(tmp_path):
    plan = plan_of(dead_a2_8node(tmp_path), "a2-8node")
    text = poll_text(plan)
    lines = text.splitlines()
    # The per-node summary comes first, one row per node.
    assert lines[2].startswith("NODES") and lines[3].split() == ["NODE", "ADDRESS", "STATE", "DETAIL"]
    assert lines[4] == f"p0    127.0.5.1  UNREACHABLE  2 ranks, worker, etcd, proxy: {REFUSED}"
    assert lines[8] == f"d0    127.0.5.5  UNREACHABLE  8 ranks, worker: {REFUSED}"
    assert text.index("NODES") < text.index("COMPONENT")
    # The problems: one line per node, nothing else (the 52 component problems are folded).
    assert lines[0].endswith(": 8 PROBLEM(S) (52 with -v: one per component)"), lines[0]
    shown = problem_lines(text)
    assert shown[0] == f"  p0 127.0.5.1: unreachable (2 ranks, worker, etcd, proxy): {REFUSED}"
    assert shown[4] == f"  d0 127.0.5.5: unreachable (8 ranks, worker): {REFUSED}"
    assert len([x for x in shown if x.startswith("  ")]) == 8
    assert "rank decode-0-r7" not in text and "decode-0-r31 dead" not in text
    assert "32 rank(s) dead: on unreachable node(s) d0, d1, d2, d3" in text
    assert len(lines) <= 45, text  # was 118: 44 problem lines, 40 rank rows, 32 reasons in one cell

    # -v: every component on its own line, every rank in the table.
    verbose = poll_text(plan, verbose=True)
    assert len(problem_lines(verbose)) == 52 and "52 PROBLEM(S)" in verbose.splitlines()[0]
    assert f"  rank decode-0-r7 (d0 127.0.5.5:7107): {REFUSED}" in verbose
    assert re.search(r"\ndecode-0-r31 +d3 +127\.0\.5\.8:7107 +FAIL ", verbose), verbose
    assert "unreachable (" not in "\n".join(problem_lines(verbose))

    # --json: every component's problem with its node, and the nodes.
    j = json.loads(poll_text(plan, as_json=True))
    assert len(j["problems"]) == 52 and j["ok"] is False
    assert {"component": "rank decode-0-r7 (d0 127.0.5.5:7107)", "reason": REFUSED, "node": "d0"} in j["problems"]
    assert [(n["node"], n["state"], n["runs"]) for n in j["nodes"][:2]] == [
        ("p0", "unreachable", "2 ranks, worker, etcd, proxy"), ("p1", "unreachable", "2 ranks, worker")]
    assert all(n["reason"] == REFUSED and n["state"] == "unreachable" for n in j["nodes"])


def test_registrations_are_unknown_not_zero_when_etcd_is_unreachable(tmp_path):
    plan = plan_of(dead_a2_8node(tmp_path), "a2-8node")
    text = poll_text(plan)
    row = next(x for x in text.splitlines() if x.startswith("openYuanrong workers"))
    assert row.split(None, 3)[2:] == ["UNKNOWN", "unknown (etcd unreachable); 8/8 not answering on their port"]
    assert "0/8 registered" not in text
    j = json.loads(poll_text(plan, as_json=True))
    assert j["workers_registered"] is None and j["etcd"]["reachable"] is False
    assert all(w["registered"] is None for w in j["workers"])


def test_nothing_is_serving_while_no_rank_is_healthy(tmp_path):
    plan = plan_of(dead_a2_8node(tmp_path), "a2-8node")
    row = next(x for x in poll_text(plan).splitlines() if x.startswith("vLLM ranks"))
    assert row.split(None, 3)[2:] == ["FAIL", "0/40 healthy"]


def test_heal_dry_run_on_a_dead_cluster_exits_1(tmp_path):
    """The CLI, and the supervisor loop with dry_run: nothing changes, so everything stays broken."""
    values = dead_a2_8node(tmp_path)
    write_stack(tmp_path / "project", "a2-8node", values)
    done = subprocess.run([sys.executable, "-m", "ascend_pd", "heal", "--stack", "a2-8node", "--dry-run",
                           "--project-dir", str(tmp_path / "project"), "--state", str(tmp_path / "heal.json")],
                          capture_output=True, text=True, timeout=60, env=clean_env(), cwd=MAIN)
    assert done.returncode == 1, done.stdout + done.stderr
    # Every connect refused: the nodes are up (their kernels answered), their services dead: restarts.
    assert "decode-0: planned: would restart on d0, d1, d2, d3" in done.stdout
    assert "heal does not restart etcd" in done.stdout and not (tmp_path / "heal.json").exists()

    plan = plan_of(values, "a2-8node")
    healer = heal.Healer(plan, lambda node, command, timeout_s: (1, "", "dry run"), timeouts=QUICK)
    out = io.StringIO()
    assert heal.watch(healer, 0.1, count=2, dry_run=True, out=out) == 1
    assert out.getvalue().count("prefill-3: planned: would restart on p3") == 2


# ---------------------------------------------------------------------------------------------
# Live clusters (hostile.py servers answering as a healthy cluster does)


def live_stack(tmp: Path, n: int, hang_s: int = 1) -> dict:
    """A small stack on 127.0.5.(20+2n) and 127.0.5.(21+2n): etcd, proxy and 2 prefill ranks on n0, 2
    decode ranks on n1, a worker on each."""
    values = small_stack(tmp, {"n0": f"127.0.5.{20 + 2 * n}", "n1": f"127.0.5.{21 + 2 * n}"}, prefill=["n0"],
                         decode=["n1"], etcd_node="n0", proxy_node="n0")
    values["hang"] = {"seconds": hang_s}
    return values


def busy_metrics(hung: set[tuple[str, int]]):
    """/metrics of ranks idle, but those at `hung` (address, port): 1 request running, counters flat."""

    def handler(req, conn, stop):
        running = 1 if (req.address, req.port) in hung else 0
        respond(conn, ('vllm:num_requests_running{engine="0"} %d\n'
                       'vllm:generation_tokens_total{engine="0"} 5\n'
                       'vllm:request_success_total{engine="0",finished_reason="stop"} 2\n' % running).encode(),
                ctype="text/plain")

    return handler


@contextmanager
def serving(plan, *, down: str = "", metrics=None):
    """Every endpoint of `plan` answering as a healthy cluster, but none on node `down`."""
    http, workers, kinds = endpoints(plan)
    address = plan.node(down).address if down else None
    routes = healthy_routes(plan, **({"rank__metrics": metrics} if metrics else {}))
    servers = [Hostile([b for b in http if b[0] != address], Routes(kinds, routes)),
               Hostile([b for b in workers if b[0] != address], accept_only())]
    try:
        yield
    finally:
        for s in servers:
            s.close()


def test_heal_restarts_every_dead_worker_at_once(tmp_path):
    """Issue 40: at 256 nodes, one worker restart after another (seconds each) was minutes before any
    instance was looked at. Every rank, etcd and the proxy answer; both workers' ports refuse: the
    two are restarted side by side (the ssh gate, tests/test_ssh_gate.py, bounds the sessions), each
    once, each reported."""
    plan = plan_of(live_stack(tmp_path, 3))
    live, most, calls = [0], [0], []
    lock = threading.Lock()

    def run_(node, command, timeout_s):
        with lock:
            calls.append(node)
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(1.0)
        with lock:
            live[0] -= 1
        return 0, "", ""

    http, _, kinds = endpoints(plan)
    server = Hostile(http, Routes(kinds, healthy_routes(plan)))  # no worker listens
    try:
        healer = heal.Healer(plan, run_, timeouts=Timeouts(connect_s=2, request_s=5, smoke_s=5))
        healer.heal_instance = lambda inst, why: heal.InstanceHeal(inst.name, why, "restarted", "not under test")
        rep = healer.heal_once()
    finally:
        server.close()
    assert sorted(calls) == ["n0", "n1"]  # one worker create per node, nothing else reached a node
    assert [w.split(":")[0] for w in rep.workers] == ["n0", "n1"], rep.text()
    assert all(": restarted in " in w for w in rep.workers), rep.workers
    assert most[0] == 2, most[0]  # side by side (one after the other would be 1)


def test_one_node_down_is_one_rank_row_and_one_problem(tmp_path):
    plan = plan_of(live_stack(tmp_path, 0))
    n1 = plan.node("n1").address
    with serving(plan, down="n1"):
        out = io.StringIO()
        assert run(plan, timeouts=CALM, smoke=False, out=out, err=io.StringIO()) == 1
    text = out.getvalue()
    assert re.search(r"\nn0 +127\.0\.5\.20 +ok +2 ranks, worker, etcd, proxy\n", text), text
    assert re.search(rf"\nn1 +{n1} +UNREACHABLE +2 ranks, worker: {re.escape(REFUSED)}\n", text), text
    # The rank table: n0's ranks one by one, n1's as one row.
    assert re.search(r"\nprefill-0-r1 +n0 +127\.0\.5\.20:17101 +ok ", text), text
    assert re.search(rf"\ndecode-0-r0\.\.r1 +n1 +{n1} +UNREACHABLE +- +- +-\n", text), text
    assert "decode-0-r1 " not in text
    # The proxy's /healthcheck is the fake's (2 and 2): not a problem of n1.
    assert problem_lines(text) == [f"  n1 {n1}: unreachable (2 ranks, worker): {REFUSED}",
                                   "note: an unreachable node is one line for the problems of everything on it; "
                                   "-v or --json lists all 3"]


class Recorder:
    """A heal Runner that records every command; `silent` nodes fail as ssh to a dead host does."""

    def __init__(self, silent=()):
        self.silent, self.calls = set(silent), []

    def __call__(self, node, command, timeout_s):
        self.calls.append((node, command))
        if node in self.silent:
            return 255, "", f"ssh: connect to host {node} port 22: No route to host"
        return 0, "", ""


def test_heal_stops_nothing_of_a_group_whose_node_is_gone(tmp_path):
    """Issue 39, item 5: n1 gone (every connect to it times out, as to a dead machine), its instance
    broken. heal neither stops the instance's ranks nor sends its node a script: it says the node, why,
    and what gets it back; the run is a failure (exit 1), dry or not. The instance on n0 is not touched.
    A node that refuses connections is up, its services dead: that one is restarted (the dead cluster
    above)."""
    plan = plan_of(live_stack(tmp_path, 2))
    n1 = plan.node("n1").address
    holes = [Blackhole(a, p) for a, p in [*endpoints(plan)[0], *endpoints(plan)[1]] if a == n1]
    quick = Timeouts(connect_s=1, request_s=3, smoke_s=3)
    try:
        with serving(plan, down="n1"):
            run_ = Recorder()
            rep = heal.Healer(plan, run_, timeouts=quick).heal_once()
            dry = heal.Healer(plan, run_, timeouts=quick).heal_once(dry_run=True)
    finally:
        for h in holes:
            h.close()
    for r in (rep, dry):
        [h] = r.instances
        assert (h.instance, h.outcome) == ("decode-0", "blocked"), r.text()
        assert h.detail.startswith(f"n1 ({n1}) does not answer: no TCP connection within 1s"), h.detail
        assert "nothing was stopped" in h.detail and f"ascend-pd forget-node --stack {plan.stack} " in h.detail
        assert r.workers == ["n1: not restarted: the node does not answer"]
        assert not r.ok and "decode-0: blocked: n1" in r.text()
    assert run_.calls == [], run_.calls  # not even the proxy: nothing changes


def test_heal_checks_ssh_to_every_node_of_a_group_before_it_stops_any(tmp_path):
    """A group whose ranks answer on every node but one node's ssh does not (status cannot see it):
    the restart stops before its first step, on no node; with every node answering it goes ahead."""
    plan = plan_of(small_stack(tmp_path, {"n0": "127.0.5.40", "n1": "127.0.5.41", "n2": "127.0.5.42"},
                               prefill=["n0"], decode=["n1", "n2"], etcd_node="n0", proxy_node="n0",
                               decode_nodes_per_instance=2))
    inst = next(i for i in plan.instances if i.role == "decode")
    assert inst.nodes == ("n1", "n2")
    run_ = Recorder(silent={"n2"})
    h = heal.Healer(plan, run_).heal_instance(inst, ["decode-0-r0 dead"])
    assert h.outcome == "blocked" and h.detail.startswith("n2 (127.0.5.42) does not answer: ssh: connect to host")
    assert "its ranks on n1 were not stopped" in h.detail
    assert sorted(run_.calls) == [("n1", "true"), ("n2", "true")]  # the probe, and nothing else
    assert heal.Healer(plan, run_).budget.recent(inst.name, 1e12) == []  # a block costs no restart

    run_ = Recorder()
    h = heal.Healer(plan, run_).heal_instance(inst, ["decode-0-r0 dead"])
    stops = [node for node, command in run_.calls if command != "true" and "docker exec" in command]
    assert {"n1", "n2"} <= set(stops), run_.calls  # past the probe: the group's launch ran on both


def test_hung_ranks_are_hung_in_every_view(tmp_path):
    """Two ranks busy with flat counters under --watch: the second poll (1.2 s later, hang.seconds 1)
    calls them hung in the rank rows, the ranks' count, the problems (node and address) and the JSON."""
    plan = plan_of(live_stack(tmp_path, 1))
    victims = [plan.ranks_of("prefill")[1], plan.ranks_of("decode")[0]]
    with serving(plan, metrics=busy_metrics({(r.address, r.port) for r in victims})):
        out, jout = io.StringIO(), io.StringIO()
        assert run(plan, watch=1.2, count=2, timeouts=CALM, smoke=False, out=out, err=io.StringIO()) == 1
        assert run(plan, watch=1.2, count=2, as_json=True, timeouts=CALM, smoke=False, out=jout,
                   err=io.StringIO()) == 1
    text = out.getvalue().split("\n\nascend-pd status")[1]  # the second poll
    for r in victims:
        assert re.search(rf"\n{r.name} +{r.node} +{r.address}:{r.port} +HUNG ", text), text
        assert re.search(rf"\n  rank {r.name} \({r.node} {r.address}:{r.port}\): hung: 1 request\(s\) running, "
                         r"vllm:generation_tokens_total flat at 5 and vllm:request_success_total flat at 2 since ",
                         text), text
    assert re.search(r"\nvLLM ranks +FAIL +2/4 healthy, 2 hung, serving 'tiny-test-model'\n", text), text
    first, second = (json.loads(x) for x in jout.getvalue().splitlines())
    assert all(r["state"] == "ok" for r in first["ranks"])  # one poll: no history, no hang yet
    states = {r["name"]: (r["state"], r["ok"], r["node"], r["url"]) for r in second["ranks"]}
    for r in victims:
        assert states[r.name] == ("hung", False, r.node, f"http://{r.address}:{r.port}")
    hung = [p for p in second["problems"] if "hung" in p["reason"]]
    assert [(p["component"], p["node"]) for p in hung] == [
        (f"rank {r.name} ({r.node} {r.address}:{r.port})", r.node) for r in victims]


def test_one_shot_heal_says_hangs_need_watch(tmp_path):
    """One poll cannot see a hang: a one-shot dry run says so; `heal --watch` (its second cycle) sees it."""
    plan = plan_of(live_stack(tmp_path, 2))
    victim = plan.ranks_of("decode")[1]
    with serving(plan, metrics=busy_metrics({(victim.address, victim.port)})):
        rep = heal.Healer(plan, lambda *a: (1, "", "dry run"), timeouts=CALM).heal_once(dry_run=True)
        out = io.StringIO()
        healer = heal.Healer(plan, lambda *a: (1, "", "dry run"), timeouts=CALM)
        code = heal.watch(healer, 1.2, count=2, dry_run=True, out=out)
    text = rep.text()
    assert "nothing broken that one poll can see (hangs: see the note)" in text, text
    assert "  note: hangs are not judged: one poll has no history" in text and "`heal --watch` judges them" in text
    assert rep.ok and rep.broken == [] and not rep.hangs_judged  # exit 0: nothing broken that it can see
    assert code == 1, out.getvalue()
    second = out.getvalue().split("ascend-pd heal")[2]
    assert "decode-0: planned: would restart on n1" in second and f"because {victim.name} hung: " in second
    assert "hangs are not judged" not in second
