"""`ascend-pd exporter` (ascend_pd/exporter.py) against a real etcd (Debian), fake vLLM ranks that speak the
P/D protocol and the release's PD proxy on 127.0.2.101-103; the rollout keys are written by the launches'
own bash library (shell/rollout_lib.sh), the worker registrations straight into etcd as workers write them.
Unreachable and blackholed stacks on 127.0.2.104-107. The scraped text is checked with Prometheus' own
parser (`promtool check metrics`) and status' one."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import etcd3gw
import pytest
import requests

import ascend_pd.exporter as exporter_mod
from ascend_pd.exporter import Exporter, Family, exposition, parse_listen, scrape_timeouts, serve
from ascend_pd.monitoring import Monitoring
from ascend_pd.plan import ROLLOUT_FAILED, rollout_prefix
from ascend_pd.shell import library, params
from ascend_pd.status import WORKER_PREFIX, Timeouts, collect_status, parse_prometheus
from status_support import (
    Blackhole, Procs, Silent, clean_env, have_etcd, plan_of, small_stack, start_etcd, start_proxy, start_ranks,
    wait_until, write_stack,
)

MAIN = Path(__file__).resolve().parents[1]
PROMTOOL = "/usr/bin/promtool"
# This file's own loopback addresses and ports (no other test file uses 127.0.2.101-107 or these ports).
ADDRS = {"n0": "127.0.2.101", "n1": "127.0.2.102", "n2": "127.0.2.103"}  # n2 runs only a worker
PORTS = dict(etcd_port=12979, worker_port=18981, port_base=17400, proxy_port=18420)
DEAD = {"n0": "127.0.2.104", "n1": "127.0.2.105"}  # nothing listens here, but a test's blackhole
CLI_ADDRS = {"n0": "127.0.2.106", "n1": "127.0.2.107"}
CLI_LISTEN = "127.0.2.106:19478"
# Scrape bounds on a machine loaded by the rest of the suite (the bound itself is tested with QUICK).
SCRAPE = Timeouts(connect_s=2.0, request_s=5.0, smoke_s=5.0)
QUICK = Timeouts(connect_s=0.5, request_s=1.0, smoke_s=1.0)
# The smoke reads every rank's /metrics twice around its completion (as in test_status: room under load).
SMOKE = Timeouts(connect_s=2.0, request_s=5.0, smoke_s=30.0)
SLOT_TTL_S = 600


def stack(tmp: Path, addrs: dict = ADDRS, **kw) -> dict:
    return small_stack(tmp, addrs, prefill=["n0"], decode=["n1"], etcd_node="n0", proxy_node="n0", **{**PORTS, **kw})


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def scrape(url: str, timeout: float = 30) -> tuple[str, dict]:
    """The /metrics text and status' parse of it (name -> {sorted label pairs -> value})."""
    with session() as s:
        r = s.get(f"{url}/metrics", timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return r.text, parse_prometheus(r.text)


def series(samples: dict, name: str) -> dict:
    """{frozenset of labels but stack: value} of one family (every series must carry stack="test")."""
    out = {}
    for labels, value in samples.get(name, {}).items():
        d = dict(labels)
        assert d.pop("stack") == "test", labels
        out[frozenset(d.items())] = value
    return out


def one(samples: dict, name: str, **labels: str):
    """The value of the series with exactly these labels (and stack), None when absent."""
    return series(samples, name).get(frozenset(labels.items()))


@contextmanager
def exporting(plan, **kw):
    """An exporter of `plan` served on 127.0.2.101:<free port>; its smoke thread is started by the test."""
    exp = Exporter(plan, **{"timeouts": SCRAPE, "smoke_timeouts": SMOKE, **kw})
    server, thread = serve(exp, ADDRS["n0"], 0)
    try:
        yield exp, f"http://{ADDRS['n0']}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        exp.stop(5)


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------------------------
# The text format and the options (no processes)


def test_exposition_escapes_label_values_and_parses_back():
    f = Family("ascend_pd_rollout_failed", "gauge", "A help text with a \\ backslash\nand a newline.")
    nasty = 'pre"fill\\0\nx'
    f.add(1, stack="test", role="prefill", instance=nasty)
    g = Family("ascend_pd_smoke_total", "counter", "Counted.")
    g.add(3, stack="test", result="ok")
    g.add(0.5, stack="test", result="failed")
    empty = Family("ascend_pd_smoke_success", "gauge", "No sample yet.")
    text = exposition([f, empty, g])
    assert text.splitlines() == [
        "# HELP ascend_pd_rollout_failed A help text with a \\\\ backslash\\nand a newline.",
        "# TYPE ascend_pd_rollout_failed gauge",
        'ascend_pd_rollout_failed{instance="pre\\"fill\\\\0\\nx",role="prefill",stack="test"} 1.0',
        "# HELP ascend_pd_smoke_success No sample yet.",
        "# TYPE ascend_pd_smoke_success gauge",
        "# HELP ascend_pd_smoke_total Counted.",
        "# TYPE ascend_pd_smoke_total counter",
        'ascend_pd_smoke_total{result="ok",stack="test"} 3.0',
        'ascend_pd_smoke_total{result="failed",stack="test"} 0.5',
    ]
    parsed = parse_prometheus(text)
    assert parsed["ascend_pd_rollout_failed"] == {
        (("instance", nasty), ("role", "prefill"), ("stack", "test")): 1.0}
    if Path(PROMTOOL).exists():
        done = promtool_check(text)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("text, want", [
    ("127.0.0.1:9478", ("127.0.0.1", 9478)), ("mon-1.example:9478", ("mon-1.example", 9478)),
    ("0.0.0.0:0", ("0.0.0.0", 0)), ("h:65535", ("h", 65535)),
])
def test_listen_values(text, want):
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["bad", ":9478", "127.0.0.1", "127.0.0.1:", "h:65536", "h:-1", "h:9478x",
                                  "a b:1", "h:+80", "h:٣"])
def test_bad_listen_values(text):
    with pytest.raises(ValueError, match="HOST:PORT|port must be a number"):
        parse_listen(text)


def test_scrape_bounds_follow_the_scrape_interval():
    """Prometheus' scrape timeout is monitoring.scrapeIntervalS (render sets it so): a collection ends well
    within it, and never later than status' own request deadline."""
    assert scrape_timeouts(Monitoring()) == Timeouts(connect_s=2.0, request_s=4.0, smoke_s=4.0)
    assert scrape_timeouts(Monitoring(scrapeIntervalS=1)) == Timeouts(connect_s=0.8, request_s=0.8, smoke_s=0.8)
    assert scrape_timeouts(Monitoring(scrapeIntervalS=15, rateWindowS=60)).request_s == 5.0


# ---------------------------------------------------------------------------------------------
# Bounds, concurrency and failures (nothing listens on 127.0.2.104/105, or a blackhole does)


def test_blackholed_etcd_and_hung_proxy_are_zero_within_the_bound(tmp_path):
    """etcd's port takes no connection, the proxy accepts and never answers: the scrape still answers
    200 within the request bound, with etcd unreadable (and no worker series: unknown is not 0) and the
    proxy down."""
    plan = plan_of(stack(tmp_path, DEAD), "test")
    holes = [Blackhole(DEAD["n0"], plan.etcd.client_port), Silent(DEAD["n0"], plan.proxy.port)]
    try:
        with exporting(plan, timeouts=QUICK) as (exp, url):
            t0 = time.monotonic()
            text, samples = scrape(url)
            took = time.monotonic() - t0
    finally:
        for h in holes:
            h.close()
    assert took < QUICK.request_s + 2.5, took
    assert one(samples, "ascend_pd_etcd_readable") == 0
    assert one(samples, "ascend_pd_proxy_up") == 0
    assert "ascend_pd_worker_registered" not in samples and "ascend_pd_workers_unplanned" not in samples
    assert "ascend_pd_rollout_slot_held_seconds" not in samples and "ascend_pd_proxy_instances" not in samples
    assert series(samples, "ascend_pd_proxy_instances_planned") == {
        frozenset({("role", "prefill")}): 2, frozenset({("role", "decode")}): 2}
    # The silent proxy held the collection until its deadline: the bound was really reached, not skipped.
    assert QUICK.request_s * 0.9 <= one(samples, "ascend_pd_exporter_collect_seconds") < QUICK.request_s + 2
    assert "ascend_pd_smoke_success" not in samples  # no smoke has run: absent, not 0
    assert series(samples, "ascend_pd_smoke_total") == {
        frozenset({("result", "ok")}): 0, frozenset({("result", "failed")}): 0}


def test_concurrent_scrapes_share_one_collection(tmp_path, monkeypatch):
    """Eight scrapes at once while a collection takes 0.6 s: they wait for that one and are answered
    from it, instead of eight collections piling up."""
    plan = plan_of(stack(tmp_path, DEAD), "test")
    calls = []

    def slow_proxy(plan, t):
        calls.append(time.monotonic())
        time.sleep(0.6)
        return {"status": "ok", "prefill_instances": 2, "decode_instances": 1}

    monkeypatch.setattr(exporter_mod, "_check_proxy", slow_proxy)
    with exporting(plan, timeouts=QUICK) as (exp, url):
        start = threading.Barrier(8)
        answers: list = []

        def scraper():
            start.wait(10)
            answers.append(scrape(url)[1])

        threads = [threading.Thread(target=scraper) for _ in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        took = time.monotonic() - t0
    assert len(answers) == 8
    assert exp.collections <= 2 and len(calls) == exp.collections, (exp.collections, calls)
    assert took < 8 * 0.6, took
    for samples in answers:
        assert one(samples, "ascend_pd_proxy_up") == 1
        assert series(samples, "ascend_pd_proxy_instances") == {
            frozenset({("role", "prefill")}): 2, frozenset({("role", "decode")}): 1}


def test_promtool_accepts_what_the_exporter_serves(tmp_path):
    """Prometheus' own linter (`promtool check metrics`: names, units, HELP, counters' `_total`) on a real
    scrape of the exporter, with every family's samples present (a smoke has run: a failed one, as
    nothing listens). Skips without promtool; fails instead under CI=true, where it must have run."""
    if not Path(PROMTOOL).exists():
        why = f"needs {PROMTOOL} (Debian's prometheus package; setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    plan = plan_of(stack(tmp_path, DEAD), "test")
    with exporting(plan, timeouts=QUICK) as (exp, url):
        assert exp.smoke_once().ok is False
        text, samples = scrape(url)
    assert one(samples, "ascend_pd_smoke_total", result="failed") == 1 and one(samples, "ascend_pd_smoke_success") == 0
    done = promtool_check(text)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done
    # The linter is not blind: a counter without `_total` is reported.
    bad = promtool_check(text.replace("ascend_pd_smoke_total", "ascend_pd_smoke"))
    assert bad.returncode != 0 and "counter metrics should have \"_total\" suffix" in bad.stdout + bad.stderr, bad


def test_openmetrics_when_the_scraper_asks_for_it(tmp_path):
    """Prometheus asks for OpenMetrics first (its Accept header): it gets it, with the same series as the
    text format (the counter's family is `ascend_pd_smoke`, its series still `ascend_pd_smoke_total`, no
    `_created`), and `# EOF` at the end; HEAD answers no body; / is the hint and elsewhere 404."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    plan = plan_of(stack(tmp_path, DEAD), "test")
    accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
    with exporting(plan, timeouts=QUICK) as (exp, url), session() as s:
        exp.smoke_once()
        r = s.get(f"{url}/metrics", headers={"Accept": accept}, timeout=30)
        text, samples = scrape(url)
        head = s.head(f"{url}/metrics", timeout=30)
        hint, missing = s.get(f"{url}/", timeout=30), s.get(f"{url}/metricsx", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n") and "# TYPE ascend_pd_smoke counter" in r.text.splitlines()
    families = list(text_string_to_metric_families(r.text))
    om = {(x.name, tuple(sorted(x.labels.items()))): x.value for f in families for x in f.samples}
    assert not any(name.endswith("_created") for name, _ in om)
    # The same series and values as the text format (the collection is cached for CACHE_S, the smoke ran once).
    text_series = {(name, labels): v for name, ss in samples.items() for labels, v in ss.items()
                   if name != "ascend_pd_exporter_collect_seconds"}
    assert {k: v for k, v in om.items() if k[0] != "ascend_pd_exporter_collect_seconds"} == text_series
    assert (head.status_code, head.content) == (200, b"")
    assert (hint.status_code, missing.status_code) == (200, 404)


def test_a_check_that_raises_is_absent_not_a_500(tmp_path, monkeypatch):
    """A check failing in a way status never anticipated (here a bug in it) is that check's 0: the
    scrape answers 200 with everything else."""
    plan = plan_of(stack(tmp_path, DEAD), "test")

    def broken(plan, t):
        raise RuntimeError("bug\nin a check")

    monkeypatch.setattr(exporter_mod, "_check_registrations", broken)
    logged: list[str] = []
    with exporting(plan, timeouts=QUICK, log=logged.append) as (exp, url):
        _, samples = scrape(url)
    assert one(samples, "ascend_pd_etcd_readable") == 0 and "ascend_pd_worker_registered" not in samples
    assert one(samples, "ascend_pd_proxy_up") == 0
    assert logged and logged[0].startswith(
        "ascend-pd exporter: etcd: worker registrations: unreadable: RuntimeError: bug in a check"), logged


def test_the_smoke_never_runs_twice_at_once(tmp_path, monkeypatch):
    """The background thread (every 0.05 s) and four callers of smoke_once: never two smokes at a time,
    and every run counted."""
    plan = plan_of(stack(tmp_path, DEAD), "test")
    running, most, runs = [0], [0], []
    lock = threading.Lock()

    def fake_smoke(plan, t):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
            runs.append(1)
        if len(runs) % 2:
            return 0.05, "hi", "prefill x and decode y"
        raise RuntimeError("odd one out")

    monkeypatch.setattr(exporter_mod, "_smoke", fake_smoke)
    with exporting(plan, timeouts=QUICK, smoke_interval_s=0.05) as (exp, url):
        exp.start()
        callers = [threading.Thread(target=lambda: [exp.smoke_once() for _ in range(3)]) for _ in range(4)]
        for c in callers:
            c.start()
        for c in callers:
            c.join(60)
        _, samples = scrape(url)
    assert most[0] == 1, most
    assert len(runs) >= 12
    total = series(samples, "ascend_pd_smoke_total")
    assert total[frozenset({("result", "ok")})] + total[frozenset({("result", "failed")})] >= 12
    assert total[frozenset({("result", "failed")})] >= 1  # a raising smoke is a failed one, not the thread's end


# ---------------------------------------------------------------------------------------------
# A live stack: etcd, 2 prefill + 2 decode fake ranks, the release proxy


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    if not have_etcd():
        pytest.skip("needs Debian etcd")
    tmp = tmp_path_factory.mktemp("exporter")
    plan = plan_of(stack(tmp), "test")
    procs = Procs(tmp / "logs")
    try:
        start_etcd(plan, procs)
        start_ranks(plan, procs)
        start_proxy(plan, procs)
        yield plan, procs
    finally:
        procs.stop_all()


def etcd(plan) -> etcd3gw.Etcd3Client:
    c = etcd3gw.client(host=plan.etcd.address, port=plan.etcd.client_port, timeout=10)
    c.session.trust_env = False
    return c


def rollout_shell(plan, role: str, instance: str, calls: str) -> tuple[int, str]:
    """Functions of the launches' rollout library, with the parameters the launch scripts give it."""
    prefix = rollout_prefix(plan.stack, role)
    text = params(etcd_url=plan.etcd.client_url, instance=instance, slot_prefix=prefix,
                  failed_key=prefix + ROLLOUT_FAILED, slots=1, slot_ttl_s=SLOT_TTL_S, slot_timeout_s=4) \
        + 'slot_key=""\n' + library("rollout_lib") + calls
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + text], capture_output=True, text=True, timeout=60,
                          env=clean_env())
    return done.returncode, done.stdout + done.stderr


@pytest.mark.integration
def test_worker_registrations(live):
    """Two planned workers registered (as workers register: leased `/datasystem/cluster/<host:port>` =
    `<time>;<state>`), the third not, one registration the plan does not have."""
    plan, procs = live
    c = etcd(plan)
    lease = c.lease(SLOT_TTL_S)
    w0, w1, w2 = plan.workers
    unplanned = "127.0.2.109:18981"
    keys = [WORKER_PREFIX + w0.address, WORKER_PREFIX + w1.address, WORKER_PREFIX + unplanned]
    c.put(keys[0], "1764460000;ready", lease=lease)
    c.put(keys[1], "1764460000;recovering", lease=lease)  # registered, whatever its state
    c.put(keys[2], "1764460000;ready", lease=lease)
    try:
        with exporting(plan) as (exp, url):
            _, samples = scrape(url)
            assert one(samples, "ascend_pd_etcd_readable") == 1
            assert series(samples, "ascend_pd_worker_registered") == {
                frozenset({("node", w0.node), ("address", w0.address)}): 1,
                frozenset({("node", w1.node), ("address", w1.address)}): 1,
                frozenset({("node", w2.node), ("address", w2.address)}): 0,
            }
            assert one(samples, "ascend_pd_workers_unplanned") == 1
            # status judges the same registrations the same way (one judgement: status.judge).
            rep = collect_status(plan, smoke=False)
            assert {w.address: w.registered for w in rep.workers} == {w0.address: True, w1.address: True,
                                                                      w2.address: False}
            assert rep.unexpected_workers == [unplanned]
            # Deregistered: the next collection (after the 1 s cache) says so.
            c.delete(keys[0])
            c.delete(keys[2])
            wait_until(lambda: one(scrape(url)[1], "ascend_pd_worker_registered", node=w0.node,
                                   address=w0.address) == 0, 10, "w0 unregistered", interval=0.3)
            assert one(scrape(url)[1], "ascend_pd_workers_unplanned") == 0
    finally:
        lease.revoke()


@pytest.mark.integration
def test_rollout_slot_age_comes_from_the_lease(live):
    """A restart slot taken by the launches' own slot_acquire (leased for 600 s): its age grows with the
    time it is held, an exporter started later reports the same age (it is the lease's, not the
    exporter's), and a failure mark is rollout_failed 1. A slot whose value is hostile is escaped."""
    plan, procs = live
    t0 = time.monotonic()
    taken = rollout_shell(plan, "prefill", "prefill-0", "slot_acquire restart\n")
    assert taken == (0, "prefill-0: restart slot 1 of 1\n"), taken
    c = etcd(plan)
    lease = c.lease(SLOT_TTL_S)
    hostile = 'decode-"7"\\x\n'
    c.put(rollout_prefix(plan.stack, "decode") + "0", hostile, lease=lease)
    try:
        with exporting(plan) as (exp, url):
            def held_now():
                age = one(scrape(url)[1], "ascend_pd_rollout_slot_held_seconds", role="prefill", instance="prefill-0")
                return age if age is not None and age >= 2 else None

            held = wait_until(held_now, 20, "a slot held 2 s", interval=0.25)
            elapsed = time.monotonic() - t0
            # etcd counts the TTL left in whole seconds: the age is at most a second more than the real one.
            assert 2 <= held <= min(elapsed + 1, 10), (held, elapsed)
            _, samples = scrape(url)
            assert one(samples, "ascend_pd_rollout_failed", role="prefill", instance="prefill-0") is None
            decode = series(samples, "ascend_pd_rollout_slot_held_seconds")
            # status escapes control characters for display (\n -> the two characters \ n); the text
            # format escapes quotes and backslashes, and status' parser reads it back.
            assert frozenset({("role", "decode"), ("instance", 'decode-"7"\\x\\n')}) in decode, decode
        time.sleep(1.1)
        with exporting(plan) as (exp, url):  # a restarted exporter: the age goes on, from the lease
            again = one(scrape(url)[1], "ascend_pd_rollout_slot_held_seconds", role="prefill", instance="prefill-0")
            assert again >= held + 1 and again <= time.monotonic() - t0 + 1, (held, again)

            assert rollout_shell(plan, "prefill", "prefill-0", "rollout_failed_mark\n")[0] == 0
            marked = wait_until(lambda: one(scrape(url)[1], "ascend_pd_rollout_failed", role="prefill",
                                            instance="prefill-0"), 10, "the failure mark", interval=0.3)
            assert marked == 1
            text, samples = scrape(url)
            assert series(samples, "ascend_pd_rollout_failed") == {
                frozenset({("role", "prefill"), ("instance", "prefill-0")}): 1}  # a mark is no slot
            assert {k for k in series(samples, "ascend_pd_rollout_slot_held_seconds")} == {
                frozenset({("role", "prefill"), ("instance", "prefill-0")}),
                frozenset({("role", "decode"), ("instance", 'decode-"7"\\x\\n')})}
            if Path(PROMTOOL).exists():
                done = promtool_check(text)
                assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done
    finally:
        lease.revoke()
        code, out = rollout_shell(plan, "prefill", "prefill-0", "slot_held\nrollout_served\nslot_release\n")
        assert code == 0, out
    _, samples = scrape_once(plan)
    assert "ascend_pd_rollout_slot_held_seconds" not in samples and "ascend_pd_rollout_failed" not in samples


def scrape_once(plan) -> tuple[str, dict]:
    with exporting(plan) as (exp, url):
        return scrape(url)


@pytest.mark.integration
def test_proxy_instances(live):
    """The proxy's own counts next to the plan's: equal while it routes to every instance, one short
    after a prefill instance is taken out through its /instances/remove (as a rollout does)."""
    plan, procs = live
    _, samples = scrape_once(plan)
    assert one(samples, "ascend_pd_proxy_up") == 1
    both = {frozenset({("role", "prefill")}): 2, frozenset({("role", "decode")}): 2}
    assert series(samples, "ascend_pd_proxy_instances") == both
    assert series(samples, "ascend_pd_proxy_instances_planned") == both
    host, port = plan.proxy.prefillers[0]
    body = {"type": "prefill", "instances": [f"{host}:{port}"]}
    with session() as s:
        s.post(f"{plan.proxy.url}/instances/remove", json=body, timeout=10).raise_for_status()
        try:
            _, samples = scrape_once(plan)
            assert one(samples, "ascend_pd_proxy_instances", role="prefill") == 1
            assert one(samples, "ascend_pd_proxy_instances_planned", role="prefill") == 2
        finally:
            s.post(f"{plan.proxy.url}/instances/add", json=body, timeout=10).raise_for_status()
    wait_until(lambda: one(scrape_once(plan)[1], "ascend_pd_proxy_instances", role="prefill") == 2, 30,
               "the prefill instance back in the proxy", interval=0.5)


def fault(plan, role: str, name) -> None:
    with session() as s:
        for r in plan.ranks_of(role):
            r_ = s.post(f"http://{r.address}:{r.port}/fake/fault", json={"fault": name}, timeout=10)
            assert r_.json() == {"fault": name}


@pytest.mark.integration
def test_smoke_in_the_background_then_a_decode_fault(live):
    """The smoke runs on its own every smoke_interval_s (not per scrape): success 1 with a latency, then
    with every decode rank failing its KV loads (the proxy answers an empty 200) the next smoke is
    success 0 and counted failed, the last good latency kept; healthy again, success 1 again."""
    plan, procs = live
    # An hour apart: one smoke at start, and scrapes do not run more.
    with exporting(plan, smoke_interval_s=3600) as (exp, url):
        before = time.time()
        exp.start()
        wait_until(lambda: exp.smoke.runs == 1, SMOKE.smoke_s + 10, "the first smoke", interval=0.2)
        for _ in range(5):
            _, samples = scrape(url)
        assert one(samples, "ascend_pd_smoke_success") == 1, exp.smoke
        assert one(samples, "ascend_pd_smoke_total", result="ok") == 1
        assert one(samples, "ascend_pd_smoke_total", result="failed") == 0
        assert 0 < one(samples, "ascend_pd_smoke_latency_seconds") < SMOKE.smoke_s
        assert before <= one(samples, "ascend_pd_smoke_last_run_timestamp_seconds") <= time.time()
        assert re.fullmatch(r"prefill http://127\.0\.2\.101:\d+ and decode http://127\.0\.2\.102:\d+",
                            exp.smoke.served_by), exp.smoke.served_by

    with exporting(plan, smoke_interval_s=1.0) as (exp, url):
        exp.start()
        wait_until(lambda: exp.smoke.totals["ok"] >= 2, 2 * SMOKE.smoke_s, "two smokes in the background",
                   interval=0.2)
        _, samples = scrape(url)
        good = one(samples, "ascend_pd_smoke_latency_seconds")
        assert one(samples, "ascend_pd_smoke_success") == 1 and good > 0
        fault(plan, "decode", "transfer-fail")
        try:
            failed_before = one(samples, "ascend_pd_smoke_total", result="failed")
            assert failed_before == 0
            wait_until(lambda: (one(scrape(url)[1], "ascend_pd_smoke_total", result="failed") or 0) > failed_before,
                       2 * SMOKE.smoke_s, "a failed smoke", interval=0.3)
            _, samples = scrape(url)
            assert one(samples, "ascend_pd_smoke_success") == 0
            assert one(samples, "ascend_pd_smoke_latency_seconds") == pytest.approx(good, abs=1e-6)
            assert "the decode side failed" in exp.smoke.reason, exp.smoke.reason
        finally:
            fault(plan, "decode", None)
        wait_until(lambda: one(scrape(url)[1], "ascend_pd_smoke_success") == 1, 2 * SMOKE.smoke_s,
                   "a good smoke again", interval=0.3)


@pytest.mark.integration
def test_proxy_and_etcd_stopped(live):
    """Runs last on the live stack (it stops etcd and the proxy): etcd unreadable is etcd_readable 0 and
    no worker or rollout series at all; a dead proxy is proxy_up 0 and no reported counts; the smoke fails."""
    plan, procs = live
    c = etcd(plan)
    lease = c.lease(SLOT_TTL_S)
    c.put(WORKER_PREFIX + plan.workers[0].address, "1764460000;ready", lease=lease)
    with exporting(plan) as (exp, url):
        _, samples = scrape(url)
        assert one(samples, "ascend_pd_etcd_readable") == 1 and "ascend_pd_worker_registered" in samples
        procs.stop("proxy")
        procs.stop("etcd")
        time.sleep(exp.cache_s)
        t0 = time.monotonic()
        text, samples = scrape(url)
        assert time.monotonic() - t0 < SCRAPE.request_s  # refused at once, nothing waits for a deadline
        exp.smoke_once()
        _, after = scrape(url)
    assert one(samples, "ascend_pd_etcd_readable") == 0
    for name in ("ascend_pd_worker_registered", "ascend_pd_workers_unplanned", "ascend_pd_rollout_slot_held_seconds",
                 "ascend_pd_rollout_failed", "ascend_pd_proxy_instances"):
        assert name not in samples, name
        assert f"# TYPE {name} gauge" in text  # the family is still described
    assert one(samples, "ascend_pd_proxy_up") == 0
    assert one(after, "ascend_pd_smoke_success") == 0 and one(after, "ascend_pd_smoke_total", result="failed") == 1
    assert exp.smoke.reason == "connection refused (nothing listening)", exp.smoke.reason


# ---------------------------------------------------------------------------------------------
# The command line


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ascend_pd", "exporter", *args], cwd=MAIN, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("value", ["bad", "127.0.0.1:99999"])
def test_bad_listen_is_one_line_exit_2(value):
    done = cli("--listen", value)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"python -m ascend_pd exporter: --listen '{value}'"), done.stderr


def _sigint_default() -> None:
    """SIGINT as a terminal's foreground job has it (tests/run's bash ignores it, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(project: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """The exporter command, until its startup line (which it returns)."""
    proc = subprocess.Popen([sys.executable, "-m", "ascend_pd", "exporter", "--stack", "ex", "--project-dir",
                             str(project), *args], cwd=MAIN, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_sigint_default)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"no startup line: {proc.communicate(timeout=10)}")
    return proc, line


def test_cli_serves_where_the_stack_says_and_stops_on_sigterm(tmp_path):
    """Without --listen: monitoring.exporter's address. One startup line; /metrics, / and a 404; a second
    one on the same address is one line and exit 2; SIGTERM: exit 0, no traceback; Ctrl-C: 130."""
    values = stack(tmp_path, CLI_ADDRS)
    values["monitoring"] = {"exporter": CLI_LISTEN, "smokeIntervalS": 5}
    write_stack(tmp_path / "project", "ex", values)
    proc, line = start_cli(tmp_path / "project")
    try:
        assert line == (f"ascend-pd exporter: stack ex, http://{CLI_LISTEN}/metrics; scrapes read etcd "
                        f"{CLI_ADDRS['n0']}:{PORTS['etcd_port']} (worker registrations, rollout slots) and "
                        f"http://{CLI_ADDRS['n0']}:{PORTS['proxy_port']}/healthcheck within 4s; a P/D smoke "
                        "completion through the proxy every 5s\n"), line
        with session() as s:
            r = s.get(f"http://{CLI_LISTEN}/metrics", timeout=30)
            assert r.status_code == 200 and 'ascend_pd_etcd_readable{stack="ex"} 0.0' in r.text.splitlines()
            r = s.get(f"http://{CLI_LISTEN}/", timeout=30)
            assert (r.status_code, r.text) == (200, "ascend-pd exporter of stack ex: metrics at /metrics\n")
            assert s.get(f"http://{CLI_LISTEN}/nope", timeout=30).status_code == 404
        taken = subprocess.run([sys.executable, "-m", "ascend_pd", "exporter", "--stack", "ex", "--project-dir",
                                str(tmp_path / "project")], cwd=MAIN, env=clean_env(), capture_output=True,
                               text=True, timeout=60)
        assert taken.returncode == 2 and taken.stdout == "", taken
        assert taken.stderr == (f"exporter: cannot listen on {CLI_LISTEN} (monitoring.exporter): Address already in "
                                "use; give --listen HOST:PORT\n")
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    # Its log: one line per check whose state changed (here: unreadable from the start).
    assert all(x.startswith("ascend-pd exporter: ") for x in err.splitlines()), err

    proc, line = start_cli(tmp_path / "project", "--listen", f"{CLI_ADDRS['n1']}:0")
    port = re.search(rf"http://{re.escape(CLI_ADDRS['n1'])}:(\d+)/metrics", line)
    assert port and int(port.group(1)) > 0, line  # port 0: a free one, and the line names it
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, (out, err)
    assert err.splitlines()[-1] == "python -m ascend_pd: interrupted" and "Traceback" not in err, err
