"""Prometheus for a stack, from its plan: scrape targets, recording rules and alerts (issue 23).

Pure (no pulumi, no I/O but `write_monitoring`): everything is derived from the `Plan` the way
`status` reads the cluster, so the two cannot disagree.

What is scraped (`targets/*.json`, Prometheus `file_sd` files, one target per endpoint):

* every vLLM rank's `/metrics` (`plan.ranks`, job `ascend-pd-vllm`), labelled `stack`, `role`,
  `instance` (the DP instance, `prefill-0`: it replaces Prometheus' default host:port instance
  label), `dp_rank`, `node` and `rank` (`prefill-0-r1`, the name `status` uses);
* etcd's `/metrics` (job `ascend-pd-etcd`), which etcd serves on its client URL, labelled `stack`,
  `role="etcd"`, `node`.

Not scraped, because there is nothing to scrape: the PD proxy (the release's proxy script has no
`/metrics`; `status` checks it with its `/healthcheck` and a smoke completion), the openYuanrong
workers (no Prometheus endpoint; their registrations in etcd are what `status` reads), and host huge
pages (no exporter is deployed; `doctor` checks them).

Recording rules (`rules/recording.yml`), the numbers `status` computes, at three levels, named
`<level>:<metric>:<operation>` with level `stack_role_instance` (labels stack, role, instance),
`stack_role` (stack, role) or `stack` (the cluster: the prompt side, prefill ranks only, as in
status: decode's external hits are KV received from prefill and would count every prompt twice):

* prefix-cache hit ratios, as status.py defines them, over the counters summed across the level's
  ranks: local `vllm_prefix_cache_hit_ratio` = LH / LQ, external
  `vllm_external_prefix_cache_hit_ratio` = EH / EQ, effective `vllm_effective_prefix_cache_hit_ratio`
  = (LH + EH) / LQ (prefill only). `:since_start` uses the counters as they are (status' "since
  start", equal to it to the last bit); `:rate<window>` uses their increase over `rateWindowS`
  (status --watch's "last interval"). A ratio whose denominator is 0 is not recorded (status: `-`).
* `vllm_num_requests_running:sum` / `vllm_num_requests_waiting:sum` per instance and role (not for
  the cluster: a request is counted on its prefill and on its decode rank), and finished requests
  per second `vllm_request_success:rate<window>` (finished_reason stop/length) and
  `vllm_request_failure:rate<window>` (abort/error).
* latency quantiles per role, `quantile` label 0.5 and 0.99, from vLLM's histograms over
  `rateWindowS`: `vllm_time_to_first_token_seconds`, `vllm_inter_token_latency_seconds` (vLLM >= 0.11;
  older releases call it `vllm:time_per_output_token_seconds`, used when the new one is absent) and
  `vllm_e2e_request_latency_seconds`. No requests in the window: nothing recorded (not NaN).
* the prefill -> decode hand-over: the rate of decode's `vllm:external_prefix_cache_hits_total` (KV
  tokens received from prefill), per decode instance and as `stack:vllm_pd_handover_tokens:rate<window>`.

Alerts (`rules/alerts.yml`), thresholds from the stack (`hang.seconds`) and `Monitoring`; each with a
`summary`, a `description` and a one-line `runbook` (what it means, the command that confirms it, the
fix): see ALERTS below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import yaml
from pydantic import Field

from .valuetypes import SECONDS, Settings

if TYPE_CHECKING:  # config.py imports this module (StackConfig.monitoring): no import of config or plan here
    from .plan import Plan

JOB_RANKS = "ascend-pd-vllm"
JOB_ETCD = "ascend-pd-etcd"
RANK_LABELS = ("stack", "role", "instance", "dp_rank", "node", "rank")  # of every rank target
QUANTILES = (0.5, 0.99)
# vLLM's latency histograms (vllm/v1/metrics/loggers.py): (recorded name, metric, the name older vLLM
# releases use for the same histogram). The inter-token latency was vllm:time_per_output_token_seconds
# until 0.11 (hidden since 0.12); the committed stacks run vLLM-Ascend 0.18 and 0.20.
HISTOGRAMS = (
    ("vllm_time_to_first_token_seconds", "vllm:time_to_first_token_seconds", None),
    ("vllm_inter_token_latency_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ("vllm_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds", None),
)
LOCAL_HITS = "vllm:prefix_cache_hits_total"  # = status.LOCAL_HITS etc. (status imports requests, etcd3gw)
LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
RUNNING = "vllm:num_requests_running"  # = hang.RUNNING etc.
WAITING = "vllm:num_requests_waiting"
GENERATION_TOKENS = "vllm:generation_tokens_total"
SUCCESSES = "vllm:request_success_total"
SERVED = "stop|length"  # finished reasons of a request a rank completed (pd_smoke.SERVED); the others failed
FAILED = "abort|error"
# The hang rule's "counters moved" window, in scrape intervals: at least two samples must lie in it. The
# rule holds while a rank is busy and neither counter changed within it, and fires once it held for
# hang.seconds: never before the counters were seen flat that long (also right after Prometheus starts),
# at most this window later than hang.py's verdict.
HANG_WINDOW_SCRAPES = 4

MONITORING_DIR = "monitoring"  # render --out <out> writes under <out>/monitoring
PROMETHEUS_YML = "prometheus.yml"
RECORDING_YML = "rules/recording.yml"
ALERTS_YML = "rules/alerts.yml"


def _seconds(ge: int, le: int):
    """valuetypes.Seconds with an upper bound of its own (a bound given in the assigned Field would lose to
    the Annotated one)."""
    return Annotated[int, Field(strict=True, ge=ge, le=le), SECONDS]


class Monitoring(Settings):
    """The Prometheus configuration `render --out` writes for the stack (scrape targets, rules, alerts)."""

    scrape_interval_s: _seconds(1, 15) = Field(5, description=(
        "How often Prometheus reads every rank's and etcd's `/metrics`, and evaluates the rules, in seconds."))
    rate_window_s: _seconds(60, 3600) = Field(300, description=(
        "Window of the recorded rates, hit ratios over time and latency quantiles, and of the decode-only "
        "fallback alert, in seconds (at least 60: four scrapes of the longest interval fit in it)."))
    baseline_window_s: _seconds(600, 86400) = Field(3600, description=(
        "Window of the KV pool hit rate's own baseline that the hit-rate drop alert compares the last "
        "`rateWindowS` with, in seconds."))
    hit_rate_drop_percent: int = Field(30, ge=1, le=100, description=(
        "The KV pool hit-rate drop alert fires when the openYuanrong pool's hit rate (prefill ranks' external "
        "hits / external queries) over `rateWindowS` is this many percent below its own average over "
        "`baselineWindowS`, relative to it (30: a baseline of 80 % alerts below 56 %)."))
    min_baseline_percent: int = Field(5, ge=0, le=100, description=(
        "The hit-rate drop alert applies only while the pool's baseline hit rate is at least this many percent "
        "(a drop from a tiny baseline is noise)."))
    alert_for_s: _seconds(0, 3600) = Field(120, description=(
        "How long a condition must hold before its alert fires (rank or etcd down, no etcd leader, decode-only "
        "fallback, hit-rate drop), in seconds; a hang waits `hang.seconds` instead."))


# ---------------------------------------------------------------------------------------------
# PromQL helpers


def duration(seconds: int) -> str:
    """A Prometheus duration: 3600 -> 1h, 300 -> 5m, 90 -> 90s."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _q(value: str) -> str:
    """A PromQL / label string literal."""
    return json.dumps(value)


@dataclass(frozen=True)
class Level:
    prefix: str  # level of the recorded name
    by: str  # PromQL grouping labels
    role: Optional[str] = None  # the level's ranks: one role, or every role

    def sel(self, stack: str, job: str = JOB_RANKS, role: Optional[str] = None, **more: str) -> str:
        labels = {"job": job, "stack": stack}
        if role or self.role:
            labels["role"] = role or self.role
        parts = [f"{k}={_q(v)}" for k, v in labels.items()]
        parts += [f"{k}=~{_q(v)}" for k, v in more.items()]
        return "{" + ",".join(parts) + "}"


INSTANCE = Level("stack_role_instance", "stack, role, instance")
ROLE = Level("stack_role", "stack, role")
CLUSTER = Level("stack", "stack", "prefill")  # the prompt side, as status' cluster row


def _sum(level: Level, expr: str) -> str:
    return f"sum by ({level.by}) ({expr})"


def _ratio(num: str, den: str) -> str:
    """num / den where den > 0 (no sample otherwise: status' undefined rate)."""
    return f"{num} / ({den} > 0)"


# ---------------------------------------------------------------------------------------------
# Targets


def targets(plan: "Plan") -> dict[str, list[dict]]:
    """file_sd contents by file name (under targets/): one entry per rank and one for etcd. The proxy
    (no /metrics) and the openYuanrong workers (no Prometheus endpoint) have none."""
    out: dict[str, list[dict]] = {}
    for role in ("prefill", "decode"):
        out[f"{role}.json"] = [
            {"targets": [f"{r.address}:{r.port}"],
             "labels": {"stack": plan.stack, "role": r.role, "instance": r.instance_name,
                        "dp_rank": str(r.dp_rank), "node": r.node, "rank": r.name}}
            for r in plan.ranks_of(role)
        ]
    e = plan.etcd
    out["etcd.json"] = [{"targets": [e.endpoint], "labels": {"stack": plan.stack, "role": "etcd", "node": e.node}}]
    return out


def prometheus_config(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    every = duration(monitoring.scrape_interval_s)
    return {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [RECORDING_YML, ALERTS_YML],
        "scrape_configs": [
            {"job_name": JOB_RANKS, "metrics_path": "/metrics",
             "file_sd_configs": [{"files": ["targets/prefill.json", "targets/decode.json"], "refresh_interval": "1m"}]},
            {"job_name": JOB_ETCD, "metrics_path": "/metrics",
             "file_sd_configs": [{"files": ["targets/etcd.json"], "refresh_interval": "1m"}]},
        ],
    }


# ---------------------------------------------------------------------------------------------
# Recording rules


def _record(name: str, expr: str, **labels: str) -> dict:
    rule = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def _hit_ratio_rules(stack: str, level: Level, window: Optional[str]) -> list[dict]:
    """Local, external and (prompt side only) effective ratios at one level; window None: since start."""
    op = f"rate{window}" if window else "since_start"

    def total(metric: str, role: Optional[str] = None) -> str:
        series = f"{metric}{level.sel(stack, role=role)}"
        return _sum(level, f"increase({series}[{window}])" if window else series)

    rules = [
        _record(f"{level.prefix}:vllm_prefix_cache_hit_ratio:{op}", _ratio(total(LOCAL_HITS), total(LOCAL_QUERIES))),
        _record(f"{level.prefix}:vllm_external_prefix_cache_hit_ratio:{op}",
                _ratio(total(EXTERNAL_HITS), total(EXTERNAL_QUERIES))),
    ]
    # Decode's external hits are KV received from prefill, not prompt tokens saved: no effective rate there.
    prompt = "prefill"
    rules.append(_record(
        f"{level.prefix}:vllm_effective_prefix_cache_hit_ratio:{op}",
        _ratio(f"({total(LOCAL_HITS, prompt)} + {total(EXTERNAL_HITS, prompt)})", total(LOCAL_QUERIES, prompt))))
    return rules


def recording_rules(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    s = plan.stack
    w = duration(monitoring.rate_window_s)
    base = duration(monitoring.baseline_window_s)
    hit = [r for level in (INSTANCE, ROLE, CLUSTER) for window in (None, w) for r in _hit_ratio_rules(s, level, window)]
    hit.append(_record(f"stack:vllm_external_prefix_cache_hit_ratio:rate{base}",
                       _ratio(_sum(CLUSTER, f"increase({EXTERNAL_HITS}{CLUSTER.sel(s)}[{base}])"),
                              _sum(CLUSTER, f"increase({EXTERNAL_QUERIES}{CLUSTER.sel(s)}[{base}])"))))

    requests = []
    for level in (INSTANCE, ROLE):
        requests += [
            _record(f"{level.prefix}:vllm_num_requests_running:sum", _sum(level, f"{RUNNING}{level.sel(s)}")),
            _record(f"{level.prefix}:vllm_num_requests_waiting:sum", _sum(level, f"{WAITING}{level.sel(s)}")),
            _record(f"{level.prefix}:vllm_request_success:rate{w}",
                    _sum(level, f"rate({SUCCESSES}{level.sel(s, finished_reason=SERVED)}[{w}])")),
            _record(f"{level.prefix}:vllm_request_failure:rate{w}",
                    _sum(level, f"rate({SUCCESSES}{level.sel(s, finished_reason=FAILED)}[{w}])")),
        ]
    decode = INSTANCE.sel(s, role="decode")
    requests += [
        _record(f"stack_role_instance:vllm_external_prefix_cache_hits:rate{w}",
                _sum(INSTANCE, f"rate({EXTERNAL_HITS}{decode}[{w}])")),
        _record(f"stack:vllm_pd_handover_tokens:rate{w}", f"sum by (stack) (rate({EXTERNAL_HITS}{decode}[{w}]))"),
    ]

    latency = []
    for name, metric, older in HISTOGRAMS:
        buckets = _sum(Level(ROLE.prefix, "stack, role, le"), f"rate({metric}_bucket{ROLE.sel(s)}[{w}])")
        if older:
            buckets = (f"({buckets} or "
                       f"{_sum(Level(ROLE.prefix, 'stack, role, le'), f'rate({older}_bucket{ROLE.sel(s)}[{w}])')})")
        for q in QUANTILES:
            # `>= 0` drops NaN: no request finished in the window.
            latency.append(_record(f"stack_role:{name}:quantile_rate{w}", f"histogram_quantile({q}, {buckets}) >= 0",
                                   quantile=str(q)))
    return {"groups": [
        {"name": f"ascend-pd:{s}:hit-ratios", "rules": hit},
        {"name": f"ascend-pd:{s}:requests", "rules": requests},
        {"name": f"ascend-pd:{s}:latency", "rules": latency},
    ]}


# ---------------------------------------------------------------------------------------------
# Alerts


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_s: int
    severity: str
    summary: str
    description: str
    runbook: str

    def rule(self) -> dict:
        return {"alert": self.name, "expr": self.expr, "for": duration(self.for_s),
                "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "description": self.description, "runbook": self.runbook}}


def hang_window_s(monitoring: Monitoring) -> int:
    """The window in which a moved counter counts as progress (HANG_WINDOW_SCRAPES scrapes)."""
    return HANG_WINDOW_SCRAPES * monitoring.scrape_interval_s


def alerts(plan: "Plan", monitoring: Monitoring = Monitoring()) -> list[Alert]:
    s, m = plan.stack, monitoring
    cmd = f"ascend-pd status --stack {s}"
    heal = f"ascend-pd heal --stack {s}"
    redo = f"pulumi config set ascend-pd:converge $(date +%s) --stack {s} && pulumi up --stack {s}"
    w = duration(m.rate_window_s)
    hang_s = plan.cfg.hang.seconds
    hw = hang_window_s(m)
    by_rank = ", ".join(RANK_LABELS)
    rank = INSTANCE.sel(s)
    decode = INSTANCE.sel(s, role="decode")
    drop = m.hit_rate_drop_percent
    base = duration(m.baseline_window_s)
    who = "rank {{ $labels.rank }} ({{ $labels.instance }}, node {{ $labels.node }})"
    return [
        Alert(
            "AscendPdRankDown", f"up{rank} == 0", m.alert_for_s, "critical",
            f"vLLM {who} is down",
            f"Prometheus cannot read /metrics of {who}: the process is dead, or its node is down or unreachable. "
            f"Its DP instance cannot serve.",
            f"The rank's API server does not answer. Confirm: `{cmd}` (rank FAIL, node unreachable?). Fix: `{heal}` "
            f"restarts its DP instance as a whole (expected while `pulumi up` or a rollout restarts it).",
        ),
        Alert(
            "AscendPdRankHung",
            f"(sum by ({by_rank}) ({RUNNING}{rank}) > 0)"
            f" and on ({by_rank}) (sum by ({by_rank}) (changes({GENERATION_TOKENS}{rank}[{duration(hw)}])) == 0)"
            f" and on ({by_rank}) (sum by ({by_rank}) (changes({SUCCESSES}{rank}[{duration(hw)}])) == 0)",
            hang_s, "critical",
            f"vLLM {who} is hung",
            f"{who} has requests running while {GENERATION_TOKENS} and {SUCCESSES} have not moved for "
            f"hang.seconds ({hang_s}s): its engine core is stuck, though /health may still say 200.",
            f"Engine stuck with requests in flight (vllm #17972). Confirm: `{cmd} --watch 30` (after "
            f"hang.seconds the rank shows `hung`). Fix: `{heal} --watch 30` restarts the DP instance as a whole.",
        ),
        Alert(
            "AscendPdDecodeOnlyFallback",
            f"(sum by (stack, role, instance) (increase({SUCCESSES}{INSTANCE.sel(s, role='decode', finished_reason=SERVED)}[{w}])) > 0)"
            f" and on (stack, role, instance)"
            f" (sum by (stack, role, instance) (increase({EXTERNAL_HITS}{decode}[{w}])) == 0)",
            m.alert_for_s, "warning",
            "Decode instance {{ $labels.instance }} serves without KV from prefill",
            f"{{{{ $labels.instance }}}} finished requests in the last {w} but received no KV cache from prefill "
            f"({EXTERNAL_HITS} flat): requests bypass prefill and decode recomputes every prompt (decode-only "
            f"fallback).",
            f"P/D hand-over broken: prefill returns no kv_transfer_params or decode cannot pull. Confirm: `{cmd}` "
            f"(the smoke completion names the side that did not take part). Fix: read the prefill ranks' logs "
            f"(Mooncake/kv_transfer errors), then `{heal}` or `{redo}`.",
        ),
        Alert(
            "AscendPdKvPoolHitRateDrop",
            f"stack:vllm_external_prefix_cache_hit_ratio:rate{w}{{stack={_q(s)}}}"
            f" < on (stack) ({1 - drop / 100:g} * (stack:vllm_external_prefix_cache_hit_ratio:rate{base}"
            f"{{stack={_q(s)}}} >= {m.min_baseline_percent / 100:g}))",
            m.alert_for_s, "warning",
            "KV pool hit rate of {{ $labels.stack }} dropped",
            f"The openYuanrong pool's hit rate (prefill external hits / queries) over {w} is more than {drop}% "
            f"below its {base} average: prompts are recomputed instead of loaded from the pool.",
            f"Pool lost content or workers. Confirm: `{cmd} --watch 60` (cluster external rate of the last "
            f"interval; every worker registered `ready`?). Fix: dead workers: `{heal}`; a restarted worker refills "
            f"as traffic repeats; a change in traffic is no fault.",
        ),
        Alert(
            "AscendPdEtcdDown", f"up{{job={_q(JOB_ETCD)},stack={_q(s)}}} == 0", m.alert_for_s, "critical",
            "etcd of {{ $labels.stack }} is down",
            f"Prometheus cannot read etcd's /metrics at {plan.etcd.client_url} (node {plan.etcd.node}): openYuanrong "
            f"workers cannot register or renew their leases, and the pool loses them after nodeDeadTimeoutS.",
            f"etcd is not answering. Confirm: `{cmd}` (etcd row). Fix: `{redo}` restarts what is dead; check "
            f"etcd's log and the disk of etcd.dataDir on {plan.etcd.node}.",
        ),
        Alert(
            "AscendPdEtcdNoLeader", f"etcd_server_has_leader{{job={_q(JOB_ETCD)},stack={_q(s)}}} == 0",
            m.alert_for_s, "critical",
            "etcd of {{ $labels.stack }} has no leader",
            f"etcd at {plan.etcd.client_url} answers but has no raft leader: it accepts no writes, so worker "
            f"registrations and lease renewals fail.",
            f"The single etcd member lost quorum with itself (disk full or slow, corrupt data dir). Confirm: `{cmd}` "
            f"(etcd leader). Fix: free the disk of etcd.dataDir on {plan.etcd.node}, then `{redo}`.",
        ),
    ]


def alert_rules(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    return {"groups": [{"name": f"ascend-pd:{plan.stack}:alerts", "rules": [a.rule() for a in alerts(plan, monitoring)]}]}


# ---------------------------------------------------------------------------------------------
# Files


def _yaml(header: str, data: dict) -> str:
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.strip("\n").split("\n"))
    return comment + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1 << 20, allow_unicode=True)


def files(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict[str, str]:
    """Relative path -> text of every file `write_monitoring` writes."""
    every = duration(monitoring.scrape_interval_s)
    out = {
        PROMETHEUS_YML: _yaml(f"""\
Prometheus for ascend-pd stack {plan.stack}, generated by `ascend-pd render --out` (ascend_pd/monitoring.py):
do not edit, change the stack file and render again. Paths are relative to this file:
  prometheus --config.file=prometheus.yml
Scraped every {every}: every vLLM rank's /metrics (targets/prefill.json, targets/decode.json) and etcd's
/metrics on its client URL (targets/etcd.json). Not scraped: the PD proxy (no /metrics), the openYuanrong
workers (no Prometheus endpoint) and host huge pages (no metric; `ascend-pd doctor` checks them).""",
                              prometheus_config(plan, monitoring)),
        RECORDING_YML: _yaml(f"""\
Recording rules of stack {plan.stack} (ascend_pd/monitoring.py): what `ascend-pd status` computes.
Levels: stack_role_instance, stack_role, stack (= the prompt side: prefill ranks only, as status' cluster row).
Ratios are recorded only where their denominator is > 0; quantiles only where requests finished.""",
                             recording_rules(plan, monitoring)),
        ALERTS_YML: _yaml(f"""\
Alerts of stack {plan.stack} (ascend_pd/monitoring.py); hang.seconds = {plan.cfg.hang.seconds}s.""",
                          alert_rules(plan, monitoring)),
    }
    for name, entries in targets(plan).items():
        out[f"targets/{name}"] = json.dumps(entries, indent=2) + "\n"
    return out


def write_monitoring(plan: "Plan", monitoring: Monitoring = Monitoring(), out_dir: Path = Path(MONITORING_DIR)
                     ) -> list[Path]:
    """Write prometheus.yml, targets/*.json, rules/recording.yml and rules/alerts.yml under out_dir."""
    written = []
    for rel, text in files(plan, monitoring).items():
        path = Path(out_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


__all__ = ["Monitoring", "write_monitoring", "files", "targets", "prometheus_config", "recording_rules",
           "alert_rules", "alerts", "Alert", "duration", "hang_window_s", "JOB_RANKS", "JOB_ETCD", "RANK_LABELS"]
