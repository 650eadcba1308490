"""Vocabulary and the report's data: timeouts, problems, counters, hit rates, per-component statuses."""

from __future__ import annotations

import math
from dataclasses import asdict, astuple, dataclass, field
from datetime import datetime, timezone
from typing import Optional

from ..hang import Activity, InstanceVerdict
from ..shell import pd_smoke
from .metrics import metric_sum


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
MAX_THREADS = 256
RANK_OK, RANK_FAIL, RANK_HUNG = "ok", "fail", "hung"  # RankStatus.state
NODE_OK, NODE_FAIL, UNREACHABLE = "ok", "fail", "unreachable"  # NodeStatus.state

LOCAL_HITS = "vllm:prefix_cache_hits_total"
LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"


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
    spares: list[str] = field(default_factory=list)  # nodes of no role (Plan.spares)

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
