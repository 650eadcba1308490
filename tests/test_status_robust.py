"""`status` is bounded in time and memory whatever an endpoint does (issue 8, part 3).

The CLI runs as a subprocess, so its wall time and peak RSS (os.wait4) are real, against loopback
servers (`status_support.hostile`) that trickle, hang after the headers, send 300 MB with and without
Content-Length, send gzip bombs and garbage, answer +Inf/NaN counters and terminal escape codes, or
pose as an etcd gateway with hostile answers. Every run must end within the documented bound plus
1 s, under 200 MB, with exit code 1, the right problem lines, strictly valid JSON with --json, and no
control character in the output. The documented bound is max(--timeout, --smoke-timeout) for the
poll (the report's own `elapsed_s`) and that plus the command's own start for the process. The start
is measured by a control run, started at the same moment, of the same command against the same
stack with nothing listening; half of it again is allowed as noise (processes started together on a
machine loaded by others finish up to ~40 % apart; on a quiet one that is ~0.3 s). Malformed etcd
answers, HTTP edge cases and the option checks are run in-process (fast)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from ascend_pd import __main__ as cli_main
from ascend_pd import status
from ascend_pd.status import metrics as status_metrics, read as status_read, report as status_report
from ascend_pd.status import text as status_text
from ascend_pd.status import MetricsParseError, Timeouts, collect_status, format_table, parse_prometheus
from status_support import clean_env, plan_of, small_stack, write_stack
from status_support.hostile import (
    Hostile, Routes, accept_only, b64, etcd_answers, etcd_kv, gzip_bomb, hang_after_headers, head,
    huge, respond, trickle_body, trickle_headers, garbage,
)

MAIN = Path(__file__).resolve().parents[1]
MODEL = "tiny-test-model"
TIMEOUT_S = 1.0  # --timeout and --smoke-timeout of the CLI runs
POLL_BOUND_S = TIMEOUT_S  # documented: one poll takes at most max(--timeout, --smoke-timeout)
SLACK_S = 1.0  # the brief: within the documented bound + 1 s
START_NOISE = 0.5  # x the control run's wall time, see the module docstring
MAX_RSS_MB = 200
# What must never reach a terminal: C0 controls but the newline, DEL, C1 controls, bidi/zero-width
# format characters, line/paragraph separators.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
FAST = Timeouts(connect_s=0.5, request_s=0.5, smoke_s=0.5)  # where the deadline is what is tested
CALM = Timeouts(connect_s=5, request_s=10, smoke_s=10)  # where it is not: a loaded machine must not matter


# ---------------------------------------------------------------------------------------------
# A small stack whose every endpoint is one Hostile server


def stack_values(tmp: Path, n: int) -> dict:
    """Stack n of this module on 127.0.3.(2n+1) and 127.0.3.(2n+2): etcd, proxy and 2 prefill ranks
    on the first node, 2 decode ranks on the second, a worker on each."""
    addrs = {"n0": f"127.0.3.{2 * n + 1}", "n1": f"127.0.3.{2 * n + 2}"}
    return small_stack(tmp, addrs, prefill=["n0"], decode=["n1"], etcd_node="n0", proxy_node="n0")


def endpoints(plan) -> tuple[list[tuple[str, int]], list[tuple[str, int]], dict[int, str]]:
    """(HTTP endpoints, worker ports, port -> kind) of a plan."""
    http = [(plan.etcd.address, plan.etcd.client_port), (plan.proxy.address, plan.proxy.port)]
    http += [(r.address, r.port) for r in plan.ranks]
    workers = [tuple(w.address.rsplit(":", 1)) for w in plan.workers]
    workers = [(a, int(p)) for a, p in workers]
    kinds = {plan.etcd.client_port: "etcd", plan.proxy.port: "proxy", workers[0][1]: "worker"}
    return http, workers, kinds


def healthy_routes(plan, **replace) -> dict:
    """What a healthy cluster answers, by (kind, path); keyword `kind__path` replaces one route."""
    routes = {("etcd", path): answer for path, answer in etcd_answers([w.address for w in plan.workers]).items()}
    served = [0]  # completions answered: a healthy P/D cluster's prefill and decode counters follow them

    def completion(req, conn, stop):
        served[0] += 1
        respond(conn, {"choices": [{"message": {"role": "assistant", "content": "hi"}}]})

    def metrics(req, conn, stop):
        n = served[0]
        respond(conn, ("# TYPE vllm:prefix_cache_queries_total counter\n"
                       'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
                       'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 50.0\n'
                       f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {n}\n'
                       f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="m"}} {5 * n}\n').encode(),
                ctype="text/plain")

    routes.update({
        ("rank", "/health"): b"",
        ("rank", "/v1/models"): {"object": "list", "data": [{"id": MODEL, "object": "model"}]},
        ("rank", "/metrics"): metrics,
        ("proxy", "/healthcheck"): {"status": "ok", "prefill_instances": 2, "decode_instances": 2},
        ("proxy", "/v1/chat/completions"): completion,
    })
    for key, route in replace.items():
        kind, path = key.split("__")
        routes[(kind, "/" + path.replace("_", "/"))] = route
    return routes


@dataclass(frozen=True)
class Scenario:
    """`handler(plan)` serves every HTTP endpoint (worker ports only accept); `expect` maps a kind of
    component (etcd, workers, proxy, smoke, rank) to a text each of its problem reasons must hold;
    `only`: no other kind may have a problem."""

    handler: Callable
    expect: dict[str, str]
    only: bool = False
    check: Optional[Callable] = None  # (plan, json report, table) -> None, more assertions


def generic(make: Callable, text: str, metrics_text: Optional[str] = None) -> Scenario:
    expect = {"etcd": text, "workers": text, "proxy": text, "smoke": text, "rank": metrics_text or text}
    return Scenario(lambda plan: make(), expect)


def _liar(plan, **replace):
    _, _, kinds = endpoints(plan)
    return Routes(kinds, healthy_routes(plan, **replace))


ESC = "\x1b[2J\x1b]0;owned\x07\x1b[31m\r\x08\x9b6n\u202e\u2028"


def _escapes_routes(plan):
    w0, w1 = (w.address for w in plan.workers)
    kvs = [etcd_kv(f"/datasystem/cluster/{w0}", "1764460000;\x1b[5mready"),
           etcd_kv(f"/datasystem/cluster/{w1}", "1764460000;ready"),
           etcd_kv(f"/datasystem/cluster/{ESC}evil:1", "1;ready")]
    members = [{"ID": "1", "name": f"etcd{ESC}", "peerURLs": [f"http://x{ESC}"], "clientURLs": []}]
    status_answer = {"version": f"3.5.9{ESC}", "leader": "1"}
    return _liar(
        plan,
        **{"etcd__v3_kv_range": {"kvs": kvs}, "etcd__v3_cluster_member_list": {"members": members},
           "etcd__v3_maintenance_status": status_answer,
           "rank__health": lambda req, conn, stop: respond(conn, f"engine dead {ESC}", "500 Internal Server Error"),
           "rank__v1_models": {"data": [{"id": f"{MODEL}{ESC}"}]},
           "rank__metrics": f"vllm:x{{a=\"{ESC}\"}} 1 2 3 {ESC}\n".encode(),
           "proxy__healthcheck": lambda req, conn, stop: respond(conn, f"down {ESC}", "503 Service Unavailable"),
           "proxy__v1_chat_completions": {"choices": [{"message": {"content": f"hello {ESC} world"}}]}})


def _check_escapes(plan, report, table):
    # Shown, escaped: not dropped.
    assert "\\x1b[2J" in table and "\\u202e" in table, table
    assert report["etcd"]["ok"] and report["etcd"]["members"][0]["name"].startswith("etcd\\x1b[2J")
    # Unreadable /metrics leave the P/D path unproven; the answer's text is still shown, escaped.
    assert not report["smoke"]["ok"] and re.search(r"\nsmoke chat completion +FAIL +'hello \\x1b\[2J", table), table
    # A label value with \r, \x85 or \u2028 stays on its sample line (lines end at \n only).
    assert "bad sample line 'vllm:x{a=\"\\x1b[2J\\x1b]0;owned\\x07\\x1b[31m\\r\\x08" in table
    assert any(u.startswith("\\x1b[2J") for u in report["unexpected_workers"])


def _non_finite_metrics(plan):
    """+Inf counters on the prefill node, NaN on the decode node (and a NaN gauge, which is fine)."""
    prefill = plan.ranks_of("prefill")[0].address

    def handler(req, conn, stop):
        engine = "0" if req.port == 17100 else "1"
        value = "+Inf" if req.address == prefill else "NaN"
        respond(conn, (f'vllm:prefix_cache_queries_total{{engine="{engine}"}} {value}\n'
                       f'vllm:prefix_cache_hits_total{{engine="{engine}"}} 5\n'
                       'vllm:num_requests_running{engine="0"} NaN\n').encode(), ctype="text/plain")

    return handler


def _check_non_finite(plan, report, table):
    reasons = {r["name"]: r["reason"] for r in report["ranks"]}
    for r in plan.ranks:
        want = "+Inf" if r.role == "prefill" else "NaN"
        assert reasons[r.name] == (f'unparseable /metrics: counter vllm:prefix_cache_queries_total{{engine="'
                                   f'{"0" if r.port == 17100 else "1"}"}} is {want}, not a count'), reasons
    assert report["proxy"]["reason"].startswith("/healthcheck: not JSON"), report["proxy"]


def _huge_etcd(plan):
    return _liar(plan, etcd__v3_cluster_member_list=huge("length"), etcd__v3_kv_range=huge("chunked"))


def _check_huge_etcd(plan, report, table):
    assert report["etcd"]["healthy"] and "members: answer of 314572800 bytes (Content-Length) is larger than " \
        "the 1 MiB cap" in report["etcd"]["reason"]


def _name_not_string(plan):
    members = [{"ID": "1", "name": 5, "peerURLs": [], "clientURLs": []}]
    return _liar(plan, etcd__v3_cluster_member_list={"members": members})


SCENARIOS = {
    "trickle-headers": generic(trickle_headers, "no answer within 1s"),
    "trickle-body": generic(trickle_body, "answer not complete within 1s"),
    "trickle-chunked": generic(lambda: trickle_body(chunked=True), "answer not complete within 1s"),
    "hang-after-headers": generic(hang_after_headers, "answer not complete within 1s"),
    "huge-content-length": generic(lambda: huge("length"), "answer of 314572800 bytes (Content-Length) is "
                                   "larger than the 1 MiB cap", "the 4 MiB cap"),
    "huge-chunked": generic(lambda: huge("chunked"), "answer larger than the 1 MiB cap", "the 4 MiB cap"),
    "huge-no-length": generic(lambda: huge("close"), "answer larger than the 1 MiB cap", "the 4 MiB cap"),
    "gzip-bomb": generic(gzip_bomb, "answer is gzip-encoded, identity was asked for"),
    "garbage": generic(garbage, "not an HTTP answer"),
    "etcd-huge-answers": Scenario(
        _huge_etcd, {"etcd": "members: answer of 314572800 bytes", "workers": "answer larger than the 1 MiB cap"},
        only=True, check=_check_huge_etcd),
    "etcd-member-name-not-a-string": Scenario(
        _name_not_string, {"etcd": "members: malformed member list answer from the etcd gateway: member 0 has "
                                   "the name 5, not a string"}, only=True),
    "non-finite-metrics": Scenario(
        lambda plan: _liar(plan, rank__metrics=_non_finite_metrics(plan),
                           proxy__healthcheck=b'{"status": "ok", "prefill_instances": NaN, "decode_instances": 1e999}'),
        {"rank": "unparseable /metrics: counter vllm:prefix_cache_queries_total", "proxy": "not JSON",
         "smoke": "the P/D path is unproven"},
        only=True, check=_check_non_finite),
    "escape-codes": Scenario(
        _escapes_routes, {"rank": "\\x1b", "proxy": "/healthcheck: HTTP 503 down \\x1b[2J", "workers": "\\x1b[5mready",
                          "smoke": "the P/D path is unproven"},
        only=True, check=_check_escapes),
}


# ---------------------------------------------------------------------------------------------
# Running the CLI, measured


@dataclass
class Run:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    wall_s: float
    rss_mb: float


# Peak RSS: on Linux `exec` records the old address space's high-water mark in the child's maxrss, so
# wait4() on a child forked from pytest reports max(pytest's RSS, the CLI's). This launcher (python -S,
# a few MB) forks a fresh child that execs the CLI, waits for it with wait4 and writes its peak RSS
# (KiB) to argv[1]; it exits with the CLI's exit code.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_clis(argvs: list[list[str]], limit: float = 60) -> list[Run]:
    """Start every argv at once (each through LAUNCHER); return each one's exit code, output, wall time
    and peak RSS."""
    started = []
    for argv in argvs:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        rss = tempfile.NamedTemporaryFile(prefix="apd-rss-", delete=False)
        rss.close()
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, rss.name, *argv], stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, cwd=MAIN, env=clean_env(), start_new_session=True)
        started.append((argv, p, out, err, rss.name, t0))
    runs: dict[int, Run] = {}
    try:
        while len(runs) < len(started):
            for i, (argv, p, out, err, rss, t0) in enumerate(started):
                if i in runs or p.poll() is None and time.monotonic() - t0 < limit:
                    continue
                if p.returncode is None:  # over the limit: kill the CLI and its launcher
                    os.killpg(p.pid, 9)
                    p.wait()
                wall = time.monotonic() - t0
                out.seek(0), err.seek(0)
                kib = Path(rss).read_text() or "0"
                runs[i] = Run(argv, p.returncode, out.read().decode("utf-8", "replace"),
                              err.read().decode("utf-8", "replace"), wall, int(kib) / 1024)
            time.sleep(0.005)
    finally:
        for argv, p, out, err, rss, t0 in started:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
            out.close(), err.close()
            os.unlink(rss)
    return [runs[i] for i in range(len(started))]


def status_argv(project: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ascend_pd", "status", "--stack", "test", "--project-dir", str(project),
            "--timeout", f"{TIMEOUT_S:g}", "--smoke-timeout", f"{TIMEOUT_S:g}", *args]


def strict_json(text: str) -> dict:
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def kind(component: str) -> str:
    for prefix, k in (("etcd ", "etcd"), ("openYuanrong workers", "workers"), ("worker ", "workers"),
                      ("proxy ", "proxy"), ("smoke ", "smoke"), ("rank ", "rank")):
        if component.startswith(prefix):
            return k
    raise AssertionError(f"unknown component {component!r}")


MEASURED: list[str] = []


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_misbehaving_endpoints_are_bounded(name, tmp_path):
    sc = SCENARIOS[name]
    n = list(SCENARIOS).index(name)
    values = stack_values(tmp_path, n)
    plan = plan_of(values)
    project = tmp_path / "project"
    write_stack(project, "test", values)
    control_values = stack_values(tmp_path, n + 40)  # the same stack where nothing listens
    write_stack(tmp_path / "control", "test", control_values)
    http, workers, _ = endpoints(plan)
    servers = [Hostile(http, sc.handler(plan)), Hostile(workers, accept_only())]
    # A scenario of etcd answers alone leaves the ranks and the proxy well-behaved: their smoke check
    # would then pass or not by the machine's load (two rounds of /metrics and a completion within
    # 1 s), and the table and JSON runs, which must list the same problems, could disagree.
    quiet = ("--no-smoke",) if sc.only and set(sc.expect) <= {"etcd", "workers"} else ()
    try:
        table_run, json_run, control = run_clis([status_argv(project, *quiet), status_argv(project, "--json", *quiet),
                                                 status_argv(tmp_path / "control", "--json", *quiet)])
    finally:
        for s in servers:
            s.close()
    assert control.code == 1 and strict_json(control.stdout)["problems"], control
    for run in (table_run, json_run):
        mode = "json" if "--json" in run.argv else "table"
        MEASURED.append(f"{name:29} {mode:5}  wall {run.wall_s:5.2f}s (control {control.wall_s:4.2f}s)  "
                        f"peak RSS {run.rss_mb:5.1f} MB")
        assert run.stderr == "", f"{mode}: {run.stderr[-3000:]}"  # no traceback, no progress (not a tty)
        assert run.code == 1, f"{mode}: exit {run.code}\n{run.stdout[-3000:]}"
        limit = control.wall_s * (1 + START_NOISE) + POLL_BOUND_S + SLACK_S
        assert run.wall_s <= limit, f"{mode}: {run.wall_s:.2f}s > {limit:.2f}s (control {control.wall_s:.2f}s)"
        assert run.rss_mb < MAX_RSS_MB, f"{mode}: {run.rss_mb:.0f} MB"
        assert not UNSAFE.search(run.stdout), f"{mode}: {UNSAFE.search(run.stdout)!r} in\n{run.stdout[-3000:]}"
    report = strict_json(json_run.stdout)
    assert report["ok"] is False and report["elapsed_s"] <= POLL_BOUND_S + SLACK_S, report["elapsed_s"]
    problems = [(p["component"], p["reason"]) for p in report["problems"]]
    # The table lists the same problems, one per line.
    table = table_run.stdout
    assert table.split("\nPROBLEMS (")[1].splitlines()[1:] == [f"  {c}: {r}" for c, r in problems], table
    by_kind: dict[str, list[str]] = {}
    for component, reason in problems:
        by_kind.setdefault(kind(component), []).append(reason)
    for k, text in sc.expect.items():
        assert by_kind.get(k), f"no {k} problem in {problems}"
        for reason in by_kind[k]:
            assert text in reason, f"{k}: {reason!r} lacks {text!r}"
    if sc.expect.get("rank"):
        assert len(by_kind["rank"]) == len(plan.ranks), by_kind["rank"]
    if sc.only:
        assert set(by_kind) == set(sc.expect), problems
    if sc.check:
        sc.check(plan, report, table)
    assert not [e for s in servers for e in s.errors], [e for s in servers for e in s.errors]


def test_measured_figures(capsys):
    """Prints the wall time and peak RSS of every run above (pytest -s, or in the summary)."""
    if not MEASURED:
        pytest.skip("run with the scenarios")
    with capsys.disabled():
        print(f"\n[status against misbehaving endpoints, --timeout {TIMEOUT_S:g} --smoke-timeout {TIMEOUT_S:g}: "
              f"limits {1 + START_NOISE:g} x control + {POLL_BOUND_S + SLACK_S:g}s, {MAX_RSS_MB} MB]\n"
              + "\n".join(MEASURED))


# ---------------------------------------------------------------------------------------------
# Malformed etcd gateway answers: a problem line each, never a traceback (in-process)

MALFORMED_ETCD = {
    "member name is a number": ("members", {"members": [{"ID": "1", "name": 5}]}, "has the name 5, not a string"),
    "member name is null": ("members", {"members": [{"ID": "1", "name": None}]}, "has the name null"),
    "member name is a list": ("members", {"members": [{"ID": "1", "name": ["a"]}]}, 'has the name ["a"]'),
    "member is a string": ("members", {"members": ["etcd0"]}, 'member 0 is "etcd0"'),
    "members is an object": ("members", {"members": {"a": 1}}, "malformed member list answer"),
    "no members key": ("members", {"header": {}}, "malformed member list answer from the etcd gateway (KeyError"),
    "member URLs not strings": ("members", {"members": [{"ID": "1", "name": "a", "clientURLs": [1]}]}, "has URLs"),
    "status is a list": ("status", [1, 2], "malformed status answer from the etcd gateway: [1, 2]"),
    "version is a number": ("status", {"version": 3.5, "leader": "1"}, "version 3.5, not a string"),
    "leader is an object": ("status", {"version": "3.5.9", "leader": {"x": 1}}, "leader {"),
    "answer is not JSON": ("status", b"<html>\x1b[2J</html>", "malformed status answer from the etcd gateway"),
    "answer is a JSON string": ("members", b'"members"', "malformed member list answer"),
    "kvs is a number": ("range", {"kvs": 5}, "malformed key range answer from the etcd gateway (TypeError"),
    "kv without a key": ("range", {"kvs": [{"value": b64("1;ready")}]}, "malformed key range answer"),
    "key not base64": ("range", {"kvs": [{"key": "%%%", "value": b64("1;ready")}]}, "malformed key range answer"),
    "key outside the prefix": ("range", {"kvs": [etcd_kv("/elsewhere/x", "1;ready")]}, "is not under /datasystem"),
    "version discovery answer is a list": ("version", [], "malformed"),
}
_PATHS = {"members": "/v3/cluster/member/list", "status": "/v3/maintenance/status", "range": "/v3/kv/range",
          "version": "/version"}


@pytest.mark.parametrize("case", list(MALFORMED_ETCD))
def test_malformed_etcd_answers(case, tmp_path):
    which, answer, text = MALFORMED_ETCD[case]
    plan = plan_of(stack_values(tmp_path, 20))
    http, workers, kinds = endpoints(plan)
    routes = healthy_routes(plan)
    routes[("etcd", _PATHS[which])] = answer
    servers = [Hostile(http, Routes(kinds, routes)), Hostile(workers, accept_only())]
    try:
        rep = collect_status(plan, timeouts=CALM)
    finally:
        for s in servers:
            s.close()
    problems = {p.component: p.reason for p in rep.problems}
    if which == "range":
        reason = problems["openYuanrong workers"]
        assert reason.startswith(f"registrations unknown: etcd {plan.etcd.endpoint} unreadable ("), reason
    else:
        reason = problems[f"etcd {plan.etcd.endpoint}"]
        if which != "version":
            assert reason.startswith("members: "), reason
    assert text in reason, (reason, text)
    assert list(problems) == [f"etcd {plan.etcd.endpoint}"] + (["openYuanrong workers"] if which == "version" else []) \
        or list(problems) == ["openYuanrong workers"], problems
    # The report renders both ways.
    assert not UNSAFE.search(status_report._for_terminal(format_table(plan, rep)))
    strict_json(status_report._to_json(rep))


def test_the_smoke_reads_each_rank_once_before_its_completion(tmp_path):
    """The smoke's "before" is the rank checks' own /metrics reads: each rank is read twice per poll
    (its check, the smoke's "after"), not three times, and a first read slower than the smoke's old
    quarter of its deadline (2.5 s of 10), yet within --timeout and half the smoke's, proves the P/D path."""
    plan = plan_of(stack_values(tmp_path, 100))
    http, workers, kinds = endpoints(plan)
    routes = healthy_routes(plan)
    healthy_metrics, healthy_completion = routes[("rank", "/metrics")], routes[("proxy", "/v1/chat/completions")]
    reads, lock, answered = {}, threading.Lock(), threading.Event()
    slow_s = 3.5  # the old code gave the "before" 2.5 s; now min(request_s 8, smoke_s 10 / 2) = 5 s

    def metrics(req, conn, stop):  # every read before the completion is slow
        with lock:
            key = (req.address, req.port)
            reads[key] = reads.get(key, 0) + 1
        if not answered.is_set() and stop.wait(slow_s):
            return
        healthy_metrics(req, conn, stop)

    def completion(req, conn, stop):
        healthy_completion(req, conn, stop)
        answered.set()

    routes[("rank", "/metrics")], routes[("proxy", "/v1/chat/completions")] = metrics, completion
    servers = [Hostile(http, Routes(kinds, routes)), Hostile(workers, accept_only())]
    try:
        rep = collect_status(plan, timeouts=Timeouts(connect_s=5, request_s=8, smoke_s=10))
    finally:
        for s in servers:
            s.close()
    assert rep.ok and rep.smoke.ok, rep.problems
    assert rep.elapsed_s >= slow_s
    assert reads == {(r.address, r.port): 2 for r in plan.ranks}, reads


# ---------------------------------------------------------------------------------------------
# The transport, one behaviour at a time (in-process)


@pytest.fixture
def one_endpoint():
    servers = []

    def serve(handler, address: str = "127.0.3.99", port: int = 18999) -> str:
        servers.append(Hostile([(address, port)], handler))
        return f"http://{address}:{port}/x"

    yield serve
    for s in servers:
        s.close()


def test_deadline_covers_the_whole_request(one_endpoint):
    """A byte every 50 ms never trips a per-read timeout; the request still ends at its deadline."""
    cases = ((trickle_headers(0.05), "Read timed out"), (trickle_body(0.05), "not complete within 0.5s"),
             (trickle_body(0.05, chunked=True), "not complete within 0.5s"))
    for i, (handler, text) in enumerate(cases):
        url = one_endpoint(handler, port=18900 + i)
        t0 = time.monotonic()
        with pytest.raises(Exception) as exc:
            status_read._http("GET", url, FAST, 0.5)
        took = time.monotonic() - t0
        assert 0.45 <= took < 0.5 + SLACK_S, took
        assert text in str(exc.value), exc.value


def test_size_cap_boundaries(one_endpoint):
    cap = 1000
    def exact(n):
        return lambda req, conn, stop: respond(conn, b"x" * n, ctype="text/plain")
    assert status_read._http("GET", one_endpoint(exact(cap), port=18910), CALM, 10, max_bytes=cap) == (200, b"x" * cap)
    with pytest.raises(status_read._Failure, match=r"answer of 1001 bytes \(Content-Length\) is larger than"):
        status_read._http("GET", one_endpoint(exact(cap + 1), port=18911), CALM, 10, max_bytes=cap)
    with pytest.raises(status_read._Failure, match="answer larger than the"):
        status_read._http("GET", one_endpoint(huge("close", total=cap + 1), port=18912), CALM, 10, max_bytes=cap)
    for i, length in enumerate(("9" * 40, "0" * 30 + "5000")):  # absurd and zero-padded Content-Length
        url = one_endpoint(lambda req, conn, stop, length=length: conn.sendall(head(extra=[f"Content-Length: {length}"])),
                           port=18913 + i)
        with pytest.raises(status_read._Failure, match=r"answer of (9{21}\.\.\.|5000) bytes \(Content-Length\) is larger than the 1000-byte cap"):
            status_read._http("GET", url, CALM, 10, max_bytes=cap)


def test_no_redirects_no_other_schemes_no_header_floods(one_endpoint):
    def redirect(req, conn, stop):
        conn.sendall(head("302 Found", length=0, extra=["Location: https://203.0.113.1/elsewhere"]))
    assert status_read._http("GET", one_endpoint(redirect, port=18920), CALM, 10)[0] == 302
    with pytest.raises(status_read._Failure, match="not an http:// URL"):
        status_read._http("GET", "https://127.0.3.99:18921/", CALM, 10)

    def headers_flood(req, conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n")
    with pytest.raises(Exception) as exc:
        status_read._http("GET", one_endpoint(headers_flood, port=18922), CALM, 10)
    assert status_read._why(exc.value, CALM).startswith("not an HTTP answer: "), status_read._why(exc.value, CALM)

    def cut(req, conn, stop):
        conn.sendall(head(length=500) + b"x" * 100)
    with pytest.raises(status_read._Failure, match="answer cut off: "):
        status_read._http("GET", one_endpoint(cut, port=18923), CALM, 10)


def test_non_finite_and_impossible_counters():
    good = parse_prometheus('a_total{x="1"} 3\nb_total 0\ng NaN\nh +Inf\n')
    status_metrics._check_counters(good)  # gauges may be NaN or +Inf
    for value, shown in (("+Inf", "+Inf"), ("NaN", "NaN"), ("-Inf", "-Inf"), ("-1", "-1.0"), ("1e300", "1e+300")):
        with pytest.raises(MetricsParseError, match=re.escape(f'counter vllm:x_total{{engine="0"}} is {shown}, not a count')):
            status_metrics._check_counters(parse_prometheus(f'vllm:x_total{{engine="0"}} {value}\n'))


def test_parse_has_a_deadline():
    text = "vllm:x_total 1\n" * 5000
    with pytest.raises(TimeoutError):
        parse_prometheus(text, deadline=time.monotonic() - 1)
    assert parse_prometheus(text, deadline=time.monotonic() + 60)["vllm:x_total"] == {(): 1.0}


def test_printable():
    assert status_text._printable("plain ascii, ünïcödé, 中文") == "plain ascii, ünïcödé, 中文"
    assert status_text._printable("a\x1b[2Jb\rc\x08\x7f\x9b\u202e\u2028\n") == "a\\x1b[2Jb\\rc\\x08\\x7f\\x9b\\u202e\\u2028\\n"
    assert status_report._for_terminal("line\x1b[31m\nnext\t") == "line\\x1b[31m\nnext\\t"
    assert status_text._short("x\x1b" * 100, 20) == ("x\\x1b" * 4)[:17] + "..."


# ---------------------------------------------------------------------------------------------
# Numeric options: a usage error naming the option, never a traceback or an endless wait

BAD_OPTIONS = [
    ("--timeout", "inf"), ("--timeout", "nan"), ("--timeout", "-1"), ("--timeout", "0"), ("--timeout", "1e999"),
    ("--timeout", "abc"), ("--timeout", "3601"), ("--timeout", "0.01"),
    ("--smoke-timeout", "inf"), ("--smoke-timeout", "NaN"), ("--smoke-timeout", "-5"), ("--smoke-timeout", "0"),
    ("--watch", "inf"), ("--watch", "nan"), ("--watch", "-1"), ("--watch", "0"), ("--watch", "1e10"),
    ("--count", "0"), ("--count", "-3"), ("--count", "1.5"), ("--count", "many"),
]


@pytest.mark.parametrize("option,value", BAD_OPTIONS)
def test_bad_numeric_options_are_usage_errors(option, value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["status", "--stack", "a2-8node", option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {option}: {value!r}" in err, err
    assert "Traceback" not in err


def test_good_numeric_options_and_help(capsys):
    parse = cli_main._seconds(cli_main.MIN_SECONDS, cli_main.MAX_TIMEOUT_S)
    assert parse("0.1") == 0.1 and parse(" 5 ") == 5.0 and parse("3600") == 3600.0
    assert cli_main._positive_int("3") == 3
    assert cli_main.MAX_TIMEOUT_S == status.MAX_TIMEOUT_S
    with pytest.raises(SystemExit):
        cli_main.main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "max(--timeout, --smoke-timeout)" in text and "plus its own start" in text and "4 MiB" in text


@pytest.mark.parametrize("bad", [math.inf, math.nan, 0, -1, 3601, "5"])
def test_timeouts_refuse_nonsense(bad):
    with pytest.raises(ValueError, match="Timeouts.request_s must be a number of seconds"):
        Timeouts(request_s=bad)
