"""`ascend-pd exporter --stack NAME [--listen HOST:PORT]`: a Prometheus exporter of the cluster facts that
no component exports itself, read and judged exactly as `status` reads and judges them (status.read's
checks and status.judge's verdicts, not a second copy):

* the openYuanrong workers' registrations in etcd (`status.read._check_registrations`, keys under
  `status.WORKER_PREFIX`): `ascend_pd_worker_registered{node,address}` 1/0 for every planned worker and
  `ascend_pd_workers_unplanned`, the registrations of workers the plan does not have. While etcd cannot
  be read there is no such series at all (unknown is not 0) and `ascend_pd_etcd_readable` is 0.
* the rolling restarts' keys in etcd (`status.read._rollout_keys`, shell/rollout_lib.sh): for every held
  restart slot `ascend_pd_rollout_slot_held_seconds{role,instance}`, its age from the slot key's lease
  (granted TTL - remaining TTL, etcd's LeaseTimeToLive), so that restarting the exporter does not reset
  it; `ascend_pd_rollout_failed{role,instance}` 1 while a role's failure mark names the instance.
* the PD proxy's `/healthcheck` (`status.read._check_proxy`): `ascend_pd_proxy_up`, the prefill and decode
  "instances" it routes to (`ascend_pd_proxy_instances{role}`: the proxy counts every rank endpoint as
  one) and the plan's (`ascend_pd_proxy_instances_planned{role}`: its rank endpoints, as status compares).
* the P/D smoke (`status.read._smoke`: one tiny chat completion through the proxy that a prefill rank and a
  decode rank must both serve, judged by their counters), in a thread of its own every
  `monitoring.smokeIntervalS`, never two at once and never per scrape: `ascend_pd_smoke_success`,
  `ascend_pd_smoke_latency_seconds` (of the last successful one), `ascend_pd_smoke_last_run_timestamp_seconds`
  and the counter `ascend_pd_smoke_total{result="ok"|"failed"}`.

Every series carries `stack`. A scrape collects the etcd and proxy facts concurrently (`status.read._poll`),
each request bounded by `scrape_timeouts` (below Prometheus' scrape timeout); scrapes that come while a
collection runs, or within CACHE_S of one, are answered from it, so concurrent scrapes never pile up
collections. A check that fails is a 0 or an absent series (and one line on stderr when its state
changes), never an HTTP 500 nor the exporter's end. `ascend_pd_exporter_collect_seconds` is how long
the collection behind the answer took.

The families are prometheus_client's (GaugeMetricFamily, CounterMetricFamily) from a collector on a
registry of the exporter's own (no process or platform metrics), written by the library: `GET /metrics`
is its WSGI app (text format 0.0.4, or OpenMetrics when the Accept header asks for it, gzip when
accepted), behind a small dispatcher that adds `GET /` (a one-line hint) and 404 elsewhere, served by
wsgiref with a thread per request as the library's own `start_wsgi_server` does. SIGTERM stops it with
exit code 0, Ctrl-C with the command line's 130.
"""

from __future__ import annotations

import re
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .config import Monitoring
from .valuetypes import HOST
from .plan import Plan
from .status import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, Timeouts
from .status.judge import proxy_verdict, registrations, rollout_verdicts, smoke_verdict
from .status.model import RolloutStatus
from .status.read import (_check_proxy, _check_registrations, _etcd_call, _etcd_client, _poll, _rollout_keys, _smoke,
                          _why)
from .status.text import _short

DEFAULT_LISTEN = ("127.0.0.1", 9478)  # without --listen and monitoring.exporter
CACHE_S = 1.0  # a collection answers the scrapes of the next second too
SCRAPE_SHARE = 0.8  # of Prometheus' scrape timeout (= monitoring.scrapeIntervalS) a collection may take
HANDLER_TIMEOUT_S = 10.0  # a client that sends its request slower than this is dropped
STOP_SMOKE_S = 2.0  # how long stopping waits for a smoke in flight (its thread is a daemon)

_HOST = re.compile(HOST)  # the host part of monitoring.exporter's type (valuetypes.HostPort)


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); port 0 takes a free port. ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.fullmatch(host):
        raise ValueError(f"{text!r} is not HOST:PORT (a host name or IPv4 address, e.g. 127.0.0.1:9478)")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


def scrape_timeouts(monitoring: Monitoring) -> Timeouts:
    """The bounds of a scrape's requests (etcd, the proxy's /healthcheck): SCRAPE_SHARE of Prometheus'
    scrape timeout, which render sets to monitoring.scrapeIntervalS, and never above status' own."""
    request_s = min(REQUEST_TIMEOUT_S, SCRAPE_SHARE * monitoring.scrape_interval_s)
    return Timeouts(connect_s=min(CONNECT_TIMEOUT_S, request_s), request_s=request_s, smoke_s=request_s)


# ---------------------------------------------------------------------------------------------
# Families


@dataclass
class Family:
    """One metric family as the collection builds it; `_metric` makes it prometheus_client's."""

    name: str
    type: str  # gauge or counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _metric(f: Family) -> Metric:
    """The library's family of `f`. A counter's family is named without `_total` (OpenMetrics' rule,
    CounterMetricFamily strips it) and its samples with it: the series stays `ascend_pd_smoke_total`.
    No `_created` sample is added."""
    m = CounterMetricFamily(f.name, f.help) if f.type == "counter" else GaugeMetricFamily(f.name, f.help)
    sample = m.name + "_total" if f.type == "counter" else m.name
    for labels, value in f.samples:
        m.add_sample(sample, {k: str(v) for k, v in labels.items()}, value)
    return m


class _Families(Collector):
    """A collector of what `families()` gives at each collection."""

    def __init__(self, families: Callable[[], Iterable[Family]]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return [_metric(f) for f in self.families()]


def _registry(families: Callable[[], Iterable[Family]]) -> CollectorRegistry:
    """A registry of its own: none of the library's default process and platform collectors, and no
    collection at registration (auto_describe=False)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def exposition(families: list[Family]) -> str:
    """The families in Prometheus' text format 0.0.4, written by prometheus_client: `# HELP` and `# TYPE`
    for each (also when it has no sample now), then its samples."""
    return generate_latest(_registry(lambda: families)).decode()


# ---------------------------------------------------------------------------------------------
# What a scrape reads


@dataclass(frozen=True)
class Slot:
    role: str
    instance: str
    held_s: Optional[float]  # None: no lease, or it ended between the range read and its TTL query


@dataclass(frozen=True)
class Rollout:
    slots: list[Slot]
    roles: list[RolloutStatus]  # status' verdicts: per role with a restart under way or stopped


def _lease_held_s(c, lease: int) -> Optional[float]:
    """How long ago the lease was granted: its granted TTL minus the TTL left (LeaseTimeToLive); None
    when it has ended. Slot leases are never kept alive (rollout_lib.sh), so this is the slot's age."""

    def ask() -> Optional[float]:
        answer = c.post(c.get_url("/kv/lease/timetolive"), json={"ID": lease})
        left = int(answer.get("TTL", -1))
        granted = int(answer.get("grantedTTL", 0))
        if left < 0 or granted <= 0:
            return None
        return float(max(0, granted - left))

    return _etcd_call(ask, "lease time-to-live")


def _check_rollout_slots(plan: Plan, t: Timeouts) -> Rollout:
    """The held restart slots with their ages and the failure marks, all read through one client whose
    requests end within t.request_s together."""
    c = _etcd_client(plan, t)
    try:
        keys = _rollout_keys(plan, c)
        ages: dict[int, Optional[float]] = {}
        for k in keys:
            if not k.failed and k.lease and k.lease not in ages:
                ages[k.lease] = _lease_held_s(c, k.lease)
    finally:
        c.session.close()
    slots = [Slot(k.role, k.instance, ages.get(k.lease)) for k in keys if not k.failed]
    return Rollout(slots, rollout_verdicts(keys))


@dataclass(frozen=True)
class Collection:
    workers: tuple[bool, object]  # (True, {address: state}) or (False, reason)
    rollout: tuple[bool, object]  # (True, Rollout) or (False, reason)
    proxy: tuple[bool, object]  # (True, /healthcheck's answer) or (False, reason)
    took_s: float
    at: float  # time.monotonic() when it ended


@dataclass
class SmokeState:
    runs: int = 0
    ok: Optional[bool] = None  # None: none finished yet
    reason: str = ""
    latency_s: Optional[float] = None  # of the last successful one
    served_by: str = ""
    last_run: Optional[float] = None  # epoch seconds when the last one ended
    totals: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})


HELP = {
    "etcd_readable": "1 if this scrape read the worker registrations and the rollout keys from etcd, else 0.",
    "worker_registered": "1 if the planned openYuanrong worker has a registration in etcd (in any state), else 0; "
                         "no series while etcd cannot be read.",
    "workers_unplanned": "Worker registrations in etcd of addresses the plan has no worker on.",
    "slot_held": "How long the instance has held its role's restart slot: the slot key's lease granted TTL minus "
                 "its remaining TTL.",
    "rollout_failed": "1 while the role's rollout failure mark in etcd names the instance whose restart failed.",
    "proxy_up": "1 if the PD proxy answered /healthcheck, else 0.",
    "proxy_instances": "Backends of the role the PD proxy's /healthcheck reports (it counts every rank endpoint "
                       "as an instance).",
    "proxy_planned": "Backends of the role the plan gives the PD proxy (its rank endpoints).",
    "smoke_success": "1 if the last P/D smoke completion through the proxy was served by a prefill and a decode "
                     "rank, else 0.",
    "smoke_latency": "Latency of the last successful P/D smoke completion.",
    "smoke_last_run": "When the last P/D smoke completion ended (Unix time).",
    "smoke_total": "P/D smoke completions by result.",
    "collect": "How long the collection behind this answer took (etcd and the proxy's /healthcheck).",
}


class Exporter:
    """The collections and the smoke of one plan; `metrics()` is the answer to a scrape."""

    def __init__(self, plan: Plan, *, timeouts: Optional[Timeouts] = None, smoke_timeouts: Timeouts = Timeouts(),
                 smoke_interval_s: Optional[float] = None, cache_s: float = CACHE_S,
                 log: Optional[Callable[[str], None]] = None):
        m = plan.cfg.monitoring
        self.plan = plan
        self.timeouts = timeouts or scrape_timeouts(m)
        self.poll_timeouts = replace(self.timeouts, smoke_s=self.timeouts.request_s)  # no smoke in a scrape
        self.smoke_timeouts = smoke_timeouts
        self.smoke_interval_s = float(m.smoke_interval_s if smoke_interval_s is None else smoke_interval_s)
        self.cache_s = cache_s
        self.log = log or _line_writer(sys.stderr)
        self.collections = 0  # collections made (a test reads it)
        self._collect_lock = threading.Lock()  # one collection at a time; the others wait for it
        self._last: Optional[Collection] = None
        self._smoke_lock = threading.Lock()  # one smoke at a time, whoever starts it
        self._state_lock = threading.Lock()
        self.smoke = SmokeState()
        self._said: dict[str, str] = {}  # check -> its last logged state
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- scrape

    def collect(self) -> Collection:
        """A collection at most cache_s old: made now, or the one a concurrent scrape just made."""
        with self._collect_lock:
            last = self._last
            if last is not None and time.monotonic() - last.at < self.cache_s:
                return last
            t = self.poll_timeouts
            jobs = {
                "workers": lambda: _check_registrations(self.plan, t),
                "rollout": lambda: _check_rollout_slots(self.plan, t),
                "proxy": lambda: _check_proxy(self.plan, t),
            }
            t0 = time.monotonic()
            results = _poll(jobs, t, None)
            took = time.monotonic() - t0
            self._last = Collection(results["workers"], results["rollout"], results["proxy"], took, time.monotonic())
            self.collections += 1
            for name, what in (("workers", "etcd: worker registrations"), ("rollout", "etcd: rollout keys"),
                               ("proxy", f"proxy {self.plan.proxy.url}/healthcheck")):
                ok, value = results[name]
                said = "read again" if ok else f"unreadable: {value}"
                self._say(name, "ok" if ok else str(value), f"{what}: {said}")
            return self._last

    def metrics(self) -> str:
        """The /metrics answer in text format 0.0.4."""
        return exposition(self.families())

    def families(self) -> list[Family]:
        """What a scrape answers. Each part is built on its own: one that fails (a bug, an odd answer) is
        left out and logged, never an error answer."""
        families: list[Family] = []
        try:
            c = self.collect()
        except Exception as exc:  # noqa: BLE001 - a bug net: every check then reads as failed
            why = f"{type(exc).__name__}: {_short(str(exc))}"
            self.log(f"ascend-pd exporter: collection failed: {why}")
            c = Collection((False, why), (False, why), (False, why), 0.0, time.monotonic())
        for part in (lambda: self._etcd_families(c), lambda: self._proxy_families(c), self._smoke_families):
            try:
                families += part()
            except Exception as exc:  # noqa: BLE001 - the other parts are still worth serving
                self.log(f"ascend-pd exporter: left out of /metrics: {type(exc).__name__}: {_short(str(exc))}")
        collect = Family("ascend_pd_exporter_collect_seconds", "gauge", HELP["collect"])
        collect.add(round(c.took_s, 6), stack=self.plan.stack)
        return families + [collect]

    def _etcd_families(self, c: Collection) -> list[Family]:
        s = self.plan.stack
        (w_ok, w_val), (r_ok, r_val) = c.workers, c.rollout
        readable = Family("ascend_pd_etcd_readable", "gauge", HELP["etcd_readable"])
        readable.add(int(w_ok and r_ok), stack=s)
        registered = Family("ascend_pd_worker_registered", "gauge", HELP["worker_registered"])
        unplanned = Family("ascend_pd_workers_unplanned", "gauge", HELP["workers_unplanned"])
        if w_ok:
            states, others = registrations(self.plan, w_val)
            for w in self.plan.workers:
                registered.add(int(states[w.address] is not None), stack=s, node=w.node, address=w.address)
            unplanned.add(len(others), stack=s)
        held = Family("ascend_pd_rollout_slot_held_seconds", "gauge", HELP["slot_held"])
        failed = Family("ascend_pd_rollout_failed", "gauge", HELP["rollout_failed"])
        if r_ok:
            ages: dict[tuple[str, str], float] = {}
            for slot in r_val.slots:
                if slot.held_s is not None:  # one series per (role, instance), should a name hold two slots
                    key = (slot.role, slot.instance)
                    ages[key] = max(ages.get(key, 0.0), slot.held_s)
            for (role, instance), age in sorted(ages.items()):
                held.add(age, stack=s, role=role, instance=instance)
            for role in r_val.roles:
                if role.failed is not None:
                    failed.add(1, stack=s, role=role.role, instance=role.failed)
        return [readable, registered, unplanned, held, failed]

    def _proxy_families(self, c: Collection) -> list[Family]:
        s = self.plan.stack
        v = proxy_verdict(self.plan, c.proxy)
        up = Family("ascend_pd_proxy_up", "gauge", HELP["proxy_up"])
        up.add(int(c.proxy[0]), stack=s)
        reported = Family("ascend_pd_proxy_instances", "gauge", HELP["proxy_instances"])
        planned = Family("ascend_pd_proxy_instances_planned", "gauge", HELP["proxy_planned"])
        for role, value, n in (("prefill", v.prefill_instances, v.expected_prefill),
                               ("decode", v.decode_instances, v.expected_decode)):
            planned.add(n, stack=s, role=role)
            if isinstance(value, int) and not isinstance(value, bool):
                reported.add(value, stack=s, role=role)
        return [up, reported, planned]

    # -- smoke

    def smoke_once(self) -> SmokeState:
        """One smoke completion (waits for one in flight to end first: never two at once)."""
        with self._smoke_lock:
            try:
                v = smoke_verdict((True, _smoke(self.plan, self.smoke_timeouts)))
            except Exception as exc:  # noqa: BLE001 - every failure is a failed smoke, with its reason
                v = smoke_verdict((False, _why(exc, self.smoke_timeouts)))
            ok, reason, latency, served_by = v.ok, v.reason, v.latency_s, v.served_by
            with self._state_lock:
                st = self.smoke
                st.runs += 1
                st.ok, st.reason, st.last_run = ok, reason, time.time()
                st.totals["ok" if ok else "failed"] += 1
                if ok:
                    st.latency_s, st.served_by = latency, served_by
                snapshot = replace(st, totals=dict(st.totals))
            self._say("smoke", "ok" if ok else reason,
                      f"smoke via {self.plan.proxy.url}: " + (f"ok again ({served_by})" if ok else f"failed: {reason}"))
            return snapshot

    def _smoke_families(self) -> list[Family]:
        s = self.plan.stack
        with self._state_lock:
            st = replace(self.smoke, totals=dict(self.smoke.totals))
        success = Family("ascend_pd_smoke_success", "gauge", HELP["smoke_success"])
        latency = Family("ascend_pd_smoke_latency_seconds", "gauge", HELP["smoke_latency"])
        last = Family("ascend_pd_smoke_last_run_timestamp_seconds", "gauge", HELP["smoke_last_run"])
        total = Family("ascend_pd_smoke_total", "counter", HELP["smoke_total"])
        if st.ok is not None:
            success.add(int(st.ok), stack=s)
            last.add(round(st.last_run, 3), stack=s)
        if st.latency_s is not None:
            latency.add(round(st.latency_s, 6), stack=s)
        for result in ("ok", "failed"):
            total.add(st.totals[result], stack=s, result=result)
        return [success, latency, last, total]

    def _smoke_loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            started = time.monotonic()
            try:
                self.smoke_once()
            except Exception as exc:  # noqa: BLE001 - smoke_once reports its own failures; this is a bug net
                self.log(f"ascend-pd exporter: smoke: {type(exc).__name__}: {_short(str(exc))}")
            next_at = started + self.smoke_interval_s  # an overrun one is followed by the next at once

    def start(self) -> None:
        """The smoke every smoke_interval_s, the first one now."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._smoke_loop, name="ascend-pd-smoke", daemon=True)
            self._thread.start()

    def stop(self, wait_s: float = STOP_SMOKE_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait_s)

    def _say(self, check: str, state: str, message: str) -> None:
        """Log a check's state when it changes (the first time only when it is not ok)."""
        before = self._said.get(check)
        self._said[check] = state
        if state != before and (before is not None or state != "ok"):
            self.log(f"ascend-pd exporter: {message}")


# ---------------------------------------------------------------------------------------------
# HTTP


def wsgi_app(exporter: Exporter) -> Callable:
    """prometheus_client's WSGI app at /metrics (it picks the format from the Accept header), a hint at /,
    404 elsewhere. A failure of the app itself (a bug: the collection has its own nets) is one line in
    the log and a 500, never a traceback."""
    metrics = make_wsgi_app(_registry(exporter.families))

    def app(environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics":
            try:
                body = metrics({**environ, "REQUEST_METHOD": "GET" if method == "HEAD" else method}, start_response)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                exporter.log(f"ascend-pd exporter: /metrics failed: {type(exc).__name__}: {_short(str(exc))}")
                code, text = "500 Internal Server Error", "the exporter failed: see its log\n"
            else:
                return [] if method == "HEAD" else body
        elif path == "/":
            code, text = "200 OK", f"ascend-pd exporter of stack {exporter.plan.stack}: metrics at /metrics\n"
        else:
            code, text = "404 Not Found", "not found: try /metrics\n"
        data = text.encode()
        start_response(code, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
        return [] if method == "HEAD" else [data]

    return app


class _Handler(WSGIRequestHandler):
    timeout = HANDLER_TIMEOUT_S  # a client that sends its request slower than this is dropped

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - no access log (Prometheus scrapes every few s)
        pass


class ExporterServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per request (the library's start_wsgi_server does the same)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], exporter: Exporter):
        self.exporter = exporter
        super().__init__(address, _Handler)
        self.set_app(wsgi_app(exporter))

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a reverse DNS lookup that may hang): not needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()

    def handle_error(self, request, client_address) -> None:
        # A client that went away or was too slow is no news; anything else is logged in one line, no traceback.
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, socket.timeout, TimeoutError)):
            self.exporter.log(f"ascend-pd exporter: request from {client_address[0]}: {type(exc).__name__}: "
                              f"{_short(str(exc))}")


def serve(exporter: Exporter, host: str, port: int) -> tuple[ExporterServer, threading.Thread]:
    """Listen on host:port (OSError if it cannot) and serve in a thread of its own."""
    server = ExporterServer((host, port), exporter)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="ascend-pd-http",
                              daemon=True)
    thread.start()
    return server, thread


def _line_writer(stream) -> Callable[[str], None]:
    """Whole lines to `stream` from any thread (print() writes the text and its newline apart)."""
    lock = threading.Lock()

    def write(message: str) -> None:
        with lock:
            stream.write(message + "\n")
            stream.flush()

    return write


class _Terminated(Exception):
    """SIGTERM arrived."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough: another one must not cut the shutdown short
    raise _Terminated()


def run(plan: Plan, listen: Optional[tuple[str, int]] = None, *, out=None, err=None) -> int:
    """The `exporter` command: serve until SIGTERM (exit 0) or Ctrl-C (KeyboardInterrupt: the command
    line's 130). Exit 2 when it cannot listen where it is told to."""
    out, err = out or sys.stdout, err or sys.stderr
    m = plan.cfg.monitoring
    if listen is not None:
        (host, port), where = listen, "--listen"
    elif m.exporter is not None:
        (host, port), where = parse_listen(m.exporter), "monitoring.exporter"
    else:
        (host, port), where = DEFAULT_LISTEN, "the default"
    exporter = Exporter(plan, log=_line_writer(err))
    try:
        server, thread = serve(exporter, host, port)
    except OSError as exc:
        print(f"exporter: cannot listen on {host}:{port} ({where}): {exc.strerror or exc}; give --listen HOST:PORT",
              file=err)
        return 2
    previous = None
    try:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _terminate)
        t = exporter.timeouts
        print(f"ascend-pd exporter: stack {plan.stack}, http://{host}:{server.server_port}/metrics; scrapes read etcd "
              f"{plan.etcd.endpoint} (worker registrations, rollout slots) and {plan.proxy.url}/healthcheck within "
              f"{t.request_s:g}s; a P/D smoke completion through the proxy every {exporter.smoke_interval_s:g}s",
              file=out, flush=True)
        exporter.start()
        while True:
            time.sleep(3600)
    except _Terminated:
        return 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(2)
        exporter.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


__all__ = ["Exporter", "ExporterServer", "Family", "exposition", "parse_listen", "scrape_timeouts", "serve", "run",
           "wsgi_app", "DEFAULT_LISTEN"]
