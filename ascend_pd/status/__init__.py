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
  deadline; the "before" is the rank checks' own `/metrics` reads (read.MetricsBoard), waited for up
  to half of it.
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

The package, in the order its work flows: `read` (bounded HTTP and etcd reads, the smoke, the concurrent
poll; `metrics` parses /metrics, `text` makes what an endpoint said safe to show), `judge` (verdicts per
rank, instance, node and cluster: `collect_status`), `report` (table, JSON, `run`); `model` holds the
report's data they share.
"""

from .judge import collect_status, hang_tracker
from .metrics import MetricsParseError, metric_sum, parse_prometheus
from .model import (CONNECT_TIMEOUT_S, EXTERNAL_HITS, EXTERNAL_QUERIES, LOCAL_HITS, LOCAL_QUERIES, MAX_TIMEOUT_S,
                    REQUEST_TIMEOUT_S, SMOKE_TIMEOUT_S, WORKER_PREFIX, CacheCounters, EtcdStatus, HitRates,
                    HitRateTable, NodeStatus, Problem, ProxyStatus, RankStatus, SmokeStatus, StatusReport, Timeouts,
                    WorkerStatus)
from .report import format_table, report_blocks, run

__all__ = [
    "collect_status", "run", "hang_tracker", "format_table", "parse_prometheus", "metric_sum", "Timeouts", "StatusReport",
    "Problem", "CacheCounters", "HitRates", "HitRateTable", "EtcdStatus", "WorkerStatus", "RankStatus", "NodeStatus",
    "ProxyStatus", "SmokeStatus", "MetricsParseError",
]
