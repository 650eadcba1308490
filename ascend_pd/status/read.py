"""Reading: bounded HTTP (one deadline and one size cap per request), etcd reads, the smoke, the concurrent poll."""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import json
import math
import os
import re
import socket
import threading
import time
from dataclasses import replace
from typing import Callable, Optional

import etcd3gw
import etcd3gw.exceptions
import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions

from ..hang import Activity
from ..plan import ROLES, ROLLOUT_FAILED, ROLLOUT_KEY_PREFIX, Plan, Rank
from ..secrets import PROXY_KEY_ENV
from ..shell import pd_smoke
from .metrics import MetricsParseError, _check_counters, parse_prometheus
from .model import (MAX_BODY_BYTES, MAX_METRICS_BYTES, MAX_THREADS, SMOKE_MAX_TOKENS, WORKER_PREFIX, CacheCounters,
                    RequestCounters, RolloutKey, Timeouts, _pd_counts)
from .text import _field, _printable, _short, _size, _snippet


# ---------------------------------------------------------------------------------------------
# Polling


class _Failure(Exception):
    """A check failed; the message is the reason shown to the operator."""


# The reasons of a TCP connect that failed: nothing on that address accepted a connection at all (an
# endpoint that accepted one and then misbehaved is reachable). A node whose every endpoint failed
# this way is `unreachable` (NodeStatus).
REFUSED = "connection refused (nothing listening)"
NO_ROUTE = "no route to host"
_NO_CONNECTION = "no TCP connection within "
_CANNOT_CONNECT = "cannot connect: "  # _check_tcp's other OSErrors (network unreachable, ...)
_UNREACHABLE_REASONS = (REFUSED, _NO_CONNECTION, NO_ROUTE, _CANNOT_CONNECT)


def _no_connection(t: Timeouts) -> str:
    return f"{_NO_CONNECTION}{t.connect_s:g}s (node down or blackholed)"


def _unreachable(result: tuple[bool, object]) -> bool:
    """Whether a poll result (ok, value or reason) is a failed TCP connect."""
    ok, value = result
    return not ok and isinstance(value, str) and value.startswith(_UNREACHABLE_REASONS)


def _connection_reason(text: str, t: Timeouts) -> str:
    if "Connection refused" in text:
        return REFUSED
    if "connect timeout" in text or "ConnectTimeout" in text:
        return _no_connection(t)
    if "Read timed out" in text:
        return f"no answer within {t.request_s:g}s"
    if "No route to host" in text or "unreachable" in text:
        return NO_ROUTE
    if "RemoteDisconnected" in text:
        return "connection closed without an answer"
    if "BadStatusLine" in text or "LineTooLong" in text or "got more than" in text:
        return "not an HTTP answer: " + _short(text)
    return "connection failed: " + _short(text)


def _why(exc: BaseException, t: Timeouts) -> str:
    """The operator-facing reason of a failed check (control characters escaped)."""
    if isinstance(exc, _Failure):
        return _printable(str(exc))
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return _no_connection(t)
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return f"no answer within {t.request_s:g}s"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return _connection_reason(str(exc), t)
    if isinstance(exc, (etcd3gw.exceptions.ConnectionFailedError, etcd3gw.exceptions.ConnectionTimeoutError)):
        return _connection_reason(exc.detail_text or "", t)
    if isinstance(exc, etcd3gw.exceptions.Etcd3Exception):
        return f"etcd answered {type(exc).__name__}: {_short(exc.detail_text or '')}"
    if isinstance(exc, MetricsParseError):
        return "unparseable /metrics: " + _short(str(exc))
    return f"{type(exc).__name__}: {_short(str(exc))}"


# ---------------------------------------------------------------------------------------------
# Bounded HTTP: one deadline per request (connect, headers, body), one size cap per answer.
#
# requests/urllib3 timeouts bound each socket operation, not a request: a peer that sends one byte a
# second, in the headers or in the body, never trips them, and `iter_content(65536)` on a
# Content-Length body waits for 64 KiB before anyone looks at the clock. Here every socket of a
# request carries the request's deadline and each blocking call on it may wait only for what is left;
# the whole answer is read before `request()` returns, under a size cap. etcd3gw takes a requests
# Session, so its calls go through the same code.

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("ascend_pd_status_deadline")


class _DeadlineSocket(socket.socket):
    """A connected socket whose every blocking call returns by `deadline` (time.monotonic())."""

    deadline = 0.0

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")  # socket.timeout: urllib3 maps it to a read timeout
        self.settimeout(left)

    def recv(self, *args):
        self._arm()
        return super().recv(*args)

    def recv_into(self, *args):
        self._arm()
        return super().recv_into(*args)

    def send(self, *args):
        self._arm()
        return super().send(*args)

    def sendall(self, *args):
        self._arm()
        return super().sendall(*args)


class _DeadlineConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        deadline = _DEADLINE.get()  # set by _BoundedSession.request (LookupError: a connection outside it)
        sock = super()._new_conn()  # connected, within the connect timeout (itself within the deadline)
        timeout = sock.gettimeout()
        bounded = _DeadlineSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        bounded.settimeout(timeout)
        bounded.deadline = deadline
        return bounded


class _DeadlinePool(urllib3.HTTPConnectionPool):
    ConnectionCls = _DeadlineConnection


class _DeadlineAdapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _DeadlinePool}  # the cluster speaks plain HTTP


class _BoundedSession(requests.Session):
    """The requests of one check share one deadline, `total_s` from the session's creation (one
    request for a rank's /metrics; etcd3gw's version discovery, status and member list for etcd's
    members). Each answer is read whole, under `max_bytes`, before `request()` returns it
    (`resp.content`). No redirects, retries, proxies or compressed answers."""

    def __init__(self, t: Timeouts, total_s: float, max_bytes: int):
        super().__init__()
        # Cluster addresses are reached directly: an operator's HTTP(S)_PROXY would capture them.
        self.trust_env = False
        # identity: a compressed answer could expand past any cap.
        self.headers.update({"Connection": "close", "Accept-Encoding": "identity"})
        self.connect_s, self.total_s, self.max_bytes = t.connect_s, total_s, max_bytes
        self.deadline = time.monotonic() + total_s
        self.mount("http://", _DeadlineAdapter(max_retries=0))

    def request(self, method, url, **kwargs) -> requests.Response:
        if not str(url).startswith("http://"):
            raise _Failure(f"not polled: {_field(str(url))} is not an http:// URL")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Failure(f"no answer within {self.total_s:g}s")
        kwargs.update(stream=True, allow_redirects=False, timeout=(min(self.connect_s, left), left))
        token = _DEADLINE.set(self.deadline)
        try:
            resp = super().request(method, url, **kwargs)
            _read(resp, self.deadline, self.total_s, self.max_bytes)
        finally:
            _DEADLINE.reset(token)
        return resp


def _http(method: str, url: str, t: Timeouts, total_s: float, body: Optional[dict] = None, *,
          max_bytes: int = MAX_BODY_BYTES, headers: Optional[dict] = None) -> tuple[int, bytes]:
    """One HTTP request, done within `total_s` (connect, request, the whole answer), its answer
    under `max_bytes`; else _Failure (or requests' connect/read timeout and connection errors)."""
    with _BoundedSession(t, total_s, max_bytes) as session:
        resp = session.request(method, url, json=body, headers=headers)
        return resp.status_code, resp.content


def proxy_headers(plan: Plan) -> dict:
    """What a request to the proxy carries: its key (proxy.auth) from $ASCEND_PD_PROXY_API_KEY, if set."""
    key = os.environ.get(PROXY_KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key and plan.cfg.proxy.auth else {}


def _refused_by_proxy(code: int) -> None:
    if code == 401:
        raise _Failure(f"HTTP 401: the proxy requires its key (proxy.auth): export {PROXY_KEY_ENV}=\"$(pulumi config "
                       "get ascend-pd:proxyApiKey)\"")


_DIGITS = re.compile(r"[0-9]+")


def _read(resp: requests.Response, deadline: float, total_s: float, max_bytes: int = MAX_BODY_BYTES
          ) -> tuple[int, bytes]:
    """Read the whole answer of `resp` (a stream=True response on a _DeadlineSocket) by `deadline`
    and under `max_bytes`, keep it as `resp.content`, close the response."""
    with resp:
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise _Failure(f"answer is {_field(encoding, 20)}-encoded, identity was asked for")
        length = resp.headers.get("Content-Length", "").strip()
        if _DIGITS.fullmatch(length) and (len(length.lstrip("0")) > 18 or int(length) > max_bytes):
            raise _Failure(f"answer of {_field(length.lstrip('0'), 24)} bytes (Content-Length) "
                           f"is larger than the {_size(max_bytes)} cap")
        body = bytearray()
        try:
            for chunk in resp.raw.stream(65536, decode_content=False):
                if len(body) + len(chunk) > max_bytes:
                    raise _Failure(f"answer larger than the {_size(max_bytes)} cap")
                body += chunk
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if isinstance(exc, urllib3.exceptions.ReadTimeoutError) or time.monotonic() >= deadline:
                raise _Failure(f"answer not complete within {total_s:g}s") from None
            raise _Failure(f"answer cut off: {_short(str(exc), 80)}") from None
        # requests' own attribute behind resp.content/.text/.json(), which etcd3gw reads.
        resp._content = bytes(body)
        if resp.encoding is None:
            resp.encoding = "utf-8"  # else .text would guess the charset over the whole body
        return resp.status_code, resp._content


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} overflows a float")
    return value


def _loads(body: bytes) -> object:
    """Strict JSON: NaN, Infinity and numbers that overflow to inf are refused (and can never make
    `--json` output invalid)."""
    return json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)


def _get_json(url: str, t: Timeouts, headers: Optional[dict] = None) -> object:
    code, body = _http("GET", url, t, t.request_s, headers=headers)
    if headers is not None:
        _refused_by_proxy(code)
    if code != 200:
        raise _Failure(f"HTTP {code} {_short(body.decode(errors='replace'), 80)}".rstrip())
    try:
        return _loads(body)
    except (ValueError, RecursionError):
        raise _Failure(f"not JSON: {_short(body.decode(errors='replace'), 80)!r}") from None


def _etcd_client(plan: Plan, t: Timeouts) -> etcd3gw.Etcd3Client:
    """An etcd3gw client on a _BoundedSession: all the requests of one check end within t.request_s
    together, each answer under MAX_BODY_BYTES."""
    return etcd3gw.client(host=plan.etcd.address, port=plan.etcd.client_port,
                          session=_BoundedSession(t, t.request_s, MAX_BODY_BYTES))


def _etcd_call(call: Callable[[], object], what: str) -> object:
    """etcd3gw indexes the gateway's answers blindly: an answer of the wrong shape becomes a _Failure
    naming the call (etcd3gw's own exceptions and transport errors pass through to _why)."""
    try:
        return call()
    except requests.exceptions.JSONDecodeError:  # a ValueError and a RequestException
        raise _Failure(f"malformed {what} answer from the etcd gateway: not JSON") from None
    except (etcd3gw.exceptions.Etcd3Exception, _Failure, requests.exceptions.RequestException):
        raise
    except (LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise _Failure(f"malformed {what} answer from the etcd gateway "
                       f"({type(exc).__name__}: {_short(str(exc), 60)})") from None


def _check_etcd_health(plan: Plan, t: Timeouts) -> dict:
    health = _get_json(f"{plan.etcd.client_url}/health", t)
    if not isinstance(health, dict) or str(health.get("health")).lower() != "true":
        raise _Failure(f"/health says {_snippet(health, 120)}")
    return health


def _str_list(x: object) -> bool:
    return isinstance(x, list) and all(isinstance(u, str) for u in x)


def _check_etcd_members(plan: Plan, t: Timeouts) -> tuple[str, str, list[dict]]:
    """(version, leader's name, members); every string escaped and shortened for display."""
    c = _etcd_client(plan, t)
    try:
        status = _etcd_call(c.status, "status")
        members = _etcd_call(c.members, "member list")
    finally:
        c.session.close()
    bad = "malformed {} answer from the etcd gateway: {}".format
    if not isinstance(status, dict):
        raise _Failure(bad("status", _snippet(status)))
    version, leader = status.get("version", "?"), status.get("leader", "")
    if not isinstance(version, str):
        raise _Failure(bad("status", f"version {_snippet(version)}, not a string"))
    if isinstance(leader, bool) or not isinstance(leader, (str, int)):
        raise _Failure(bad("status", f"leader {_snippet(leader)}, not a member ID"))
    if not isinstance(members, list):
        raise _Failure(bad("member list", _snippet(members)))
    names, out = {}, []
    for i, m in enumerate(members):
        if not isinstance(m, dict):
            raise _Failure(bad("member list", f"member {i} is {_snippet(m)}"))
        name, client, peer = m.get("name", ""), m.get("clientURLs", []), m.get("peerURLs", [])
        if not isinstance(name, str):
            raise _Failure(bad("member list", f"member {i} has the name {_snippet(name)}, not a string"))
        if not (_str_list(client) and _str_list(peer)):
            raise _Failure(bad("member list", f"member {i} has URLs {_snippet([client, peer])}"))
        names[str(m.get("ID"))] = _field(name)
        out.append({"name": _field(name), "client_urls": [_field(u) for u in client[:16]],
                    "peer_urls": [_field(u) for u in peer[:16]]})
    leader = str(leader)
    return _field(version, 40), names.get(leader, _field(leader)) if leader not in ("", "0") else "", out


def _lease_id(meta: dict) -> int:
    """The lease ID of a key from the gateway's metadata (an int64, as a JSON string); 0: none (or not
    a number: only the exporter reads it, and a slot without a lease has no age)."""
    lease = meta.get("lease", 0)
    if isinstance(lease, bool) or not isinstance(lease, (str, int)) or not _DIGITS.fullmatch(str(lease)):
        return 0
    return int(lease) if len(str(lease)) <= 19 else 0


def _etcd_entries(c: etcd3gw.Etcd3Client, prefix: str) -> list[tuple[str, str, int]]:
    """(key below `prefix`, value, its lease ID or 0) of every key under it, read through `c`, as text
    (not yet escaped)."""
    found = _etcd_call(lambda: c.get_prefix(prefix), "key range")
    raw = prefix.encode()
    out = []
    for value, meta in found:  # etcd3gw's list of (value, metadata) with both base64-decoded to bytes
        key = meta.get("key")
        if not isinstance(key, bytes) or not key.startswith(raw):
            raise _Failure(f"malformed key range answer from the etcd gateway: key {_field(repr(key), 60)} "
                           f"is not under {prefix}")
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        out.append((key[len(raw):].decode(errors="replace"), text, _lease_id(meta)))
    return out


def _etcd_prefix(plan: Plan, t: Timeouts, prefix: str) -> list[tuple[str, str]]:
    """(key below `prefix`, value) of every key under it, as text (not yet escaped)."""
    c = _etcd_client(plan, t)
    try:
        return [(key, text) for key, text, _ in _etcd_entries(c, prefix)]
    finally:
        c.session.close()


def _check_registrations(plan: Plan, t: Timeouts) -> dict[str, str]:
    """Registered worker address -> state (the value is `<timestamp>;<state>`), both escaped and
    shortened for display."""
    return {_field(key): _field(text.rsplit(";", 1)[-1], 40) for key, text in _etcd_prefix(plan, t, WORKER_PREFIX)}


def _rollout_keys(plan: Plan, c: etcd3gw.Etcd3Client) -> list[RolloutKey]:
    """The restart slots and failure marks of the stack's roles in etcd, read through `c`."""
    out = []
    for key, text, lease in _etcd_entries(c, f"{ROLLOUT_KEY_PREFIX}/{plan.stack}/"):
        role, _, slot = key.partition("/")
        if role in ROLES:
            out.append(RolloutKey(role, _field(text, 60), slot == ROLLOUT_FAILED, lease))
    return out


def _check_rollout(plan: Plan, t: Timeouts) -> list[RolloutKey]:
    """The restart slots and failure marks of the stack's roles (names escaped and shortened)."""
    c = _etcd_client(plan, t)
    try:
        return _rollout_keys(plan, c)
    finally:
        c.session.close()


def _check_tcp(address: str, t: Timeouts) -> None:
    """A TCP connect to host:port (the worker speaks its own RPC, not HTTP)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=t.connect_s).close()
    except ConnectionRefusedError:
        raise _Failure(REFUSED) from None
    except (socket.timeout, TimeoutError):
        raise _Failure(_no_connection(t)) from None
    except OSError as exc:
        raise _Failure(f"{_CANNOT_CONNECT}{exc.strerror or exc}") from None


def _check_rank_health(r: Rank, t: Timeouts) -> None:
    code, body = _http("GET", f"{r.url}/health", t, t.request_s)
    if code != 200:
        raise _Failure(f"/health: HTTP {code} {_short(body.decode(errors='replace'), 60)}".rstrip())


def _check_rank_models(r: Rank, t: Timeouts) -> list[str]:
    try:
        answer = _get_json(f"{r.url}/v1/models", t)
    except _Failure as exc:
        raise _Failure(f"/v1/models: {exc}") from None
    try:
        return [_field(str(m["id"]), 200) for m in answer["data"]]
    except (KeyError, TypeError):
        raise _Failure(f"/v1/models: unexpected answer {_snippet(answer, 100)}") from None


def _metrics_samples(url: str, t: Timeouts, total_s: float) -> dict:
    deadline = time.monotonic() + total_s  # parsing a big answer counts too
    code, body = _http("GET", f"{url}/metrics", t, total_s, max_bytes=MAX_METRICS_BYTES)
    if code != 200:
        raise _Failure(f"/metrics: HTTP {code}")
    try:
        samples = parse_prometheus(body.decode("utf-8", errors="replace"), deadline=deadline)
    except TimeoutError:
        raise _Failure(f"/metrics: {len(body)} bytes not parsed within {total_s:g}s") from None
    _check_counters(samples)
    return samples


class MetricsBoard:
    """The ranks' /metrics counters as this poll's rank checks read them, shared with the smoke as
    its "before" snapshot: one read per rank instead of two, and a rank that passed its own check
    (within --timeout) is never unreadable to the smoke for a tighter deadline of its own."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = frozenset(urls)  # the ranks whose checks post here
        self._counts: dict[str, Optional[dict]] = {}
        self._cond = threading.Condition()

    def put(self, url: str, counts: Optional[dict]) -> None:
        with self._cond:
            self._counts[url] = counts
            self._cond.notify_all()

    def wait(self, urls: list[str], until: float) -> dict:
        """{url: counts or None} for those of `urls` posted here, once all of them are in or at `until`
        (time.monotonic()); one not in by then maps to None."""
        mine = [u for u in urls if u in self.urls]
        with self._cond:
            self._cond.wait_for(lambda: all(u in self._counts for u in mine),
                                timeout=max(0.0, until - time.monotonic()))
            return {u: self._counts.get(u) for u in mine}


def _check_rank_metrics(r: Rank, t: Timeouts, board: Optional[MetricsBoard] = None
                        ) -> tuple[CacheCounters, RequestCounters, Activity]:
    url, samples = r.url, None
    try:
        samples = _metrics_samples(url, t, t.request_s)
    finally:  # a failed read is posted too: the smoke stops waiting for it
        if board is not None:
            board.put(url, _pd_counts(samples) if samples is not None else None)
    return CacheCounters.from_samples(samples), RequestCounters.from_samples(samples), Activity.from_samples(samples)


def _check_proxy(plan: Plan, t: Timeouts) -> dict:
    answer = _get_json(f"{plan.proxy.url}/healthcheck", t, proxy_headers(plan))
    if not isinstance(answer, dict):
        raise _Failure(f"/healthcheck: unexpected answer {json.dumps(answer)[:100]}")
    return answer


SMOKE_METRICS_THREADS = 16  # concurrent /metrics reads of the smoke (answers are capped at 4 MiB)


def _pd_snapshot(urls: list[str], t: Timeouts, until: float) -> dict:
    """Every rank's counters for the P/D judgement, read by `until` (time.monotonic()); None where a
    read failed or did not finish in time."""
    def one(url: str):
        left = until - time.monotonic()
        return _pd_counts(_metrics_samples(url, t, left)) if left > 0 else None

    out: dict = dict.fromkeys(urls)
    pool = cf.ThreadPoolExecutor(max_workers=max(1, min(SMOKE_METRICS_THREADS, len(urls))),
                                 thread_name_prefix="smoke")
    try:
        futures = {pool.submit(one, u): u for u in urls}
        done, _ = cf.wait(futures, timeout=max(0.0, until - time.monotonic()))
        for f in done:
            if f.exception() is None:
                out[futures[f]] = f.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out


def _smoke(plan: Plan, t: Timeouts, board: Optional[MetricsBoard] = None) -> tuple[float, str, str]:
    """One chat completion that a prefill and a decode rank must both serve (pd_smoke.judge), every
    rank's /metrics read before and after it, all within the smoke's deadline. With `board` (a poll
    whose rank checks read every rank's /metrics at the same time) their reads are the "before"."""
    body = {
        "model": plan.cfg.model.served_name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": SMOKE_MAX_TOKENS, "temperature": 0, "stream": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    ranks = json.loads(plan.proxy.backends_json)
    urls = ranks["prefill"] + ranks["decode"]
    started = time.monotonic()
    deadline = started + t.smoke_s
    after_s = min(t.request_s, t.smoke_s / 4)  # the round of /metrics after it
    if board is None:
        before = _pd_snapshot(urls, t, started + after_s)
    else:  # the rank checks' reads, each bounded by request_s: up to half the smoke's deadline
        before = board.wait(urls, started + min(t.request_s, t.smoke_s / 2))
        missing = [u for u in urls if u not in before]  # a backend that is no planned rank: read it here
        before.update(_pd_snapshot(missing, t, started + after_s) if missing else {})
    t0 = time.monotonic()
    budget = max(deadline - after_s - t0, 0.001)
    ts = replace(t, request_s=budget)
    try:
        code, raw = _http("POST", f"{plan.proxy.url}/v1/chat/completions", ts, budget, body,
                          headers=proxy_headers(plan))
        _refused_by_proxy(code)
    except _Failure as exc:  # the completion's share of the deadline varies: name the deadline itself
        raise _Failure(re.sub(r"within [0-9.e+-]+s", f"within {t.smoke_s:g}s", str(exc))) from None
    except Exception as exc:  # noqa: BLE001 - reported with the smoke's own timeout
        raise _Failure(_why(exc, replace(t, request_s=t.smoke_s))) from None
    latency = time.monotonic() - t0
    after = _pd_snapshot(urls, t, deadline)
    ok, message = pd_smoke.judge(ranks, before, after, code, raw, latency, t.smoke_s)
    if not ok:
        raise _Failure(message)
    msg = json.loads(raw)["choices"][0]["message"]
    text = msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or ""
    return latency, " ".join(str(text).split())[:60], message.split(" in ", 1)[0]


def _rank_component(r: Rank) -> str:
    return f"rank {r.name} ({r.node} {r.address}:{r.port})"


def _poll(jobs: dict[tuple, Callable[[], object]], t: Timeouts,
          progress: Optional[Callable[[int, int], None]]) -> dict[tuple, tuple[bool, object]]:
    """Run every job in its own thread: key -> (True, result) or (False, reason)."""
    results: dict[tuple, tuple[bool, object]] = {}
    safety = t.bound_s + 5  # every request bounds itself; this net catches one that would not
    pool = cf.ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(jobs)), thread_name_prefix="status")
    try:
        futures = {pool.submit(fn): key for key, fn in jobs.items()}
        pending, deadline = set(futures), time.monotonic() + safety
        if progress:
            progress(0, len(futures))
        while pending:
            done, pending = cf.wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                    return_when=cf.FIRST_COMPLETED)
            if not done:
                break
            for f in done:
                exc = f.exception()
                results[futures[f]] = (False, _why(exc, t)) if exc else (True, f.result())
            if progress:
                progress(len(results), len(futures))
        for f in pending:
            results[futures[f]] = (False, f"no result within {safety:g}s")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return results
