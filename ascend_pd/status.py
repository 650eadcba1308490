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
  (`content`, `reasoning` or `reasoning_content`), with its latency.

Everything expected that is missing or unhealthy becomes a `Problem(component, reason)`; the report
is OK (exit code 0) only when there is none.

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
import json
import math
import re
import socket
import sys
import time
from dataclasses import asdict, astuple, dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Optional

import etcd3gw
import etcd3gw.exceptions
import requests

from .plan import ROLES, Plan, Rank

WORKER_PREFIX = "/datasystem/cluster/"  # openYuanrong workers' registrations (leased keys)
CONNECT_TIMEOUT_S = 2.0  # TCP connect: loopback/LAN answers in ms; longer means down or blackholed
REQUEST_TIMEOUT_S = 5.0  # whole request to etcd, a rank or the proxy's /healthcheck
# The smoke completion (8 tokens): a healthy cluster answers in about a second; above 10 s
# something is wrong (or the first request is compiling graphs: raise --smoke-timeout).
SMOKE_TIMEOUT_S = 10.0
SMOKE_MAX_TOKENS = 8
MAX_BODY_BYTES = 16 * 1024 * 1024  # /metrics of a big engine is ~100 kB; refuse runaway bodies
MAX_THREADS = 256

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
    pass


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    labels, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t,":
            pos += 1
        if pos >= len(text):
            return tuple(sorted(labels))
        m = _LABEL_NAME.match(text, pos)
        if not m:
            raise MetricsParseError(f"bad labels in {line!r}")
        pos, value = m.end(), []
        while True:
            if pos >= len(text):
                raise MetricsParseError(f"unterminated label value in {line!r}")
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
            raise MetricsParseError(f"expected ',' between labels in {line!r}")


def parse_prometheus(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted label pairs -> value}. Comments (HELP/TYPE) are skipped, `_created`
    samples (creation timestamps, not counts) are dropped; a malformed line raises MetricsParseError."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsParseError(f"bad sample line {raw!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name.endswith("_created"):
            continue
        try:
            number = float(value)
        except ValueError:
            raise MetricsParseError(f"bad value {value!r} in {raw!r}") from None
        out.setdefault(name, {})[_parse_labels(labels or "", raw)] = number
    return out


def metric_sum(samples: dict[str, dict], name: str) -> float:
    """Sum of a sample name over all its label sets (NaN samples skipped); 0 when absent."""
    return sum(v for v in samples.get(name, {}).values() if not math.isnan(v))


# ---------------------------------------------------------------------------------------------
# Report


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = CONNECT_TIMEOUT_S
    request_s: float = REQUEST_TIMEOUT_S
    smoke_s: float = SMOKE_TIMEOUT_S

    @property
    def bound_s(self) -> float:
        """What one poll may take at most (plus thread and parsing overhead)."""
        return max(self.request_s, self.smoke_s) + self.connect_s


@dataclass(frozen=True)
class Problem:
    component: str
    reason: str

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


@dataclass(frozen=True)
class WorkerStatus:
    node: str
    address: str
    registered: bool
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


@dataclass(frozen=True)
class StatusReport:
    stack: str
    polled_at: float  # epoch seconds when the poll started
    elapsed_s: float
    etcd: EtcdStatus
    workers: list[WorkerStatus]
    unexpected_workers: list[str]
    ranks: list[RankStatus]
    proxy: ProxyStatus
    smoke: Optional[SmokeStatus]  # None when skipped
    since_start: HitRateTable
    interval: Optional[HitRateTable]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["polled_at"] = datetime.fromtimestamp(self.polled_at, timezone.utc).isoformat(timespec="seconds")
        return d


# ---------------------------------------------------------------------------------------------
# Polling


class _Failure(Exception):
    """A check failed; the message is the reason shown to the operator."""


def _connection_reason(text: str, t: Timeouts) -> str:
    if "Connection refused" in text:
        return "connection refused (nothing listening)"
    if "connect timeout" in text or "ConnectTimeout" in text:
        return f"no TCP connection within {t.connect_s:g}s (node down or blackholed)"
    if "Read timed out" in text:
        return f"no answer within {t.request_s:g}s"
    if "No route to host" in text or "unreachable" in text:
        return "no route to host"
    return "connection failed: " + _short(text)


def _why(exc: BaseException, t: Timeouts) -> str:
    """The operator-facing reason of a failed check."""
    if isinstance(exc, _Failure):
        return str(exc)
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"no TCP connection within {t.connect_s:g}s (node down or blackholed)"
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


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _http(method: str, url: str, t: Timeouts, total_s: float, body: Optional[dict] = None
          ) -> tuple[int, bytes]:
    """One HTTP request bounded by connect timeout + `total_s` for the whole answer."""
    deadline = time.monotonic() + total_s
    with requests.Session() as session:
        # Cluster addresses are reached directly: an operator's HTTP(S)_PROXY would capture them.
        session.trust_env = False
        return _read(session.request(method, url, json=body, stream=True, timeout=(t.connect_s, total_s),
                                     headers={"Connection": "close"}), deadline, total_s)


def _read(resp: requests.Response, deadline: float, total_s: float) -> tuple[int, bytes]:
    with resp:
        chunks, size = [], 0
        for chunk in resp.iter_content(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _Failure(f"answer larger than {MAX_BODY_BYTES} bytes")
            if time.monotonic() > deadline:
                raise _Failure(f"answer not complete within {total_s:g}s")
        return resp.status_code, b"".join(chunks)


def _get_json(url: str, t: Timeouts) -> object:
    code, body = _http("GET", url, t, t.request_s)
    if code != 200:
        raise _Failure(f"HTTP {code} {_short(body.decode(errors='replace'), 80)}".rstrip())
    try:
        return json.loads(body)
    except ValueError:
        raise _Failure(f"not JSON: {_short(body.decode(errors='replace'), 80)!r}") from None


def _etcd_client(plan: Plan, t: Timeouts):
    c = etcd3gw.client(host=plan.etcd.address, port=plan.etcd.client_port,
                       timeout=(t.connect_s, t.request_s))
    c.session.trust_env = False  # no HTTP proxy between the operator and etcd
    return c


def _check_etcd_health(plan: Plan, t: Timeouts) -> dict:
    health = _get_json(f"{plan.etcd.client_url}/health", t)
    if not isinstance(health, dict) or str(health.get("health")).lower() != "true":
        raise _Failure(f"/health says {json.dumps(health)[:120]}")
    return health


def _check_etcd_members(plan: Plan, t: Timeouts) -> tuple[str, str, list[dict]]:
    c = _etcd_client(plan, t)
    try:
        status = c.status()
        members = c.members()
    finally:
        c.session.close()
    leader = str(status.get("leader", ""))
    names = {str(m.get("ID")): m.get("name", "") for m in members}
    return (
        status.get("version", "?"),
        names.get(leader, leader) if leader not in ("", "0") else "",
        [{"name": m.get("name", ""), "client_urls": list(m.get("clientURLs", [])),
          "peer_urls": list(m.get("peerURLs", []))} for m in members],
    )


def _check_registrations(plan: Plan, t: Timeouts) -> dict[str, str]:
    """Registered worker address -> state (the value is `<timestamp>;<state>`)."""
    c = _etcd_client(plan, t)
    try:
        found = c.get_prefix(WORKER_PREFIX)
    finally:
        c.session.close()
    out = {}
    for value, meta in found:
        key = meta["key"].decode() if isinstance(meta["key"], bytes) else str(meta["key"])
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        out[key[len(WORKER_PREFIX):]] = text.rsplit(";", 1)[-1] if ";" in text else text
    return out


def _check_tcp(address: str, t: Timeouts) -> None:
    """A TCP connect to host:port (the worker speaks its own RPC, not HTTP)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=t.connect_s).close()
    except ConnectionRefusedError:
        raise _Failure("connection refused (nothing listening)") from None
    except (socket.timeout, TimeoutError):
        raise _Failure(f"no TCP connection within {t.connect_s:g}s (node down or blackholed)") from None
    except OSError as exc:
        raise _Failure(f"cannot connect: {exc.strerror or exc}") from None


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
        return [str(m["id"]) for m in answer["data"]]
    except (KeyError, TypeError):
        raise _Failure(f"/v1/models: unexpected answer {json.dumps(answer)[:100]}") from None


def _check_rank_metrics(r: Rank, t: Timeouts) -> CacheCounters:
    code, body = _http("GET", f"http://{r.address}:{r.port}/metrics", t, t.request_s)
    if code != 200:
        raise _Failure(f"/metrics: HTTP {code}")
    return CacheCounters.from_samples(parse_prometheus(body.decode("utf-8", errors="replace")))


def _check_proxy(plan: Plan, t: Timeouts) -> dict:
    answer = _get_json(f"{plan.proxy.url}/healthcheck", t)
    if not isinstance(answer, dict):
        raise _Failure(f"/healthcheck: unexpected answer {json.dumps(answer)[:100]}")
    return answer


def _smoke(plan: Plan, t: Timeouts) -> tuple[float, str]:
    body = {
        "model": plan.cfg.model.served_name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": SMOKE_MAX_TOKENS, "temperature": 0, "stream": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    t0 = time.monotonic()
    ts = replace(t, request_s=t.smoke_s)
    try:
        code, raw = _http("POST", f"{plan.proxy.url}/v1/chat/completions", ts, t.smoke_s, body)
    except Exception as exc:  # noqa: BLE001 - reported with the smoke's own timeout
        raise _Failure(_why(exc, ts)) from None
    latency = time.monotonic() - t0
    if code != 200:
        raise _Failure(f"HTTP {code} {_short(raw.decode(errors='replace'), 100)}".rstrip())
    try:
        msg = json.loads(raw)["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Failure(f"no chat completion in the answer: {_short(raw.decode(errors='replace'), 100)!r}") from None
    text = msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or ""
    if not str(text).strip():
        raise _Failure(f"the completion has no text after {latency:.2f}s: {json.dumps(msg)[:100]}")
    return latency, " ".join(str(text).split())[:60]


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
                      leader=leader or None, members=members, reason="; ".join(reasons))


def _worker_verdicts(plan: Plan, results: dict) -> tuple[list[WorkerStatus], list[str], list[Problem]]:
    w_ok, w_val = results[("etcd", "workers")]
    endpoint = plan.etcd.endpoint
    if not w_ok:
        reason = f"registrations unknown: etcd {endpoint} unreadable ({w_val})"
        return ([WorkerStatus(w.node, w.address, False, None, False, reason) for w in plan.workers], [],
                [Problem("openYuanrong workers", reason)])
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
            problems.append(Problem(f"worker {w.node} {w.address}", ws.reason))
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
                      metrics=xok, counters=xv if xok else None, ok=not why, reason="; ".join(why))


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
) -> StatusReport:
    """Poll everything the plan expects, concurrently, and return the report.

    `previous` (an earlier report of the same plan) adds hit rates over the interval between them;
    `progress(done, total)` is called as requests finish (for a progress indicator)."""
    t = timeouts
    started, t0 = time.time(), time.monotonic()
    jobs: dict[tuple, Callable[[], object]] = {
        ("etcd", "health"): lambda: _check_etcd_health(plan, t),
        ("etcd", "members"): lambda: _check_etcd_members(plan, t),
        ("etcd", "workers"): lambda: _check_registrations(plan, t),
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
        problems.append(Problem(f"etcd {etcd_status.endpoint}", etcd_status.reason))
    workers, unexpected, worker_problems = _worker_verdicts(plan, results)
    problems += worker_problems
    ranks = [_rank_verdict(plan, r, results) for r in plan.ranks]
    problems += [Problem(_rank_component(r), rs.reason) for r, rs in zip(plan.ranks, ranks) if not rs.ok]
    proxy_status = _proxy_verdict(plan, results)
    if not proxy_status.ok:
        problems.append(Problem(f"proxy {plan.proxy.url}", proxy_status.reason))
    smoke_status = None
    if smoke:
        sok, sv = results[("proxy", "smoke")]
        smoke_status = SmokeStatus(True, round(sv[0], 4), sv[1]) if sok else SmokeStatus(False, None, "", sv)
        if not sok:
            problems.append(Problem(f"smoke chat completion via {plan.proxy.url}", sv))

    since_start = _table(plan, {rs.name: rs.counters for rs in ranks if rs.counters is not None}, None)
    interval = None
    if previous is not None:
        before = {rs.name: rs.counters for rs in previous.ranks if rs.counters is not None}
        deltas = {rs.name: rs.counters.since(before[rs.name])
                  for rs in ranks if rs.counters is not None and rs.name in before}
        interval = _table(plan, deltas, round(started - previous.polled_at, 3))
    return StatusReport(
        stack=plan.stack, polled_at=started, elapsed_s=round(time.monotonic() - t0, 3), etcd=etcd_status,
        workers=workers, unexpected_workers=unexpected, ranks=ranks, proxy=proxy_status,
        smoke=smoke_status, since_start=since_start, interval=interval, problems=problems,
    )


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


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def format_table(plan: Plan, rep: StatusReport) -> str:
    """The report for people."""
    when = datetime.fromtimestamp(rep.polled_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    verdict = "OK" if rep.ok else f"{len(rep.problems)} PROBLEM(S)"
    out = [f"ascend-pd status  stack {rep.stack}  {when}  polled in {rep.elapsed_s:.2f}s: {verdict}", ""]
    e = rep.etcd
    if e.ok:
        names = ", ".join(m["name"] for m in e.members)
        etcd_detail = f"healthy, v{e.version}, {len(e.members)} member(s) [{names}], leader {e.leader}"
    else:
        etcd_detail = e.reason
    n_reg = sum(w.registered for w in rep.workers)
    w_bad = [w for w in rep.workers if not w.ok]
    worker_detail = f"{n_reg}/{len(rep.workers)} registered" + (
        "" if not w_bad else ", missing/unhealthy: " + ", ".join(f"{w.node} {w.address}" for w in w_bad))
    if rep.unexpected_workers:
        worker_detail += "; not in the plan: " + ", ".join(rep.unexpected_workers)
    px = rep.proxy
    proxy_detail = (f"{px.prefill_instances}/{px.expected_prefill} prefill, "
                    f"{px.decode_instances}/{px.expected_decode} decode instances") if px.ok else px.reason
    rows = [("COMPONENT", "STATE", "DETAIL"),
            (f"etcd {e.endpoint}", "ok" if e.ok else "FAIL", etcd_detail),
            ("openYuanrong workers", "ok" if not w_bad else "FAIL", worker_detail),
            (f"proxy {px.url}", "ok" if px.ok else "FAIL", proxy_detail)]
    if rep.smoke is not None:
        s = rep.smoke
        rows.append(("smoke chat completion", "ok" if s.ok else "FAIL",
                     f"{s.latency_s:.2f}s: {s.text!r}" if s.ok else s.reason))
    n_ok = sum(r.ok for r in rep.ranks)
    rows.append(("vLLM ranks", "ok" if n_ok == len(rep.ranks) else "FAIL",
                 f"{n_ok}/{len(rep.ranks)} healthy, serving {plan.cfg.model.served_name!r}"))
    out += _columns(rows)

    iv = rep.interval
    head = ["RANK", "NODE", "ENDPOINT", "STATE", "LOCAL PREFIX HIT", "EXTERNAL HIT", "EFFECTIVE"]
    if iv is not None:
        head += [f"LOCAL {iv.seconds:.0f}s", f"EXT {iv.seconds:.0f}s", f"EFF {iv.seconds:.0f}s"]
    rows = [tuple(head)]

    def rate_cells(h: Optional[HitRates], hi: Optional[HitRates]) -> list[str]:
        cells = (["-", "-", "-"] if h is None else
                 [_ratio(h.local_rate, h.local_hits, h.local_queries),
                  _ratio(h.external_rate, h.external_hits, h.external_queries), _pct(h.effective_rate)])
        if iv is not None:
            cells += ["-", "-", "-"] if hi is None else [
                _pct(hi.local_rate), _pct(hi.external_rate), _pct(hi.effective_rate)]
        return cells

    for r in rep.ranks:
        rows.append((r.name, r.node, r.url.removeprefix("http://"), "ok" if r.ok else "FAIL",
                     *rate_cells(rep.since_start.ranks.get(r.name), iv.ranks.get(r.name) if iv else None)))
    for role in ROLES:
        h = rep.since_start.roles[role]
        n = len([r for r in rep.ranks if r.role == role])
        rows.append((f"role {role}", "", f"{h.ranks}/{n} ranks counted", "",
                     *rate_cells(h, iv.roles[role] if iv else None)))
    c = rep.since_start.cluster
    n_prefill = len([r for r in rep.ranks if r.role == "prefill"])
    rows.append(("cluster", "", f"{c.ranks}/{n_prefill} prefill ranks", "",
                 *rate_cells(c, iv.cluster if iv else None)))
    out += ["", "KV cache hit rates since start" + (f" and over the last {iv.seconds:.1f}s" if iv else "")
            + " (hits/queries in tokens; effective = (local + external hits) / local queries)"]
    out += _columns(rows)
    out.append("note: cluster = the prompt side (prefill ranks); decode 'external' hits are KV received "
               "from prefill through Mooncake, not openYuanrong pool hits")
    if rep.problems:
        out += ["", f"PROBLEMS ({len(rep.problems)})"] + [f"  {p}" for p in rep.problems]
    return "\n".join(out) + "\n"


class _Progress:
    """`\\r`-updated polling counter on stderr, only when stderr is a terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.active = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int) -> None:
        if self.active:
            self.stream.write(f"\rpolling {done}/{total} checks...")
            self.stream.flush()

    def clear(self) -> None:
        if self.active:
            self.stream.write("\r\033[K")
            self.stream.flush()


def run(plan: Plan, *, as_json: bool = False, watch: Optional[float] = None, count: Optional[int] = None,
        timeouts: Timeouts = Timeouts(), smoke: bool = True, out=None, err=None) -> int:
    """The `status` command: one poll (or one every `watch` seconds, `count` times or until ^C).
    Returns the exit code of the last poll: 0 all healthy, 1 something missing or unhealthy."""
    out = out or sys.stdout
    progress = _Progress(err)
    previous: Optional[StatusReport] = None
    code, polls = 1, 0
    try:
        while True:
            rep = collect_status(plan, timeouts=timeouts, previous=previous, smoke=smoke, progress=progress)
            progress.clear()
            if as_json:
                out.write(json.dumps(rep.to_dict(), indent=None if watch else 2) + "\n")
            else:
                if watch and polls and getattr(out, "isatty", lambda: False)():
                    out.write("\033[H\033[2J")
                elif watch and polls:
                    out.write("\n")
                out.write(format_table(plan, rep))
            out.flush()
            code, polls, previous = rep.exit_code, polls + 1, rep
            if not watch or (count is not None and polls >= count):
                return code
            time.sleep(max(0.0, watch - (time.time() - rep.polled_at)))
    except KeyboardInterrupt:
        progress.clear()
        return code


__all__ = [
    "collect_status", "run", "format_table", "parse_prometheus", "metric_sum", "Timeouts", "StatusReport",
    "Problem", "CacheCounters", "HitRates", "HitRateTable", "EtcdStatus", "WorkerStatus", "RankStatus",
    "ProxyStatus", "SmokeStatus", "MetricsParseError",
]
