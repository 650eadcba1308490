"""Prometheus for a stack, from its plan: scrape targets, recording rules and alerts (issue 23).

Pure (no pulumi, no I/O but `write_monitoring`): everything is derived from the `Plan` the way
`status` reads the cluster, so the two cannot disagree.

What is scraped (`targets/*.json`, Prometheus `file_sd` files, one target per endpoint):

* every vLLM rank's `/metrics` (`plan.ranks`, job `ascend-pd-vllm`), labelled `stack`, `role`,
  `instance` (the DP instance, `prefill-0`: it replaces Prometheus' default host:port instance
  label), `dp_rank`, `node` and `rank` (`prefill-0-r1`, the name `status` uses);
* etcd's `/metrics` (job `ascend-pd-etcd`), which etcd serves on its client URL, labelled `stack`,
  `role="etcd"`, `node`;
* the site's node_exporter on every node (job `ascend-pd-node`, `monitoring.nodeExporterPort`, null: not),
  labelled `stack`, `role="node"`, `node`: the huge pages the plan reserves;
* `ascend-pd exporter` (job `ascend-pd-exporter`, when `monitoring.exporter` names where it runs): what no
  component exports, read the way `status` reads it (worker registrations and rollout slots in etcd, the
  proxy's `/healthcheck`, a P/D smoke completion through the proxy).

The PD proxy (the release's proxy script has no `/metrics`) and the openYuanrong workers (no Prometheus
endpoint) are not scraped themselves: the exporter reports on them.

Recording rules (`rules/recording.yml`), the numbers `status` computes, at three levels, named
`<level>:<metric>:<operation>` with level `stack_role_instance` (labels stack, role, instance),
`stack_role` (stack, role) or `stack` (the cluster: the prompt side, prefill ranks only, as in
status: decode's external hits are KV received from prefill and would count every prompt twice):

* prefix-cache hit ratios, as status defines them (status/model.py), over the counters summed across
  the level's ranks: local `vllm_prefix_cache_hit_ratio` = LH / LQ, external
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
  tokens received from prefill), per decode instance and as `stack:vllm_pd_handover_tokens:rate<window>`;
  and `vllm_decode_self_prefill_ratio:rate<window>` per decode instance and role: the share of its prompt
  tokens a decode computed itself (1 - (LH + EH) / EQ; about 0 when every prompt came from prefill).
* `vllm_request_error_ratio:rate<window>` per instance and role: finished requests that ended in `error`.

Alerts (`rules/alerts.yml`), thresholds from the stack (`hang.seconds`) and `Monitoring`; each with a
`summary`, a `description` and a one-line `runbook` (what it means, the command that confirms it, the
fix): see `alerts`. The rank, etcd and KV pool alerts always; the huge pages alerts with node_exporter; the
worker, rollout, proxy and smoke alerts with the exporter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import yaml

from .config import MONITORING_DIR, Monitoring  # noqa: F401 (MONITORING_DIR: render --out's subdirectory)
from .plan import Plan, restart_bound_s

JOB_RANKS = "ascend-pd-vllm"
JOB_ETCD = "ascend-pd-etcd"
JOB_NODES = "ascend-pd-node"  # the site's node_exporter on every node (monitoring.nodeExporterPort)
JOB_EXPORTER = "ascend-pd-exporter"  # `ascend-pd exporter` (monitoring.exporter)
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
ERROR = "error"  # a request the engine failed (a KV load from prefill, an engine error); abort = the client left
# `ascend-pd exporter`'s families (ascend_pd/exporter.py)
WORKER_REGISTERED = "ascend_pd_worker_registered"
SLOT_HELD = "ascend_pd_rollout_slot_held_seconds"
ROLLOUT_FAILED_METRIC = "ascend_pd_rollout_failed"
PROXY_UP = "ascend_pd_proxy_up"
SMOKE_SUCCESS = "ascend_pd_smoke_success"
SMOKE_LAST_RUN = "ascend_pd_smoke_last_run_timestamp_seconds"
SMOKE_STALE_MARGIN_S = 60  # beyond three smoke intervals: one smoke's deadline and a slow machine
# node_exporter's /proc/meminfo families
HUGEPAGES_TOTAL = "node_memory_HugePages_Total"
HUGEPAGE_SIZE = "node_memory_Hugepagesize_bytes"
# The hang rule's "counters moved" window, in scrape intervals: at least two samples must lie in it. The
# rule holds while a rank is busy and neither counter changed within it, and fires once it held for
# hang.seconds: never before the counters were seen flat that long (also right after Prometheus starts),
# at most this window later than hang.py's verdict.
HANG_WINDOW_SCRAPES = 4

PROMETHEUS_YML = "prometheus.yml"
RECORDING_YML = "rules/recording.yml"
ALERTS_YML = "rules/alerts.yml"


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


def targets(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict[str, list[dict]]:
    """file_sd contents by file name (under targets/): one entry per rank and one for etcd; the node_exporter
    of every node (unless nodeExporterPort is null) and `ascend-pd exporter` (if monitoring.exporter is set).
    The proxy (no /metrics) and the openYuanrong workers (no Prometheus endpoint) have none: the exporter
    reports on them."""
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
    if monitoring.node_exporter_port is not None:
        out["nodes.json"] = [{"targets": [f"{n.address}:{monitoring.node_exporter_port}"],
                              "labels": {"stack": plan.stack, "role": "node", "node": n.name}} for n in plan.nodes]
    if monitoring.exporter is not None:
        # No role label: the exporter's own series carry role (of a rollout slot) and stack (honor_labels).
        out["exporter.json"] = [{"targets": [monitoring.exporter], "labels": {"stack": plan.stack}}]
    return out


def _jobs(monitoring: Monitoring) -> list[tuple[str, list[str]]]:
    """(job name, its target files) of every scrape job."""
    jobs = [(JOB_RANKS, ["prefill.json", "decode.json"]), (JOB_ETCD, ["etcd.json"])]
    if monitoring.node_exporter_port is not None:
        jobs.append((JOB_NODES, ["nodes.json"]))
    if monitoring.exporter is not None:
        jobs.append((JOB_EXPORTER, ["exporter.json"]))
    return jobs


def prometheus_config(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    every = duration(monitoring.scrape_interval_s)
    return {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [RECORDING_YML, ALERTS_YML],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics",
             # The exporter labels its series itself (stack, role of a rollout slot): keep them as they are.
             **({"honor_labels": True} if job == JOB_EXPORTER else {}),
             "file_sd_configs": [{"files": [f"targets/{f}" for f in names], "refresh_interval": "1m"}]}
            for job, names in _jobs(monitoring)
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


def _self_prefill(stack: str, level: Level, w: str) -> str:
    """The share of a decode's prompt tokens it computed itself over w: neither received from prefill
    (external hits) nor found in its own prefix cache (local hits), of the tokens its connector was asked
    for (external queries: every prompt token, with or without prefix caching). Healthy: about 0."""
    inc = lambda metric: _sum(level, f"increase({metric}{level.sel(stack)}[{w}])")  # noqa: E731
    return f"1 - ({inc(LOCAL_HITS)} + {inc(EXTERNAL_HITS)}) / ({inc(EXTERNAL_QUERIES)} > 0)"


def _error_ratio(stack: str, level: Level, w: str) -> str:
    """Finished requests that ended in `error` over w, of all finished (only where some finished)."""
    return _ratio(_sum(level, f"rate({SUCCESSES}{level.sel(stack, finished_reason=ERROR)}[{w}])"),
                  _sum(level, f"rate({SUCCESSES}{level.sel(stack)}[{w}])"))


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
    for level in (INSTANCE, ROLE):
        requests.append(_record(f"{level.prefix}:vllm_request_error_ratio:rate{w}", _error_ratio(s, level, w)))
    for level in (INSTANCE, ROLE):
        dec = Level(level.prefix, level.by, "decode")
        requests.append(_record(f"{level.prefix}:vllm_decode_self_prefill_ratio:rate{w}", _self_prefill(s, dec, w)))
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


def _runbook_commands(stack: str) -> tuple[str, str, str]:
    """The runbooks' commands: confirm with status, fix with heal, or re-run every service script."""
    return (f"ascend-pd status --stack {stack}", f"ascend-pd heal --stack {stack}",
            f"pulumi config set ascend-pd:converge $(date +%s) --stack {stack} && pulumi up --stack {stack}")


def _cluster_alerts(plan: "Plan", monitoring: Monitoring) -> list[Alert]:
    """The ranks', etcd's and the KV pool's alerts (always generated)."""
    s, m = plan.stack, monitoring
    cmd, heal, redo = _runbook_commands(s)
    w = duration(m.rate_window_s)
    hang_s = plan.cfg.hang.seconds
    hw = hang_window_s(m)
    by_rank = ", ".join(RANK_LABELS)
    rank = INSTANCE.sel(s)
    decode = INSTANCE.sel(s, role="decode")
    dec_rank = Level("stack_role_instance", by_rank, "decode")
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
            f"({_self_prefill(s, dec_rank, w)} > {m.decode_self_prefill_percent / 100:g})"
            f" or ((sum by ({by_rank}) (increase({SUCCESSES}{INSTANCE.sel(s, role='decode', finished_reason=SERVED)}[{w}])) > 0)"
            f" and on ({by_rank}) (sum by ({by_rank}) (increase({EXTERNAL_HITS}{decode}[{w}])) == 0))",
            m.alert_for_s, "warning",
            f"Decode {who} computes prompts itself",
            f"{who} computed more than {m.decode_self_prefill_percent}% of its prompt tokens itself in the last {w}, "
            f"or served requests without receiving any KV from prefill: requests bypass prefill, fully or partly, "
            f"and decode recomputes their prompts (decode-only fallback: slow answers, green health).",
            f"P/D hand-over broken for this rank: prefill returns no kv_transfer_params, or this decode does not "
            f"load them. Confirm: `{cmd}` (the smoke completion names the side that did not take part) and the "
            f"recorded stack_role_instance:vllm_decode_self_prefill_ratio:rate{w}. Fix: read the rank's and the "
            f"prefill ranks' logs (Mooncake/kv_transfer errors), then `{heal}` or `{redo}`.",
        ),
        Alert(
            "AscendPdRequestErrors",
            f"{_error_ratio(s, INSTANCE, w)} > {m.error_percent / 100:g}",
            m.alert_for_s, "critical",
            "Instance {{ $labels.instance }} fails requests",
            f"More than {m.error_percent}% of the requests {{{{ $labels.instance }}}} finished in the last {w} ended "
            f"in error (a decode's failed KV load from prefill, an engine error); through the proxy these are "
            f"failed or empty answers.",
            f"Requests fail on this instance. Confirm: `{cmd}` (the smoke completion; a decode's failed KV load "
            f"shows as an empty answer). Fix: read the instance's rank logs (Mooncake transfer errors: the prefill "
            f"side channel or the fabric), then `{heal}`.",
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


def _node_alerts(plan: "Plan", m: Monitoring) -> list[Alert]:
    """The huge pages alert from the site's node_exporter (monitoring.nodeExporterPort)."""
    if m.node_exporter_port is None:
        return []
    s = plan.stack
    node = f'{{job={_q(JOB_NODES)},stack={_q(s)}}}'
    out = [Alert(
        "AscendPdNodeExporterDown", f"up{node} == 0", m.alert_for_s, "warning",
        "node_exporter on {{ $labels.node }} does not answer",
        f"Prometheus cannot read node_exporter on {{{{ $labels.node }}}} (port {m.node_exporter_port}): the huge "
        f"pages of that node are not watched.",
        f"No node_exporter there. Confirm: `curl -s http://<node>:{m.node_exporter_port}/metrics | head`. Fix: run "
        f"the site's node_exporter on every node, or set `monitoring.nodeExporterPort` to its port, or to null "
        f"when the site has none (no huge pages alert then).",
    )]
    if plan.cfg.hugepages is not None:
        gib = plan.cfg.hugepages.gib
        out.append(Alert(
            "AscendPdHugepagesBelowPlan", f"{HUGEPAGES_TOTAL}{node} * {HUGEPAGE_SIZE}{node} < {gib * 2 ** 30}",
            m.alert_for_s, "critical",
            "Huge pages of {{ $labels.node }} below the plan",
            f"{{{{ $labels.node }}}} has less than hugepages.gib = {gib} GiB of huge pages reserved (a reboot resets "
            f"nr_hugepages): its openYuanrong worker cannot map its shared memory on restart.",
            f"The host lost its huge pages. Confirm: `ascend-pd doctor --stack {s} --only memory`. Fix: "
            f"`pulumi config set ascend-pd:converge $(date +%s) --stack {s} && pulumi up --stack {s}` reserves "
            f"them again.",
        ))
    return out


def _exporter_alerts(plan: "Plan", m: Monitoring) -> list[Alert]:
    """What `ascend-pd exporter` reports (monitoring.exporter): workers, rollouts, the proxy and the smoke."""
    if m.exporter is None:
        return []

    s = plan.stack
    cmd, heal, redo = _runbook_commands(s)
    sel = f"{{job={_q(JOB_EXPORTER)},stack={_q(s)}}}"
    bound = restart_bound_s(plan.cfg)
    return [
        Alert(
            "AscendPdExporterDown", f"up{sel} == 0", m.alert_for_s, "warning",
            "ascend-pd exporter of {{ $labels.stack }} does not answer",
            f"Prometheus cannot read `ascend-pd exporter` at {m.exporter}: worker registrations, rollout slots, the "
            f"proxy and the P/D smoke are not watched.",
            f"The exporter is not running. Confirm: `curl -s http://{m.exporter}/metrics | head`. Fix: start "
            f"`ascend-pd exporter --stack {s}` where monitoring.exporter says (its unit's log tells why it stopped).",
        ),
        Alert(
            "AscendPdWorkerMissing", f"{WORKER_REGISTERED}{sel} == 0", m.alert_for_s, "warning",
            "openYuanrong worker of {{ $labels.node }} is not registered",
            f"The openYuanrong worker of {{{{ $labels.node }}}} ({{{{ $labels.address }}}}) has no registration in "
            f"etcd: the KV pool lacks that node's memory, and its ranks' cache lookups fail or miss.",
            f"Worker dead or its lease lost. Confirm: `{cmd}` (workers). Fix: `{heal}` restarts the worker and the "
            f"instance on its node.",
        ),
        Alert(
            "AscendPdRolloutStuck", f"{SLOT_HELD}{sel} > {bound}", 0, "warning",
            "Restart of {{ $labels.instance }} holds its rollout slot too long",
            f"{{{{ $labels.instance }}}} has held a {{{{ $labels.role }}}} restart slot longer than a restart may "
            f"take ({bound}s: stop, rollout.drainTimeoutS, container replacement, worker restart and model load, "
            f"vllm.readyTimeoutS): the role's other restarts wait for it.",
            f"A restart hangs (model load, a rank that never answers /health). Confirm: `{cmd}` (rollout slots) and "
            f"the `pulumi up` output of the instance's launch. Fix: the launch's log on its nodes says what waits; "
            f"the slot frees itself when its lease ends; then `pulumi up --stack {s}` again.",
        ),
        Alert(
            "AscendPdRolloutFailed", f"{ROLLOUT_FAILED_METRIC}{sel} == 1", 0, "warning",
            "Rollout of role {{ $labels.role }} stopped: {{ $labels.instance }} failed",
            f"The restart of {{{{ $labels.instance }}}} failed and marked the {{{{ $labels.role }}}} rollout failed: "
            f"the role's other instances keep their old version until it is fixed.",
            f"A restart failed. Confirm: `{cmd}` (rollout). Fix: fix what the instance's launch output names, then "
            f"`pulumi up --stack {s}` (the mark goes when that instance serves again).",
        ),
        Alert(
            "AscendPdProxyDown", f"{PROXY_UP}{sel} == 0", m.alert_for_s, "critical",
            "PD proxy of {{ $labels.stack }} does not answer",
            f"The PD proxy at {plan.proxy.url} does not answer /healthcheck: no request reaches the cluster.",
            f"The proxy process is dead or its node is down. Confirm: `{cmd}` (proxy). Fix: `{redo}` starts it "
            f"again.",
        ),
        Alert(
            "AscendPdSmokeFailing", f"{SMOKE_SUCCESS}{sel} == 0", m.alert_for_s, "critical",
            "Requests through the PD proxy of {{ $labels.stack }} fail",
            f"The exporter's smoke completion through {plan.proxy.url} (every monitoring.smokeIntervalS = "
            f"{m.smoke_interval_s}s) failed, came back empty, or was not served by both a prefill and a decode rank.",
            f"Users get failed or empty answers, or decode-only ones. Confirm: `{cmd}` (the smoke line names what "
            f"failed). Fix: follow the failing side: a rank down or hung (`{heal}`), the proxy (`{redo}`), the KV "
            f"hand-over (rank logs).",
        ),
        Alert(
            "AscendPdSmokeStale", f"time() - {SMOKE_LAST_RUN}{sel} > {3 * m.smoke_interval_s + SMOKE_STALE_MARGIN_S}",
            0, "warning",
            "The exporter's P/D smoke of {{ $labels.stack }} has stopped",
            f"No smoke completion ended for {3 * m.smoke_interval_s + SMOKE_STALE_MARGIN_S}s (three "
            f"monitoring.smokeIntervalS and a margin): {SMOKE_SUCCESS} shows an old result, so AscendPdSmokeFailing "
            f"cannot fire.",
            f"The exporter's smoke thread is stuck. Confirm: `curl -s http://{m.exporter}/metrics | grep smoke` "
            f"(the last run's timestamp). Fix: restart the exporter; `{cmd}` checks the path itself.",
        ),
    ]


def alerts(plan: "Plan", monitoring: Monitoring = Monitoring()) -> list[Alert]:
    """Every alert of the stack: the cluster's own, and those of node_exporter and `ascend-pd exporter` where
    they are scraped."""
    from .logsources import runbook_with_logs  # every runbook ends in the command that shows the logs

    return [replace(a, runbook=runbook_with_logs(plan.stack, a.name, a.runbook)) for a in
            _cluster_alerts(plan, monitoring) + _node_alerts(plan, monitoring) + _exporter_alerts(plan, monitoring)]


def alert_rules(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    return {"groups": [{"name": f"ascend-pd:{plan.stack}:alerts",
                        "rules": [a.rule() for a in alerts(plan, monitoring)]}]}


# ---------------------------------------------------------------------------------------------
# Files


def _yaml(header: str, data: dict) -> str:
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.strip("\n").split("\n"))
    return comment + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1 << 20, allow_unicode=True)


def files(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict[str, str]:
    """Relative path -> text of every file `write_monitoring` writes."""
    every = duration(monitoring.scrape_interval_s)
    m = monitoring
    nodes = (f",\nthe site's node_exporter on every node, port {m.node_exporter_port} (targets/nodes.json: huge pages)"
             if m.node_exporter_port is not None else ",\nno node_exporter (monitoring.nodeExporterPort is null: no huge pages alert)")
    exporter = (f",\n`ascend-pd exporter` at {m.exporter} (targets/exporter.json)." if m.exporter is not None else ".")
    facts = ("`ascend-pd exporter` reports their health (registrations, /healthcheck, a P/D smoke completion)."
             if m.exporter is not None else
             "set monitoring.exporter and run `ascend-pd exporter` to watch them (workers, rollouts, proxy, smoke).")
    out = {
        PROMETHEUS_YML: _yaml(f"""\
Prometheus for ascend-pd stack {plan.stack}, generated by `ascend-pd render --out` (ascend_pd/monitoring.py):
do not edit, change the stack file and render again. Paths are relative to this file:
  prometheus --config.file=prometheus.yml
Scraped every {every}: every vLLM rank's /metrics (targets/prefill.json, targets/decode.json), etcd's
/metrics on its client URL (targets/etcd.json){nodes}{exporter}
The PD proxy (no /metrics) and the openYuanrong workers (no Prometheus endpoint) are not scraped themselves:
{facts}""",
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
    for name, entries in targets(plan, monitoring).items():
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
