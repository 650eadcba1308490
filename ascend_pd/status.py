"""`python -m ascend_pd status --stack NAME`: is the deployed stack whole and healthy, and how well
does the KV cache hit?

Runs on an operator's machine from the stack file alone (`load_stack` + `build_plan`), so it expects
exactly what `pulumi up` deployed. `collect_status(plan)` polls, concurrently (one thread per HTTP
request, every request with a connect timeout and a total deadline, so a dead or blackholed node costs
one timeout and never hangs the command):

* etcd (`plan.etcd`): `/health`, its members and leader (etcd3gw), and the openYuanrong workers
  registered under `/datasystem/cluster/<host:port>` (value `<timestamp>;<state>`): every
  `plan.workers[].address` must be registered in state `ready` and accept a TCP connection (the
  registration is leased, so a killed worker stays registered for up to nodeTimeoutS); unplanned
  registrations are listed.
* every vLLM rank (`plan.ranks`): `GET /health` is 200, `GET /v1/models` lists the served model name,
  `GET /metrics` parses.
* the PD proxy: `GET /healthcheck` reports `len(plan.proxy.prefillers)` prefill and
  `len(plan.proxy.decoders)` decode instances, and one smoke chat completion through it returns text
  (`content`, `reasoning` or `reasoning_content`) that a prefill rank and a decode rank both served:
  between a read of every rank's `/metrics` before and one after it, a prefill rank finished a request
  and a decode rank's `vllm:external_prefix_cache_hits_total` (KV received from prefill) rose
  (`shell/pd_smoke.py`'s judgement; a decode-only fallback, an empty HTTP 200 or a bypassed prefill is
  a problem naming the side that did not take part). The reads and the completion share the smoke's
  deadline.
* per instance: requests running and waiting (`vllm:num_requests_running`/`_waiting`) and the
  requests its ranks finished (`vllm:request_success_total`, finished_reason stop/length) or failed
  (abort/error), summed over its ranks.

Everything expected that is missing or unhealthy becomes a `Problem(component, reason, node)`; the
report is OK (exit code 0) only when there is none. With `--watch`, a rank hung (hang.py: requests
running, counters flat for hang.seconds, `/health` still 200) is not ok and is a problem of its own,
like a dead one.

Per node (`NodeStatus`), from the endpoints the plan puts on it (its ranks, its worker, etcd and the
proxy if there): `unreachable` when every one of them failed its TCP connect (refused, no connection
within the connect timeout, no route), else `fail` or `ok` by its components' problems. The report
for people starts with this per-node summary and, unless verbose (-v), shows an unreachable node as
one line in the problems and the rank table; `--json` always lists every problem with its node.

KV cache hit rates (token counts from every rank's `/metrics`; the proxy has no `/metrics`)
----------------------------------------------------------------------------------------
Per rank, the counters are summed over all their label sets (`model_name`, `engine`); `_created`
samples are ignored. Then, for a set of ranks (one rank, a role, the cluster) with sums
LH = Σ vllm:prefix_cache_hits_total,           LQ = Σ vllm:prefix_cache_queries_total,
EH = Σ vllm:external_prefix_cache_hits_total,  EQ = Σ vllm:external_prefix_cache_queries_total:

* local prefix cache hit rate  = LH / LQ   (tokens found in the rank's own HBM prefix cache)
* external hit rate            = EH / EQ   (tokens the KV connector supplied: openYuanrong pool hits
                                            and, on decode ranks, KV received from prefill)
* effective hit rate           = (LH + EH) / LQ   (share of queried prompt tokens not recomputed;
                                            vLLM counts every prompt token once in LQ)

A rate whose denominator is 0 is undefined (`null` in JSON, `-` in the table). "Since start" uses
the counters as they are (cumulative since each rank started). In `--watch` mode "last interval"
uses the difference to the previous poll; a rank whose counters went down restarted, and its current
values are taken as its interval. Ranks whose `/metrics` failed are left out of the sums (`ranks`
tells how many were counted). Caveat: in P/D disaggregation the decode ranks' external counters
count KV transferred from prefill through Mooncake (close to 100 %), not pool hits, and a decode role
with prefix caching off has LQ = 0: decode ranks and the decode role get no effective rate. The cluster row is therefore the prompt side: the sums over
every prefill rank, where every prompt is computed once; summing decode in would count each
transferred token a second time as an "external hit" and push the effective rate past 100 %.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import json
import math
import re
import socket
import sys
import time
import unicodedata
from dataclasses import asdict, astuple, dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Optional

import etcd3gw
import etcd3gw.exceptions
import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions

from . import term
from .hang import DEAD, HUNG, ONE_SHOT_NOTE, SPLIT, Activity, HangTracker, InstanceVerdict, Observation
from .logsources import pointer_blocks
from .plan import ROLES, ROLLOUT_FAILED, ROLLOUT_KEY_PREFIX, Plan, Rank
from .shell import pd_smoke

WORKER_PREFIX = "/datasystem/cluster/"  # openYuanrong workers' registrations (leased keys)
CONNECT_TIMEOUT_S = 2.0  # TCP connect: loopback/LAN answers in ms; longer means down or blackholed
REQUEST_TIMEOUT_S = 5.0  # whole request to etcd, a rank or the proxy's /healthcheck
# The smoke completion (8 tokens): a healthy cluster answers in about a second; above 10 s
# something is wrong (or the first request is compiling graphs: raise --smoke-timeout).
SMOKE_TIMEOUT_S = 10.0
SMOKE_MAX_TOKENS = 8
# Size caps of one answer, so that an endpoint cannot grow the process (Content-Length above the cap
# is refused before reading; a body without one is cut at the cap). /metrics of one engine is about
# 100 kB; every JSON answer (health, models, healthcheck, smoke, etcd's status, member list and the
# worker registrations: ~250 bytes per worker) is a few kB.
MAX_METRICS_BYTES = 4 * 1024 * 1024
MAX_BODY_BYTES = 1024 * 1024  # every other answer
# A Prometheus counter (`*_total`) is a finite count; larger than this is nonsense, and sums of such
# values would overflow to inf.
MAX_COUNTER = float(2 ** 63)
MAX_THREADS = 256
RANK_OK, RANK_FAIL, RANK_HUNG = "ok", "fail", "hung"  # RankStatus.state
NODE_OK, NODE_FAIL, UNREACHABLE = "ok", "fail", "unreachable"  # NodeStatus.state

LOCAL_HITS = "vllm:prefix_cache_hits_total"
LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"


# ---------------------------------------------------------------------------------------------
# Prometheus text format (0.0.4; OpenMetrics' `# EOF` tolerated)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:[ \t]*\{(.*)\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$")
_LABEL_NAME = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsParseError(ValueError):
    """A malformed /metrics answer (the message quotes at most 200 characters of the line)."""


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    labels, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t,":
            pos += 1
        if pos >= len(text):
            return tuple(sorted(labels))
        m = _LABEL_NAME.match(text, pos)
        if not m:
            raise MetricsParseError(f"bad labels in {line[:200]!r}")
        pos, value = m.end(), []
        while True:
            if pos >= len(text):
                raise MetricsParseError(f"unterminated label value in {line[:200]!r}")
            ch = text[pos]
            if ch == "\\" and pos + 1 < len(text):
                value.append(_ESCAPES.get(text[pos + 1], "\\" + text[pos + 1]))
                pos += 2
            elif ch == '"':
                pos += 1
                break
            else:
                value.append(ch)
                pos += 1
        labels.append((m.group(1), "".join(value)))
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] != ",":
            raise MetricsParseError(f"expected ',' between labels in {line[:200]!r}")


def parse_prometheus(text: str, *, deadline: Optional[float] = None
                     ) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted label pairs -> value}. Comments (HELP/TYPE) are skipped, `_created`
    samples (creation timestamps, not counts) are dropped; a malformed line raises MetricsParseError.
    `deadline` (time.monotonic()): raise TimeoutError when parsing is not done by then."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    # Lines end at "\n" only (the text format's rule); str.splitlines would also cut at \r, \x1c-\x1e,
    # \x85 and \u2028 inside a label value. A "\r\n" line ending is stripped below.
    for i, raw in enumerate(text.split("\n")):
        if deadline is not None and not i % 1024 and time.monotonic() > deadline:
            raise TimeoutError(f"not parsed by the deadline ({i} lines done)")
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsParseError(f"bad sample line {raw[:200]!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name.endswith("_created"):
            continue
        try:
            number = float(value)
        except ValueError:
            raise MetricsParseError(f"bad value {value[:40]!r} in {raw[:200]!r}") from None
        out.setdefault(name, {})[_parse_labels(labels or "", raw)] = number
    return out


def _format_value(v: float) -> str:
    return {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}.get(repr(v), repr(v))


def _check_counters(samples: dict[str, dict]) -> None:
    """Every counter (a `*_total` sample) must be a finite count in [0, 2**63): `+Inf`, `NaN` or a
    negative counter raises MetricsParseError naming the sample (gauges may legitimately be NaN)."""
    for name, series in samples.items():
        if not name.endswith("_total"):
            continue
        for labels, v in series.items():
            if not (math.isfinite(v) and 0 <= v < MAX_COUNTER):
                shown = ",".join(f"{k}={json.dumps(val[:60])}" for k, val in labels)[:200]
                raise MetricsParseError(f"counter {name}{{{shown}}} is {_format_value(v)}, not a count")


def metric_sum(samples: dict[str, dict], name: str) -> float:
    """Sum of a sample name over all its label sets (NaN samples skipped); 0 when absent."""
    return sum(v for v in samples.get(name, {}).values() if not math.isnan(v))


# ---------------------------------------------------------------------------------------------
# Report


MAX_TIMEOUT_S = 3600.0  # above this a "timeout" is no bound at all (and overflows socket/thread waits)


@dataclass(frozen=True)
class Timeouts:
    """connect_s: a TCP connect (within each request's deadline); request_s: the deadline of every
    request to etcd, a rank or the proxy, from connect to the last byte of the answer (its parsing
    included); smoke_s: the same for the smoke chat completion."""

    connect_s: float = CONNECT_TIMEOUT_S
    request_s: float = REQUEST_TIMEOUT_S
    smoke_s: float = SMOKE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("connect_s", "request_s", "smoke_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
                raise ValueError(f"Timeouts.{name} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], "
                                 f"not {value!r}")

    @property
    def bound_s(self) -> float:
        """What one poll may take at most: all requests run at once, each ends by its own deadline
        (plus thread scheduling, a few ms)."""
        return max(self.request_s, self.smoke_s)


@dataclass(frozen=True)
class Problem:
    component: str
    reason: str
    node: str = ""  # the node it is on ("" for the cluster or an instance): how problems fold per node

    def __str__(self) -> str:
        return f"{self.component}: {self.reason}"


@dataclass(frozen=True)
class CacheCounters:
    local_hits: float = 0.0
    local_queries: float = 0.0
    external_hits: float = 0.0
    external_queries: float = 0.0

    def __add__(self, o: "CacheCounters") -> "CacheCounters":
        return CacheCounters(*(a + b for a, b in zip(astuple(self), astuple(o))))

    def since(self, before: "CacheCounters") -> "CacheCounters":
        """Increase since `before`; a decrease means the rank restarted: count from zero."""
        if any(a < b for a, b in zip(astuple(self), astuple(before))):
            return self
        return CacheCounters(*(a - b for a, b in zip(astuple(self), astuple(before))))

    @classmethod
    def from_samples(cls, samples: dict) -> "CacheCounters":
        return cls(metric_sum(samples, LOCAL_HITS), metric_sum(samples, LOCAL_QUERIES),
                   metric_sum(samples, EXTERNAL_HITS), metric_sum(samples, EXTERNAL_QUERIES))


def _rate(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


@dataclass(frozen=True)
class HitRates:
    """Counter sums of `ranks` ranks and the rates derived from them (None: nothing queried)."""

    ranks: int
    local_hits: float
    local_queries: float
    external_hits: float
    external_queries: float
    local_rate: Optional[float]
    external_rate: Optional[float]
    effective_rate: Optional[float]

    @classmethod
    def of(cls, counters: list[CacheCounters], *, prompt_side: bool = True) -> "HitRates":
        """prompt_side=False (decode ranks): their external hits are KV transferred from prefill,
        not prompt tokens saved, so no effective rate is defined for them."""
        c = sum(counters, CacheCounters())
        return cls(
            ranks=len(counters), local_hits=c.local_hits, local_queries=c.local_queries,
            external_hits=c.external_hits, external_queries=c.external_queries,
            local_rate=_rate(c.local_hits, c.local_queries),
            external_rate=_rate(c.external_hits, c.external_queries),
            effective_rate=_rate(c.local_hits + c.external_hits, c.local_queries) if prompt_side else None,
        )


@dataclass(frozen=True)
class RequestCounters:
    """A rank's (or an instance's) requests: in flight now, and finished since start."""

    running: float = 0.0
    waiting: float = 0.0
    succeeded: float = 0.0  # finished_reason stop or length
    failed: float = 0.0  # finished_reason abort or error

    def __add__(self, o: "RequestCounters") -> "RequestCounters":
        return RequestCounters(*(a + b for a, b in zip(astuple(self), astuple(o))))

    @classmethod
    def from_samples(cls, samples: dict) -> "RequestCounters":
        c = _pd_counts(samples)
        return cls(c["running"], c["waiting"], c["served"], c["failed"])


def _pd_counts(samples: dict) -> dict:
    """A rank's counters in the form pd_smoke.judge reads, from parsed /metrics samples."""
    served = failed = 0.0
    for labels, v in samples.get("vllm:request_success_total", {}).items():
        if math.isnan(v):
            continue
        if dict(labels).get("finished_reason", "length") in pd_smoke.SERVED:
            served += v
        else:
            failed += v
    return {"running": metric_sum(samples, "vllm:num_requests_running"),
            "waiting": metric_sum(samples, "vllm:num_requests_waiting"), "served": served, "failed": failed,
            "prompt_tokens": metric_sum(samples, "vllm:prompt_tokens_total"),
            "generation_tokens": metric_sum(samples, "vllm:generation_tokens_total"),
            "external_hits": metric_sum(samples, EXTERNAL_HITS)}


@dataclass(frozen=True)
class InstanceRequests:
    instance: str  # prefill-0, decode-1
    ranks: int  # ranks whose /metrics were read
    of: int  # ranks of the instance
    requests: RequestCounters


@dataclass(frozen=True)
class HitRateTable:
    seconds: Optional[float]  # None: since each rank started; else the interval length
    ranks: dict[str, HitRates]
    roles: dict[str, HitRates]
    cluster: HitRates


@dataclass(frozen=True)
class EtcdStatus:
    endpoint: str
    ok: bool
    healthy: bool
    version: Optional[str] = None
    leader: Optional[str] = None
    members: list[dict] = field(default_factory=list)  # {name, client_urls, peer_urls}
    reason: str = ""
    reachable: bool = True  # False: neither /health nor the member list got a TCP connection


@dataclass(frozen=True)
class RolloutStatus:
    """A role's rolling restart as etcd records it (ascend_pd/shell/rollout_lib.sh): only roles
    with one under way, or stopped."""

    role: str
    restarting: list[str]  # instances holding one of the role's restart slots
    failed: Optional[str] = None  # whose restart failed: the role's waiting restarts stop


@dataclass(frozen=True)
class RolloutKey:
    """One key of a role's rolling restart in etcd (ascend_pd/shell/rollout_lib.sh): a restart slot held
    by `instance`, or the role's failure mark naming it. Both are leased (`ascend-pd exporter` reads a
    slot's age from its lease)."""

    role: str
    instance: str  # the key's value, escaped and shortened
    failed: bool  # the role's failure mark (else a restart slot)
    lease: int = 0  # the key's lease ID (0: none)


@dataclass(frozen=True)
class WorkerStatus:
    node: str
    address: str
    registered: Optional[bool]  # None: unknown (etcd unreadable)
    state: Optional[str]
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class RankStatus:
    name: str
    role: str
    instance: int
    dp_rank: int
    node: str
    url: str
    health: bool
    model_listed: bool
    models: list[str]
    metrics: bool
    counters: Optional[CacheCounters]
    ok: bool
    reason: str = ""
    requests: Optional[RequestCounters] = None
    activity: Optional[Activity] = None  # what hang detection reads (None: /metrics failed)
    state: str = RANK_OK  # ok, fail (a check failed), hung (answers /health, engine stuck: --watch)


@dataclass(frozen=True)
class NodeStatus:
    """A node of the plan, judged by the endpoints on it (its ranks, its worker, etcd and the proxy if
    there): `unreachable` when every one of them failed its TCP connect (refused, timed out, no
    route), `fail` when a component on it has a problem, else `ok`."""

    node: str
    address: str
    runs: str  # what the plan runs there: "2 ranks, worker, etcd, proxy"
    state: str
    problems: int = 0  # problems of its components (Problem.node)
    reason: str = ""  # unreachable: how its connections failed


@dataclass(frozen=True)
class ProxyStatus:
    url: str
    ok: bool
    prefill_instances: Optional[int]
    decode_instances: Optional[int]
    expected_prefill: int
    expected_decode: int
    reason: str = ""


@dataclass(frozen=True)
class SmokeStatus:
    ok: bool
    latency_s: Optional[float]
    text: str = ""
    reason: str = ""
    served_by: str = ""  # "prefill <url> and decode <url>": the ranks whose counters rose


@dataclass(frozen=True)
class StatusReport:
    stack: str
    polled_at: float  # epoch seconds when the poll started
    elapsed_s: float
    etcd: EtcdStatus
    workers: list[WorkerStatus]
    unexpected_workers: list[str]
    ranks: list[RankStatus]
    requests: list[InstanceRequests]  # requests per instance
    proxy: ProxyStatus
    smoke: Optional[SmokeStatus]  # None when skipped
    since_start: HitRateTable
    interval: Optional[HitRateTable]
    problems: list[Problem]
    instances: list[InstanceVerdict] = field(default_factory=list)
    hang_note: str = ""  # what this poll cannot know about hangs (one poll, no history)
    rollout: list[RolloutStatus] = field(default_factory=list)
    nodes: list[NodeStatus] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def workers_registered(self) -> Optional[int]:
        """Planned workers registered in etcd; None when etcd could not be read (unknown, not 0)."""
        if any(w.registered is None for w in self.workers):
            return None
        return sum(bool(w.registered) for w in self.workers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["workers_registered"] = self.workers_registered
        d["polled_at"] = datetime.fromtimestamp(self.polled_at, timezone.utc).isoformat(timespec="seconds")
        return d


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


# What must not reach a terminal raw: C0/C1 controls and DEL (ANSI escape sequences, CR, BS, BEL),
# format characters (bidi overrides, zero-width), line/paragraph separators, lone surrogates.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NOT_PLAIN_ASCII = re.compile(r"[^ -~]")


def _printable(text: str, keep: str = "") -> str:
    """`text` with every unsafe character (but those in `keep`) written as a Python escape (`\\x1b`)."""

    def escape(m: re.Match) -> str:
        ch = m.group()
        return ch if ch in keep or unicodedata.category(ch) not in _UNSAFE_CATEGORIES else ascii(ch)[1:-1]

    return _NOT_PLAIN_ASCII.sub(escape, text)


def _short(text: str, n: int = 160) -> str:
    """One line of at most n characters, control characters escaped: it is shown to people."""
    text = _printable(" ".join(text.split()))
    return text if len(text) <= n else text[: n - 3] + "..."


def _field(text: str, n: int = 80) -> str:
    """A value from an answer (a name, a URL, a state) as shown: escaped, at most n characters."""
    text = _printable(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _snippet(obj: object, n: int = 60) -> str:
    """A decoded JSON value, for a message."""
    return _short(json.dumps(obj, default=repr)[: 4 * n], n)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n and not n % (1 << 20) else f"{n}-byte"


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
          max_bytes: int = MAX_BODY_BYTES) -> tuple[int, bytes]:
    """One HTTP request, done within `total_s` (connect, request, the whole answer), its answer
    under `max_bytes`; else _Failure (or requests' connect/read timeout and connection errors)."""
    with _BoundedSession(t, total_s, max_bytes) as session:
        resp = session.request(method, url, json=body)
        return resp.status_code, resp.content


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


def _get_json(url: str, t: Timeouts) -> object:
    code, body = _http("GET", url, t, t.request_s)
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


def _rollout_statuses(keys: list[RolloutKey]) -> list[RolloutStatus]:
    """Per role with a restart under way or stopped: who holds its slots, whose restart failed."""
    held: dict[str, list[str]] = {r: [] for r in ROLES}
    failed: dict[str, str] = {}
    for k in keys:
        if k.failed:
            failed[k.role] = k.instance
        else:
            held[k.role].append(k.instance)
    return [RolloutStatus(r, sorted(held[r]), failed.get(r)) for r in ROLES if held[r] or r in failed]


def _check_rollout(plan: Plan, t: Timeouts) -> list[RolloutStatus]:
    """The restart slots and failure marks of the stack's roles (names escaped and shortened)."""
    c = _etcd_client(plan, t)
    try:
        return _rollout_statuses(_rollout_keys(plan, c))
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
    code, body = _http("GET", f"http://{r.address}:{r.port}/health", t, t.request_s)
    if code != 200:
        raise _Failure(f"/health: HTTP {code} {_short(body.decode(errors='replace'), 60)}".rstrip())


def _check_rank_models(r: Rank, t: Timeouts) -> list[str]:
    try:
        answer = _get_json(f"http://{r.address}:{r.port}/v1/models", t)
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


def _check_rank_metrics(r: Rank, t: Timeouts) -> tuple[CacheCounters, RequestCounters, Activity]:
    samples = _metrics_samples(f"http://{r.address}:{r.port}", t, t.request_s)
    return CacheCounters.from_samples(samples), RequestCounters.from_samples(samples), Activity.from_samples(samples)


def _check_proxy(plan: Plan, t: Timeouts) -> dict:
    answer = _get_json(f"{plan.proxy.url}/healthcheck", t)
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


def _smoke(plan: Plan, t: Timeouts) -> tuple[float, str, str]:
    """One chat completion that a prefill and a decode rank must both serve (pd_smoke.judge), every
    rank's /metrics read before and after it, all within the smoke's deadline."""
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
    phase = min(t.request_s, t.smoke_s / 4)  # each round of /metrics; the completion gets the rest
    before = _pd_snapshot(urls, t, started + phase)
    t0 = time.monotonic()
    budget = max(deadline - phase - t0, 0.001)
    ts = replace(t, request_s=budget)
    try:
        code, raw = _http("POST", f"{plan.proxy.url}/v1/chat/completions", ts, budget, body)
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


def _etcd_verdict(plan: Plan, results: dict) -> EtcdStatus:
    (h_ok, h_val), (m_ok, m_val) = results[("etcd", "health")], results[("etcd", "members")]
    reasons = []
    if not h_ok:
        reasons.append(f"/health: {h_val}")
    if not m_ok and m_val != h_val:  # the same connection failure is said once
        reasons.append(f"members: {m_val}")
    version, leader, members = m_val if m_ok else (None, None, [])
    if m_ok and not members:
        reasons.append("no members")
    if m_ok and not leader:
        reasons.append("no leader")
    return EtcdStatus(endpoint=plan.etcd.endpoint, ok=not reasons, healthy=h_ok, version=version,
                      leader=leader or None, members=members, reason="; ".join(reasons),
                      reachable=not (_unreachable((h_ok, h_val)) and _unreachable((m_ok, m_val))))


def _unknown_registrations(plan: Plan, results: dict) -> tuple[list[WorkerStatus], list[str], list[Problem]]:
    """etcd unreadable: no registration is known (None, not False); a worker's own port still tells
    whether it runs. (heal reads the reason's prefix: it restarts no worker on an unknown registration.)"""
    w_ok, w_val = results[("etcd", "workers")]
    reason = f"registrations unknown: etcd {plan.etcd.endpoint} unreadable ({w_val})"
    # On etcd's node when etcd took no connection: folded with that node when all of it is down.
    problems = [Problem("openYuanrong workers", reason, plan.etcd.node if _unreachable((w_ok, w_val)) else "")]
    workers = []
    for w in plan.workers:
        port_ok, port_why = results[("worker", w.address)]
        why = reason if port_ok else f"{reason}; its port: {port_why}"
        workers.append(WorkerStatus(w.node, w.address, None, None, False, why))
        if not port_ok:
            problems.append(Problem(f"worker {w.node} {w.address}", f"registration unknown; its port: {port_why}",
                                    w.node))
    return workers, [], problems


def _worker_verdicts(plan: Plan, results: dict) -> tuple[list[WorkerStatus], list[str], list[Problem]]:
    w_ok, w_val = results[("etcd", "workers")]
    endpoint = plan.etcd.endpoint
    if not w_ok:
        return _unknown_registrations(plan, results)
    registered: dict[str, str] = w_val
    workers, problems = [], []
    for w in plan.workers:
        state = registered.get(w.address)
        port_ok, port_why = results[("worker", w.address)]
        if state is None:
            ws = WorkerStatus(w.node, w.address, False, None, False,
                              f"not registered under {WORKER_PREFIX} in etcd {endpoint}")
        elif state != "ready":
            ws = WorkerStatus(w.node, w.address, True, state, False, f"registered in state {state!r}, not 'ready'")
        elif not port_ok:
            # The registration is leased: a killed worker stays registered for up to nodeTimeoutS.
            ws = WorkerStatus(w.node, w.address, True, state, False, f"registered, but its port: {port_why}")
        else:
            ws = WorkerStatus(w.node, w.address, True, state, True)
        workers.append(ws)
        if not ws.ok:
            problems.append(Problem(f"worker {w.node} {w.address}", ws.reason, w.node))
    planned = {w.address for w in plan.workers}
    return workers, sorted(a for a in registered if a not in planned), problems


def _rank_verdict(plan: Plan, r: Rank, results: dict) -> RankStatus:
    (hok, hv), (mok, mv), (xok, xv) = (results[("rank", r.name, k)] for k in ("health", "models", "metrics"))
    why: list[str] = []
    for ok, val in ((hok, hv), (mok, mv), (xok, xv)):
        if not ok and val not in why:  # a dead rank fails all three the same way: say it once
            why.append(val)
    served = plan.cfg.model.served_name
    models = list(mv) if mok else []
    listed = mok and served in models
    if mok and not listed:
        why.append(f"/v1/models lists {models}, not {served!r}")
    return RankStatus(name=r.name, role=r.role, instance=r.instance, dp_rank=r.dp_rank, node=r.node,
                      url=f"http://{r.address}:{r.port}", health=hok, model_listed=listed, models=models,
                      metrics=xok, counters=xv[0] if xok else None, ok=not why, reason="; ".join(why),
                      requests=xv[1] if xok else None, activity=xv[2] if xok else None,
                      state=RANK_FAIL if why else RANK_OK)


RANK_CHECKS = ("health", "models", "metrics")


def _node_endpoints(plan: Plan, node: str) -> list[tuple[str, list[tuple]]]:
    """(kind, the poll's job keys) of every endpoint the plan puts on `node`."""
    eps = [("rank", [("rank", r.name, k) for k in RANK_CHECKS]) for r in plan.ranks if r.node == node]
    eps += [("worker", [("worker", w.address)]) for w in plan.workers if w.node == node]
    if plan.etcd.node == node:
        eps.append(("etcd", [("etcd", "health"), ("etcd", "members")]))
    if plan.proxy.node == node:
        eps.append(("proxy", [("proxy", "healthcheck")]))
    return eps


def _runs(kinds: list[str]) -> str:
    """"2 ranks, worker, etcd, proxy" from the kinds of a node's endpoints."""
    n = kinds.count("rank")
    return ", ".join(([f"{n} rank{'' if n == 1 else 's'}"] if n else []) + [k for k in kinds if k != "rank"])


def _node_verdicts(plan: Plan, results: dict, problems: list[Problem]) -> list[NodeStatus]:
    out = []
    for n in plan.nodes:
        eps = _node_endpoints(plan, n.name)
        keys = [k for _, ks in eps for k in ks]
        runs, count = _runs([kind for kind, _ in eps]), sum(p.node == n.name for p in problems)
        if keys and all(_unreachable(results[k]) for k in keys):
            how = "; ".join(dict.fromkeys(results[k][1] for k in keys))  # each distinct reason once
            out.append(NodeStatus(n.name, n.address, runs, UNREACHABLE, count, how))
        else:
            out.append(NodeStatus(n.name, n.address, runs, NODE_FAIL if count else NODE_OK, count))
    return out


def _instance_requests(plan: Plan, ranks: list[RankStatus]) -> list[InstanceRequests]:
    out = []
    for inst in plan.instances:
        mine = [rs for rs in ranks if rs.role == inst.role and rs.instance == inst.index]
        read = [rs.requests for rs in mine if rs.requests is not None]
        out.append(InstanceRequests(inst.name, len(read), len(mine),
                                    sum(read, RequestCounters())))
    return out


def _proxy_verdict(plan: Plan, results: dict) -> ProxyStatus:
    p = plan.proxy
    exp_p, exp_d = len(p.prefillers), len(p.decoders)
    ok, answer = results[("proxy", "healthcheck")]
    if not ok:
        return ProxyStatus(p.url, False, None, None, exp_p, exp_d, f"/healthcheck: {answer}")
    n_p, n_d = answer.get("prefill_instances"), answer.get("decode_instances")
    why = []
    if answer.get("status", "ok") != "ok":
        why.append(f"status {answer.get('status')!r}")
    if (n_p, n_d) != (exp_p, exp_d):
        why.append(f"/healthcheck reports {n_p} prefill and {n_d} decode instances, "
                   f"the plan has {exp_p} and {exp_d}")
    return ProxyStatus(p.url, not why, n_p, n_d, exp_p, exp_d, "; ".join(why))


def collect_status(
    plan: Plan,
    *,
    timeouts: Timeouts = Timeouts(),
    previous: Optional[StatusReport] = None,
    smoke: bool = True,
    progress: Optional[Callable[[int, int], None]] = None,
    tracker: Optional[HangTracker] = None,
) -> StatusReport:
    """Poll everything the plan expects, concurrently, and return the report.

    `previous` (an earlier report of the same plan) adds hit rates over the interval between them;
    `progress(done, total)` is called as requests finish (for a progress indicator); `tracker` keeps
    the ranks' counters across polls (hang detection; without one, this poll is judged alone)."""
    t = timeouts
    started, t0 = time.time(), time.monotonic()
    jobs: dict[tuple, Callable[[], object]] = {
        ("etcd", "health"): lambda: _check_etcd_health(plan, t),
        ("etcd", "members"): lambda: _check_etcd_members(plan, t),
        ("etcd", "workers"): lambda: _check_registrations(plan, t),
        ("etcd", "rollout"): lambda: _check_rollout(plan, t),
        ("proxy", "healthcheck"): lambda: _check_proxy(plan, t),
    }
    if smoke:
        jobs[("proxy", "smoke")] = lambda: _smoke(plan, t)
    for w in plan.workers:
        jobs[("worker", w.address)] = lambda w=w: _check_tcp(w.address, t)
    for r in plan.ranks:
        jobs[("rank", r.name, "health")] = lambda r=r: _check_rank_health(r, t)
        jobs[("rank", r.name, "models")] = lambda r=r: _check_rank_models(r, t)
        jobs[("rank", r.name, "metrics")] = lambda r=r: _check_rank_metrics(r, t)
    results = _poll(jobs, t, progress)

    problems: list[Problem] = []
    etcd_status = _etcd_verdict(plan, results)
    if not etcd_status.ok:
        problems.append(Problem(f"etcd {etcd_status.endpoint}", etcd_status.reason, plan.etcd.node))
    workers, unexpected, worker_problems = _worker_verdicts(plan, results)
    problems += worker_problems
    ranks = [_rank_verdict(plan, r, results) for r in plan.ranks]
    instances, hang_note = _instance_verdicts(plan, ranks, started, tracker)
    ranks = _mark_hung(ranks, instances)
    problems += [Problem(_rank_component(r), rs.reason, r.node) for r, rs in zip(plan.ranks, ranks) if not rs.ok]
    for v in instances:
        if v.state == SPLIT:  # dead and hung ranks are problems of their own already, with node and address
            problems.append(Problem(f"instance {v.instance}", f"broken ({v.state}): " + "; ".join(v.evidence)))
    r_ok, r_val = results[("etcd", "rollout")]
    rollout = r_val if r_ok else []  # etcd unreadable: its own row says so
    for ro in rollout:
        if ro.failed:
            problems.append(Problem(f"{ro.role} rollout", f"stopped: the restart of {ro.failed} failed; the role's "
                                    f"other restarts wait until it serves again (fix it, then pulumi up)"))
    proxy_status = _proxy_verdict(plan, results)
    if not proxy_status.ok:
        problems.append(Problem(f"proxy {plan.proxy.url}", proxy_status.reason, plan.proxy.node))
    smoke_status = None
    if smoke:
        sok, sv = results[("proxy", "smoke")]
        smoke_status = (SmokeStatus(True, round(sv[0], 4), sv[1], served_by=sv[2]) if sok
                        else SmokeStatus(False, None, "", sv))
        if not sok:
            # On the proxy's node only when the proxy took no connection; else the P/D path failed.
            where = plan.proxy.node if _unreachable((sok, sv)) else ""
            problems.append(Problem(f"smoke chat completion via {plan.proxy.url}", sv, where))

    since_start = _table(plan, {rs.name: rs.counters for rs in ranks if rs.counters is not None}, None)
    interval = None
    if previous is not None:
        before = {rs.name: rs.counters for rs in previous.ranks if rs.counters is not None}
        deltas = {rs.name: rs.counters.since(before[rs.name])
                  for rs in ranks if rs.counters is not None and rs.name in before}
        interval = _table(plan, deltas, round(started - previous.polled_at, 3))
    return StatusReport(
        stack=plan.stack, polled_at=started, elapsed_s=round(time.monotonic() - t0, 3), etcd=etcd_status,
        workers=workers, unexpected_workers=unexpected, ranks=ranks,
        requests=_instance_requests(plan, ranks), proxy=proxy_status,
        smoke=smoke_status, since_start=since_start, interval=interval, problems=problems,
        instances=instances, hang_note=hang_note, rollout=rollout, nodes=_node_verdicts(plan, results, problems),
    )


def hang_tracker(plan: Plan) -> HangTracker:
    """A tracker with the stack's hang.seconds; a DP group forms within vllm.readyTimeoutS."""
    return HangTracker(plan.cfg.hang.seconds, plan.cfg.vllm.ready_timeout_s)


def _mark_hung(ranks: list[RankStatus], instances: list[InstanceVerdict]) -> list[RankStatus]:
    """A hung rank still answers /health (vLLM's API server does while its engine core is stuck), so
    its checks passed: it is marked hung here, so that the rank table, the count of healthy ranks, the
    problems and the JSON all say so."""
    hung = {rv.rank: rv.evidence for v in instances for rv in v.ranks if rv.state == HUNG}
    out = []
    for rs in ranks:
        if rs.name in hung:
            why = hung[rs.name].removeprefix(f"{rs.name} ")  # the rank is named by the problem's component
            rs = replace(rs, ok=False, state=RANK_HUNG, reason="; ".join(filter(None, [why, rs.reason])))
        out.append(rs)
    return out


def _instance_verdicts(plan: Plan, ranks: list[RankStatus], now: float, tracker: Optional[HangTracker]
                       ) -> tuple[list[InstanceVerdict], str]:
    one_shot = tracker is None
    tracker = tracker or hang_tracker(plan)
    by_name = {rs.name: rs for rs in ranks}
    obs = [Observation(r.name, inst.name, by_name[r.name].health,
                       by_name[r.name].reason if not by_name[r.name].health else "", by_name[r.name].activity)
           for inst in plan.instances for r in inst.ranks]
    verdicts = tracker.observe(obs, now)
    return verdicts, ONE_SHOT_NOTE if one_shot or tracker.polls < 2 else ""


def _table(plan: Plan, counters: dict[str, CacheCounters], seconds: Optional[float]) -> HitRateTable:
    per_rank = {r.name: HitRates.of([counters[r.name]], prompt_side=r.role == "prefill")
                for r in plan.ranks if r.name in counters}
    roles = {role: HitRates.of([counters[r.name] for r in plan.ranks_of(role) if r.name in counters],
                               prompt_side=role == "prefill")
             for role in ROLES}
    # Prompts are computed on prefill ranks only; see the module docstring.
    cluster = HitRates.of([counters[r.name] for r in plan.ranks_of("prefill") if r.name in counters])
    return HitRateTable(seconds=seconds, ranks=per_rank, roles=roles, cluster=cluster)


# ---------------------------------------------------------------------------------------------
# Output


def _pct(rate: Optional[float]) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


def _ratio(rate: Optional[float], hits: float, queries: float) -> str:
    return f"{_pct(rate)} ({_num(hits)}/{_num(queries)})"


# State words whose colour carries meaning on a terminal: term's and status's own.
STYLES = {**term.STATE_STYLES, "UNREACHABLE": "bold red", "HUNG": "bold red", "UNKNOWN": "yellow"}
MAX_SHOWN_EVIDENCE = 3  # an instance's reasons in its table row without -v (a dead 32-rank group has 32)


def format_table(plan: Plan, rep: StatusReport, *, verbose: bool = False) -> str:
    """The report for people, as plain text."""
    return term.plain(report_blocks(plan, rep, verbose=verbose)) + "\n"


def report_blocks(plan: Plan, rep: StatusReport, *, verbose: bool = False) -> list[term.Block]:
    """The report for people: lines and tables (drawn by rich on a terminal, plain otherwise), the
    per-node summary first. Without `verbose` an unreachable node is one line, in the problems and in
    the rank table, instead of one per rank, worker, etcd and proxy on it (--json and -v list them all),
    and tables with nothing read in them are left out."""
    down = {n.node: n for n in rep.nodes if n.state == UNREACHABLE}
    shown = rep.problems if verbose else _folded_problems(rep, down)
    out: list[term.Block] = [_headline(rep, shown), ""]
    out += _node_blocks(rep)
    out += ["", _component_table(plan, rep)]
    out += _rollout_lines(rep)
    out += _instance_blocks(rep, down, verbose)
    if verbose or any(r.metrics for r in rep.ranks):
        out += _requests_blocks(rep)
        out += _rates_blocks(rep, {} if verbose else down)
    else:
        out += ["", "Requests per instance and KV cache hit rates: no rank's /metrics could be read "
                "(-v shows the empty tables)"]
    return out + pointer_blocks(plan, rep) + _problem_blocks(rep, shown)  # pointer: `ascend-pd logs` of what is broken


def _folded_problems(rep: StatusReport, down: dict[str, NodeStatus]) -> list[Problem]:
    """The problems as listed for people: one line per unreachable node, first, for all the problems
    of what runs on it; the others as they are. A node with a single problem keeps it (one line
    either way, and the original says more)."""
    fold = {name: n for name, n in down.items() if n.problems > 1}
    lines = [Problem(f"{n.node} {n.address}", f"unreachable ({n.runs}): {n.reason}", n.node) for n in fold.values()]
    return lines + [p for p in rep.problems if p.node not in fold]


def _headline(rep: StatusReport, shown: list[Problem]) -> str:
    when = datetime.fromtimestamp(rep.polled_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    verdict = "OK" if rep.ok else f"{len(shown)} PROBLEM(S)"
    if len(shown) < len(rep.problems):
        verdict += f" ({len(rep.problems)} with -v: one per component)"
    return f"ascend-pd status  stack {rep.stack}  {when}  polled in {rep.elapsed_s:.2f}s: {verdict}"


def _state_cell(state: str) -> str:
    return state if state == "ok" else state.upper()


def _node_blocks(rep: StatusReport) -> list[term.Block]:
    def detail(n: NodeStatus) -> str:
        if n.state == UNREACHABLE:
            return f"{n.runs}: {n.reason}"
        return f"{n.runs}: {n.problems} problem(s) below" if n.problems else n.runs

    rows = [(n.node, n.address, _state_cell(n.state), detail(n)) for n in rep.nodes]
    return ["NODES (unreachable: none of the endpoints on it took a TCP connection)",
            term.Table(("NODE", "ADDRESS", "STATE", "DETAIL"), rows, styles=STYLES)]


def _workers_row(rep: StatusReport) -> tuple[str, str, str]:
    bad = [w for w in rep.workers if not w.ok]
    n_reg = rep.workers_registered
    if n_reg is None:  # etcd could not be read: nothing is known about the registrations, not "0 registered"
        down = [w for w in rep.workers if "; its port: " in w.reason]
        detail = f"unknown (etcd {'unreadable' if rep.etcd.reachable else 'unreachable'})" + (
            f"; {len(down)}/{len(rep.workers)} not answering on their port" if down else "")
        state = "UNKNOWN"
    else:
        detail = f"{n_reg}/{len(rep.workers)} registered" + (
            "" if not bad else ", missing/unhealthy: " + ", ".join(f"{w.node} {w.address}" for w in bad))
        state = "ok" if not bad else "FAIL"
    if rep.unexpected_workers:
        detail += "; not in the plan: " + ", ".join(rep.unexpected_workers)
    return "openYuanrong workers", state, detail


def _ranks_row(plan: Plan, rep: StatusReport) -> tuple[str, str, str]:
    n_ok = sum(r.ok for r in rep.ranks)
    n_hung = sum(r.state == RANK_HUNG for r in rep.ranks)
    detail = f"{n_ok}/{len(rep.ranks)} healthy" + (f", {n_hung} hung" if n_hung else "")
    if n_ok:  # nothing serves while no rank is healthy
        detail += f", serving {plan.cfg.model.served_name!r}"
    return "vLLM ranks", "ok" if n_ok == len(rep.ranks) else "FAIL", detail


def _component_table(plan: Plan, rep: StatusReport) -> term.Table:
    e = rep.etcd
    if e.ok:
        names = ", ".join(m["name"] for m in e.members)
        etcd_detail = f"healthy, v{e.version}, {len(e.members)} member(s) [{names}], leader {e.leader}"
    else:
        etcd_detail = e.reason
    px = rep.proxy
    proxy_detail = (f"{px.prefill_instances}/{px.expected_prefill} prefill, "
                    f"{px.decode_instances}/{px.expected_decode} decode instances") if px.ok else px.reason
    rows = [(f"etcd {e.endpoint}", "ok" if e.ok else "FAIL", etcd_detail), _workers_row(rep),
            (f"proxy {px.url}", "ok" if px.ok else "FAIL", proxy_detail)]
    if rep.smoke is not None:
        s = rep.smoke
        rows.append(("smoke chat completion", "ok" if s.ok else "FAIL",
                     f"{s.latency_s:.2f}s via {s.served_by}: {s.text!r}" if s.ok else s.reason))
    rows.append(_ranks_row(plan, rep))
    return term.Table(("COMPONENT", "STATE", "DETAIL"), rows, styles=STYLES)


def _rollout_lines(rep: StatusReport) -> list[term.Block]:
    return [f"rollout of {ro.role}: " + "; ".join(
        ([f"restarting {', '.join(ro.restarting)} (restart slot held)"] if ro.restarting else [])
        + ([f"STOPPED: the restart of {ro.failed} failed"] if ro.failed else [])) for ro in rep.rollout]


def _instance_detail(v: InstanceVerdict, node_of: dict[str, str], down: dict[str, NodeStatus], verbose: bool) -> str:
    """An instance's evidence; without `verbose`, its dead ranks on unreachable nodes as one item and
    at most MAX_SHOWN_EVIDENCE items."""
    if not v.evidence:
        busy = sum(r.state == "busy" for r in v.ranks)
        return f"{len(v.ranks)} rank(s) healthy" + (f", {busy} busy" if busy else "")
    if verbose:
        return "; ".join(v.evidence)
    gone = [rv for rv in v.ranks if rv.state == DEAD and node_of.get(rv.rank) in down]
    nodes = ", ".join(dict.fromkeys(node_of[rv.rank] for rv in gone))
    folded = {rv.evidence for rv in gone}
    items = ([f"{len(gone)} rank(s) dead: on unreachable node(s) {nodes}"] if gone else []) + [
        e for e in v.evidence if e not in folded]
    if len(items) > MAX_SHOWN_EVIDENCE:
        items = items[:MAX_SHOWN_EVIDENCE] + [f"and {len(items) - MAX_SHOWN_EVIDENCE} more (-v)"]
    return "; ".join(items)


def _instance_blocks(rep: StatusReport, down: dict[str, NodeStatus], verbose: bool) -> list[term.Block]:
    if not rep.instances:
        return []
    node_of = {r.name: r.node for r in rep.ranks}
    rows = [(v.instance, _state_cell(v.state), _instance_detail(v, node_of, down, verbose)) for v in rep.instances]
    out: list[term.Block] = ["", "INSTANCES (broken = a rank dead or hung, or ranks not in one DP group)",
                             term.Table(("INSTANCE", "STATE", "EVIDENCE"), rows, styles=STYLES)]
    if rep.hang_note:
        out.append("note: " + rep.hang_note)
    return out


def _requests_blocks(rep: StatusReport) -> list[term.Block]:
    rows = [(ir.instance, f"{ir.ranks}/{ir.of}", _num(ir.requests.running), _num(ir.requests.waiting),
             _num(ir.requests.succeeded), _num(ir.requests.failed)) for ir in rep.requests]
    return ["", "Requests per instance: in flight now, finished since each rank started "
            "(succeeded: stop/length; failed: abort/error)",
            term.Table(("INSTANCE", "RANKS READ", "RUNNING", "WAITING", "SUCCEEDED", "FAILED"), rows)]


def _rate_cells(h: Optional[HitRates], hi: Optional[HitRates], interval: bool) -> list[str]:
    cells = (["-", "-", "-"] if h is None else
             [_ratio(h.local_rate, h.local_hits, h.local_queries),
              _ratio(h.external_rate, h.external_hits, h.external_queries), _pct(h.effective_rate)])
    if interval:
        cells += (["-", "-", "-"] if hi is None
                  else [_pct(hi.local_rate), _pct(hi.external_rate), _pct(hi.effective_rate)])
    return cells


def _rank_span(ranks: list[RankStatus]) -> str:
    """The ranks of one node as one name: decode-0-r8..r15 (a node serves one instance)."""
    first, last = ranks[0], ranks[-1]
    if len(ranks) == 1:
        return first.name
    if all((r.role, r.instance) == (first.role, first.instance) for r in ranks):
        return f"{first.name}..r{last.dp_rank}"
    return f"{len(ranks)} ranks"


def _rank_rows(rep: StatusReport, down: dict[str, NodeStatus]) -> list[tuple[str, ...]]:
    """A row per rank; the ranks of an unreachable node in `down` as one row."""
    iv = rep.interval
    rows, said = [], set()
    for r in rep.ranks:
        if r.node in down:
            if r.node not in said:
                said.add(r.node)
                mine = [x for x in rep.ranks if x.node == r.node]
                rows.append((_rank_span(mine), r.node, down[r.node].address, "UNREACHABLE",
                             *_rate_cells(None, None, iv is not None)))
            continue
        rows.append((r.name, r.node, r.url.removeprefix("http://"), _state_cell(r.state),
                     *_rate_cells(rep.since_start.ranks.get(r.name), iv.ranks.get(r.name) if iv else None,
                                  iv is not None)))
    return rows


def _rates_blocks(rep: StatusReport, down: dict[str, NodeStatus]) -> list[term.Block]:
    iv = rep.interval
    head = ["RANK", "NODE", "ENDPOINT", "STATE", "LOCAL PREFIX HIT", "EXTERNAL HIT", "EFFECTIVE"]
    if iv is not None:
        head += [f"LOCAL {iv.seconds:.0f}s", f"EXT {iv.seconds:.0f}s", f"EFF {iv.seconds:.0f}s"]
    rows = _rank_rows(rep, down)
    for role in ROLES:
        h = rep.since_start.roles[role]
        n = len([r for r in rep.ranks if r.role == role])
        rows.append((f"role {role}", "", f"{h.ranks}/{n} ranks counted", "",
                     *_rate_cells(h, iv.roles[role] if iv else None, iv is not None)))
    c = rep.since_start.cluster
    n_prefill = len([r for r in rep.ranks if r.role == "prefill"])
    rows.append(("cluster", "", f"{c.ranks}/{n_prefill} prefill ranks", "",
                 *_rate_cells(c, iv.cluster if iv else None, iv is not None)))
    return ["", "KV cache hit rates since start" + (f" and over the last {iv.seconds:.1f}s" if iv else "")
            + " (hits/queries in tokens; effective = (local + external hits) / local queries)",
            term.Table(tuple(head), rows, styles=STYLES),
            "note: cluster = the prompt side (prefill ranks); decode 'external' hits are KV received "
            "from prefill through Mooncake, not openYuanrong pool hits"]


def _problem_blocks(rep: StatusReport, shown: list[Problem]) -> list[term.Block]:
    if not rep.problems:
        return []
    out = ["", f"PROBLEMS ({len(shown)})"] + [f"  {p}" for p in shown]
    if len(shown) < len(rep.problems):
        out.append(f"note: an unreachable node is one line for the problems of everything on it; -v or --json "
                   f"lists all {len(rep.problems)}")
    return out


def _finite(obj: object) -> object:
    """JSON has no NaN or Infinity: a non-finite float becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _to_json(rep: StatusReport, indent: Optional[int] = 2) -> str:
    """The report as strict JSON (no NaN/Infinity; ASCII only, so no control character is written raw)."""
    return json.dumps(_finite(rep.to_dict()), indent=indent, allow_nan=False, ensure_ascii=True)


def _for_terminal(text: str) -> str:
    """Text for a terminal: every control character but the newline escaped (`\\x1b`), whatever an
    endpoint put into the report."""
    return _printable(text, keep="\n")


def _safe_blocks(blocks: list[term.Block]) -> list[term.Block]:
    """Every line and cell with its control characters escaped, as `_for_terminal` does for text."""
    return [term.Table(b.head, [tuple(_printable(c) for c in row) for row in b.rows], b.title, b.styles)
            if isinstance(b, term.Table) else _for_terminal(b) for b in blocks]


def run(plan: Plan, *, as_json: bool = False, watch: Optional[float] = None, count: Optional[int] = None,
        timeouts: Timeouts = Timeouts(), smoke: bool = True, verbose: bool = False, out=None, err=None) -> int:
    """The `status` command: one poll (or one every `watch` seconds, `count` times or until ^C).
    `verbose` (-v): the tables list every component of an unreachable node and every problem one by
    one (--json always does). Returns the exit code of the last poll: 0 all healthy, 1 something
    missing or unhealthy."""
    out = out or sys.stdout
    err = err or sys.stderr
    previous: Optional[StatusReport] = None
    code, polls = 1, 0
    tracker = hang_tracker(plan) if watch else None  # one poll has no history: it says so
    try:
        while True:
            with term.progress("polling", err) as progress:
                rep = collect_status(plan, timeouts=timeouts, previous=previous, smoke=smoke, progress=progress,
                                     tracker=tracker)
            if as_json:
                out.write(_to_json(rep, indent=None if watch else 2) + "\n")
            elif term.is_terminal(out):
                if watch and polls:
                    out.write("\033[H\033[2J")
                term.write(_safe_blocks(report_blocks(plan, rep, verbose=verbose)), out)
            else:
                if watch and polls:
                    out.write("\n")
                out.write(_for_terminal(format_table(plan, rep, verbose=verbose)))
            if verbose and not as_json:  # the last lines of the broken ranks' logs, within the same deadline
                from .logs import status_tails

                out.write(_for_terminal(status_tails(plan, rep, timeouts.request_s)))
            out.flush()
            code, polls, previous = rep.exit_code, polls + 1, rep
            if not watch or (count is not None and polls >= count):
                return code
            time.sleep(max(0.0, watch - (time.time() - rep.polled_at)))
    except KeyboardInterrupt:
        return code


__all__ = [
    "collect_status", "run", "hang_tracker", "format_table", "parse_prometheus", "metric_sum", "Timeouts", "StatusReport",
    "Problem", "CacheCounters", "HitRates", "HitRateTable", "EtcdStatus", "WorkerStatus", "RankStatus", "NodeStatus",
    "ProxyStatus", "SmokeStatus", "MetricsParseError",
]
