"""ascend_pd.monitoring against the real thing: Debian's promtool checks the generated config and rules
of both committed stacks and runs unit tests of every alert (a series that fires it, one that must
not); a real Prometheus scrapes a small loopback cluster (real etcd, fake vLLM ranks with hand-set
counters) and its recorded hit rates must equal what `status` computes from the same counters."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from ascend_pd.loader import load_stack
from ascend_pd.monitoring import (
    JOB_ETCD, JOB_RANKS, RANK_LABELS, Monitoring, alerts, duration, files, hang_window_s, targets, write_monitoring,
)
from ascend_pd.plan import Plan, build_plan
from ascend_pd.scripts.launch import restart_bound_s
from ascend_pd.status import HitRates, Timeouts, collect_status
from proxy_key import AUTH
from status_support import (Procs, clean_env, have_etcd, http_ok, plan_of, start_etcd, start_proxy, start_ranks,
                            wait_until)
from test_status import COUNTERS, stack
from ports import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
STACKS = ("a2-8node", "a3-4node")
STEP = 5  # seconds between samples of the unit tests' series = the default scrape interval
SLOW = 30  # ... of the series over the long windows (rate window, 1 h baseline): evaluations are costly

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="needs promtool (apt-get install prometheus)")


def committed(name: str) -> Plan:
    return build_plan(load_stack(name), name)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------------------------
# Generated files


def test_settings_follow_the_stack_file_conventions():
    m = Monitoring.model_validate({"scrapeIntervalS": 1, "hitRateDropPercent": 50})
    assert (m.scrape_interval_s, m.hit_rate_drop_percent, m.alert_for_s) == (1, 50, 120)
    d = Monitoring()
    assert (d.scrape_interval_s, d.rate_window_s, d.baseline_window_s, d.hit_rate_drop_percent, d.alert_for_s) == (
        5, 300, 3600, 30, 120)
    for bad in ({"scrape_interval_s": 5}, {"scrapeIntervalS": 16}, {"scrapeIntervalS": "5"}, {"typo": 1},
                {"hitRateDropPercent": 0}, {"exporter": "10.0.0.9"}, {"exporter": "x y:9478"},
                {"exporter": "h:65536"}, {"nodeExporterPort": 0}, {"decodeSelfPrefillPercent": 0}):
        with pytest.raises(ValueError):
            Monitoring.model_validate(bad)
    # Windows are checked against each other: four scrapes in a rate window, a baseline twice as long.
    assert Monitoring(scrapeIntervalS=1, rateWindowS=4, baselineWindowS=600).rate_window_s == 4
    with pytest.raises(ValueError, match=r"rateWindowS 59 holds fewer than four scrapes.*at least 60"):
        Monitoring(scrapeIntervalS=15, rateWindowS=59)
    with pytest.raises(ValueError, match=r"baselineWindowS 3600 is shorter than twice .*at least 3800"):
        Monitoring(rateWindowS=1900)
    assert Monitoring(exporter="mon-1.example:9478", nodeExporterPort=None).node_exporter_port is None
    assert all(f.description and f.alias for f in Monitoring.model_fields.values())
    assert (duration(3600), duration(300), duration(90), duration(0)) == ("1h", "5m", "90s", "0s")


@pytest.mark.parametrize("name", STACKS)
def test_targets_cover_every_rank_and_etcd(name):
    plan = committed(name)
    t = targets(plan)
    assert sorted(t) == ["decode.json", "etcd.json", "nodes.json", "prefill.json"]
    assert t["nodes.json"] == [{"targets": [f"{n.address}:9100"], "labels": {"stack": name, "role": "node", "node": n.name}}
                               for n in plan.nodes]
    assert sorted(targets(plan, Monitoring(nodeExporterPort=None))) == ["decode.json", "etcd.json", "prefill.json"]
    with_exporter = targets(plan, Monitoring(exporter="10.9.0.1:9478"))["exporter.json"]
    assert with_exporter == [{"targets": ["10.9.0.1:9478"], "labels": {"stack": name}}]
    ranks = t["prefill.json"] + t["decode.json"]
    assert [e["targets"] for e in ranks] == [[f"{r.address}:{r.port}"] for r in plan.ranks]
    for e, r in zip(ranks, plan.ranks):
        assert e["labels"] == {"stack": name, "role": r.role, "instance": r.instance_name, "dp_rank": str(r.dp_rank),
                               "node": r.node, "rank": r.name}
    assert t["etcd.json"] == [{"targets": [plan.etcd.endpoint],
                               "labels": {"stack": name, "role": "etcd", "node": plan.etcd.node}}]
    text = files(plan)["prometheus.yml"]
    assert "no /metrics" in text and "no Prometheus endpoint" in text  # says why proxy and workers are not scraped
    assert "set monitoring.exporter" in text  # ... and what watches them
    assert "`ascend-pd exporter` reports" in files(plan, Monitoring(exporter="h:1"))["prometheus.yml"]
    assert str(plan.proxy.port) not in json.dumps(t) and plan.workers[0].address not in json.dumps(t)


@needs_promtool
@pytest.mark.parametrize("name", STACKS)
def test_promtool_checks_config_and_rules(name, tmp_path):
    plan = committed(name)
    m = Monitoring(exporter="10.9.0.1:9478")
    written = write_monitoring(plan, m, tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == [
        "prometheus.yml", "rules/alerts.yml", "rules/recording.yml", "targets/decode.json", "targets/etcd.json",
        "targets/exporter.json", "targets/nodes.json", "targets/prefill.json"]
    done = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS: 2 rule files found" in done.stdout, done.stdout + done.stderr
    done = promtool("check", "rules", "rules/recording.yml", "rules/alerts.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # 7 cluster alerts, node_exporter down and huge pages (both stacks reserve them), 7 of the exporter
    assert len(alerts(plan, m)) == 16 and f"SUCCESS: {len(alerts(plan, m))} rules found" in done.stdout
    assert len(alerts(plan)) == 9 and len(alerts(plan, Monitoring(nodeExporterPort=None))) == 7
    cfg = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert cfg["global"] == {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"}
    assert cfg["rule_files"] == ["rules/recording.yml", "rules/alerts.yml"]
    assert [(j["job_name"], j["file_sd_configs"][0]["files"]) for j in cfg["scrape_configs"]] == [
        (JOB_RANKS, ["targets/prefill.json", "targets/decode.json"]), (JOB_ETCD, ["targets/etcd.json"]),
        ("ascend-pd-node", ["targets/nodes.json"]), ("ascend-pd-exporter", ["targets/exporter.json"])]
    for rule in yaml.safe_load((tmp_path / "rules/alerts.yml").read_text())["groups"][0]["rules"]:
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}
        runbook = rule["annotations"]["runbook"]
        # Each runbook names a command that confirms it: status, doctor, or a read of the endpoint itself.
        assert "\n" not in runbook and re.search(
            rf"Confirm: `(ascend-pd (status|doctor) --stack {name}|curl -s http)", runbook), runbook
    hung = next(a for a in alerts(plan) if a.name == "AscendPdRankHung")
    assert hung.for_s == plan.cfg.hang.seconds  # the stack's hang.seconds


# ---------------------------------------------------------------------------------------------
# promtool unit tests of every alert


def promql(metric: str, labels: dict) -> str:
    return metric + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def series(metric: str, labels: dict, values) -> dict:
    return {"series": promql(metric, labels), "values": " ".join(str(v) for v in values)}


def flat(value, n: int) -> list:
    return [value] * n


def rising(start, step, n: int) -> list:
    return [start + step * i for i in range(n)]


def rank_labels(plan: Plan, i: int) -> dict:
    r = plan.ranks[i]
    return {"job": JOB_RANKS, "stack": plan.stack, "role": r.role, "instance": r.instance_name,
            "dp_rank": str(r.dp_rank), "node": r.node, "rank": r.name, "engine": str(r.dp_rank), "model_name": "m"}


def expected(plan: Plan, monitoring: Monitoring, name: str, labels: dict) -> dict:
    """The alert as promtool reports it: its labels and its annotations with $labels filled in."""
    a = next(a for a in alerts(plan, monitoring) if a.name == name)

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)

    return {"exp_labels": {**labels, "severity": a.severity},
            "exp_annotations": {"summary": fill(a.summary), "description": fill(a.description),
                                "runbook": fill(a.runbook)}}


def alert_tests(plan: Plan, m: Monitoring) -> tuple[list[dict], list[dict]]:
    """promtool test groups: each alert fires for one series and not for its healthy neighbours. Two lists:
    the groups that need evaluations every scrape (STEP), and those over the long windows (every SLOW s)."""
    s = plan.stack
    hang = plan.cfg.hang.seconds
    tests = []

    # Rank down: one rank's target fails, another's answers.
    n = (m.alert_for_s + 60) // STEP
    down, alive = rank_labels(plan, 0), rank_labels(plan, 1)
    up_labels = [{k: v for k, v in lab.items() if k not in ("engine", "model_name")} for lab in (down, alive)]
    tests.append({"interval": f"{STEP}s", "input_series": [series("up", up_labels[0], flat(0, n)),
                                                            series("up", up_labels[1], flat(1, n))],
                  "alert_rule_test": [
                      {"eval_time": f"{max(m.alert_for_s - STEP, 0)}s", "alertname": "AscendPdRankDown", "exp_alerts": []}
                      if m.alert_for_s >= STEP else None,
                      {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdRankDown",
                       "exp_alerts": [expected(plan, m, "AscendPdRankDown", up_labels[0])]}]})

    # Rank hung: busy with both counters flat; busy and generating (healthy); idle; busy and flat for less
    # than hang.seconds before a token moved (its clock starts again).
    n = (hang + 120) // STEP
    hung, busy, idle, slow = (rank_labels(plan, i) for i in range(4))
    moved_at = (hang - 30) // STEP  # flat until then, one step of tokens, flat again

    def counters(lab: dict, running, tokens) -> list[dict]:
        return [series("vllm:num_requests_running", lab, running), series("vllm:generation_tokens_total", lab, tokens),
                series("vllm:request_success_total", {**lab, "finished_reason": "length"}, flat(7, n)),
                series("vllm:request_success_total", {**lab, "finished_reason": "stop"}, flat(2, n))]

    rank_only = lambda lab: {k: lab[k] for k in RANK_LABELS}  # noqa: E731 - the hang alert's labels
    tests.append({"interval": f"{STEP}s", "input_series": [
        *counters(hung, flat(2, n), flat(500, n)),
        *counters(busy, flat(2, n), rising(500, 40, n)),
        *counters(idle, flat(0, n), flat(500, n)),
        *counters(slow, flat(1, n), flat(500, moved_at) + flat(501, n - moved_at)),
    ], "alert_rule_test": [
        {"eval_time": f"{hang - STEP}s", "alertname": "AscendPdRankHung", "exp_alerts": []},  # not before hang.seconds
        {"eval_time": f"{hang + 2 * STEP}s", "alertname": "AscendPdRankHung",
         "exp_alerts": [expected(plan, m, "AscendPdRankHung", rank_only(hung))]},
    ]})

    fast, tests = tests, []
    # Decode-only fallback, per decode rank: per scrape it finishes requests and is asked for 1000 prompt tokens, of
    # which it receives EH from prefill and finds LH in its own cache. Each case in a group of its own (same labels).
    n = (m.rate_window_s + m.alert_for_s + 120) // SLOW
    dec = rank_labels(plan, plan.ranks.index(plan.ranks_of("decode")[0]))

    def decode_series(successes, queried, received, local) -> list[dict]:
        return [series("vllm:request_success_total", {**dec, "finished_reason": "length"}, successes),
                series("vllm:request_success_total", {**dec, "finished_reason": "abort"}, flat(0, n)),
                series("vllm:external_prefix_cache_queries_total", dec, rising(0, queried, n)),
                series("vllm:external_prefix_cache_hits_total", dec, rising(4000, received, n)),
                series("vllm:prefix_cache_hits_total", dec, rising(0, local, n))]

    fires = [expected(plan, m, "AscendPdDecodeOnlyFallback", rank_only(dec))]
    at = f"{(n - 1) * SLOW}s"
    assert m.decode_self_prefill_percent == 25
    for case in (
        (rising(10, 1, n), 1000, 0, 0, fires),  # full fallback: nothing received
        (rising(10, 1, n), 1000, 0, 900, fires),  # full fallback on repeated prompts: still nothing received
        (rising(10, 1, n), 1000, 600, 0, fires),  # partial: 40 % computed by decode itself
        (rising(10, 1, n), 1000, 900, 100, []),  # healthy: received what its cache lacked
        (rising(10, 1, n), 1000, 800, 0, []),  # 20 %: under decodeSelfPrefillPercent
        (flat(10, n), 0, 0, 0, []),  # idle
    ):
        successes, queried, received, local, exp = case
        tests.append({"interval": f"{SLOW}s", "input_series": decode_series(successes, queried, received, local),
                      "alert_rule_test": [{"eval_time": at, "alertname": "AscendPdDecodeOnlyFallback",
                                           "exp_alerts": exp}]})

    # Request errors, per instance: 1 error in 11 finished (9 % > errorPercent 5); client aborts only; 1 in 101.
    pre0 = rank_labels(plan, 0)
    inst = {k: pre0[k] for k in ("stack", "role", "instance")}
    for length, error, abort, exp in ((10, 1, 0, [expected(plan, m, "AscendPdRequestErrors", inst)]),
                                      (10, 0, 5, []), (100, 1, 0, [])):
        tests.append({"interval": f"{SLOW}s", "input_series": [
            series("vllm:request_success_total", {**pre0, "finished_reason": reason}, rising(0, per, n))
            for reason, per in (("length", length), ("error", error), ("abort", abort))],
            "alert_rule_test": [{"eval_time": at, "alertname": "AscendPdRequestErrors", "exp_alerts": exp}]})

    # KV pool hit-rate drop: the prefill ranks' external hit rate falls from 80 % to 20 % for the last 10 minutes;
    # steady at 80 %; and a fall from a baseline below minBaselinePercent.
    n = (m.baseline_window_s + 1200) // SLOW
    cut = n - 600 // SLOW
    pre = [rank_labels(plan, i) for i, r in enumerate(plan.ranks) if r.role == "prefill"][:2]

    def pool(before: int, after: int) -> list[dict]:
        hits = [before * min(i, cut) + after * max(i - cut, 0) for i in range(n)]
        return [x for lab in pre for x in (series("vllm:external_prefix_cache_queries_total", lab, rising(0, 100, n)),
                                           series("vllm:external_prefix_cache_hits_total", lab, hits))]

    at = f"{(n - 1) * SLOW}s"
    cases = ((80, 20, [expected(plan, m, "AscendPdKvPoolHitRateDrop", {"stack": s})]), (80, 80, []),
             (max(m.min_baseline_percent - 1, 0), 0, []))
    for before, after, exp in cases:
        tests.append({"interval": f"{SLOW}s", "input_series": pool(before, after),
                      "alert_rule_test": [{"eval_time": at, "alertname": "AscendPdKvPoolHitRateDrop", "exp_alerts": exp}]})

    slow = tests
    # etcd down and without a leader: one target each way.
    n = (m.alert_for_s + 60) // STEP
    bad, good = ({"job": JOB_ETCD, "stack": s, "role": "etcd", "node": node} for node in (plan.etcd.node, "spare"))
    fast.append({"interval": f"{STEP}s", "input_series": [
        series("up", bad, flat(0, n)), series("up", good, flat(1, n)),
        series("etcd_server_has_leader", bad, flat(0, n)), series("etcd_server_has_leader", good, flat(1, n))],
        "alert_rule_test": [
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdEtcdDown",
             "exp_alerts": [expected(plan, m, "AscendPdEtcdDown", bad)]},
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdEtcdNoLeader",
             "exp_alerts": [expected(plan, m, "AscendPdEtcdNoLeader", bad)]}]})

    # node_exporter: one node without it, one whose huge pages were lost (a reboot), one as planned.
    n = (m.alert_for_s + 60) // STEP
    page = 2 * 2 ** 20
    planned = plan.cfg.hugepages.gib * 2 ** 30 // page
    lost, gone, kept = ({"job": "ascend-pd-node", "stack": s, "role": "node", "node": nd.name} for nd in plan.nodes[:3])
    fast.append({"interval": f"{STEP}s", "input_series": [
        series("up", gone, flat(0, n)), series("up", lost, flat(1, n)), series("up", kept, flat(1, n)),
        *(series("node_memory_HugePages_Total", lab, flat(pages, n)) for lab, pages in ((lost, planned - 1), (kept, planned))),
        *(series("node_memory_Hugepagesize_bytes", lab, flat(page, n)) for lab in (lost, kept))],
        "alert_rule_test": [
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdNodeExporterDown",
             "exp_alerts": [expected(plan, m, "AscendPdNodeExporterDown", gone)]},
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdHugepagesBelowPlan",
             "exp_alerts": [expected(plan, m, "AscendPdHugepagesBelowPlan", lost)]}]})

    # `ascend-pd exporter`: down; and up with one worker unregistered, one slot held past the restart bound and
    # one below it, a failed rollout mark, the proxy down and the smoke failing. Then all healthy.
    exp = {"job": "ascend-pd-exporter", "stack": s}
    bound = restart_bound_s(plan.cfg)
    w0, w1 = ({**exp, "node": w.node, "address": w.address} for w in plan.workers[:2])
    stuck, fine = ({**exp, "role": i.role, "instance": i.name} for i in plan.instances[:2])
    failed = {**exp, "role": "prefill", "instance": plan.instances_of("prefill")[0].name}
    healthy = [series("up", exp, flat(1, n)), series("ascend_pd_worker_registered", w1, flat(1, n)),
               series("ascend_pd_proxy_up", exp, flat(1, n)), series("ascend_pd_smoke_success", exp, flat(1, n)),
               series("ascend_pd_rollout_slot_held_seconds", fine, rising(10, STEP, n))]
    fast.append({"interval": f"{STEP}s", "input_series": [
        *healthy, series("ascend_pd_worker_registered", w0, flat(0, n)),
        series("ascend_pd_rollout_slot_held_seconds", stuck, rising(bound - 2 * STEP, STEP, n)),
        series("ascend_pd_rollout_failed", failed, flat(1, n))],
        "alert_rule_test": [
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdWorkerMissing",
             "exp_alerts": [expected(plan, m, "AscendPdWorkerMissing", w0)]},
            {"eval_time": f"{STEP}s", "alertname": "AscendPdRolloutStuck", "exp_alerts": []},  # not yet past the bound
            {"eval_time": f"{3 * STEP}s", "alertname": "AscendPdRolloutStuck",
             "exp_alerts": [expected(plan, m, "AscendPdRolloutStuck", stuck)]},
            {"eval_time": "0s", "alertname": "AscendPdRolloutFailed",
             "exp_alerts": [expected(plan, m, "AscendPdRolloutFailed", failed)]},
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdExporterDown", "exp_alerts": []},
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdProxyDown", "exp_alerts": []},
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": "AscendPdSmokeFailing", "exp_alerts": []}]})
    fast.append({"interval": f"{STEP}s", "input_series": [
        series("up", exp, flat(0, n)), series("ascend_pd_proxy_up", exp, flat(0, n)),
        series("ascend_pd_smoke_success", exp, flat(0, n))],
        "alert_rule_test": [
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": name, "exp_alerts": [expected(plan, m, name, exp)]}
            for name in ("AscendPdExporterDown", "AscendPdProxyDown", "AscendPdSmokeFailing")] + [
            # The exporter down: no series of it, so nothing of what it reports fires (only ExporterDown)
            {"eval_time": f"{m.alert_for_s + 30}s", "alertname": name, "exp_alerts": []}
            for name in ("AscendPdWorkerMissing", "AscendPdRolloutStuck", "AscendPdRolloutFailed",
                         "AscendPdSmokeStale")]})
    # The smoke's last run: moving every smokeIntervalS (time() is the evaluation time in promtool), then stuck.
    every = m.smoke_interval_s
    stale_after = 3 * every + 60
    n = (stale_after + 4 * every) // STEP
    moving = [(i * STEP // every) * every for i in range(n)]  # the end of the latest smoke
    stuck_at = 2 * every
    fast.append({"interval": f"{STEP}s", "input_series": [
        series("ascend_pd_smoke_last_run_timestamp_seconds", exp, [min(t, stuck_at) for t in moving])],
        "alert_rule_test": [
            {"eval_time": f"{stuck_at + stale_after}s", "alertname": "AscendPdSmokeStale", "exp_alerts": []},
            {"eval_time": f"{stuck_at + stale_after + STEP}s", "alertname": "AscendPdSmokeStale",
             "exp_alerts": [expected(plan, m, "AscendPdSmokeStale", exp)]}]})
    fast.append({"interval": f"{STEP}s", "input_series": [
        series("ascend_pd_smoke_last_run_timestamp_seconds", exp, moving)],
        "alert_rule_test": [{"eval_time": f"{(n - 1) * STEP}s", "alertname": "AscendPdSmokeStale", "exp_alerts": []}]})
    for t in fast + slow:
        t["alert_rule_test"] = [x for x in t["alert_rule_test"] if x is not None]
    return fast, slow


def ratio_tests(plan: Plan) -> list[dict]:
    """The recorded since-start ratios for test_status' hand-set counters: the numbers status computes
    (its EXPECTED); decode gets no effective ratio, the cluster is the prompt side."""
    s = plan.stack
    pre, dec = plan.ranks_of("prefill")[:2], plan.ranks_of("decode")[:2]
    names = ("prefill-0-r0", "prefill-0-r1", "decode-0-r0", "decode-0-r1")
    inputs = []
    for r, name in zip((*pre, *dec), names):
        lab = rank_labels(plan, plan.ranks.index(r))
        lab["instance"] = f"{r.role}-x"  # both ranks of a role in one instance, as test_status' small stack
        inputs += [series(metric, lab, flat(v, 3)) for metric, v in COUNTERS[name].items()]
    p = {"stack": s, "role": "prefill"}
    d = {"stack": s, "role": "decode"}
    want = [
        ("stack:vllm_prefix_cache_hit_ratio:since_start", {"stack": s}, 1750 / 4000),
        ("stack:vllm_external_prefix_cache_hit_ratio:since_start", {"stack": s}, 300 / 2250),
        ("stack:vllm_effective_prefix_cache_hit_ratio:since_start", {"stack": s}, 2050 / 4000),
        ("stack_role:vllm_effective_prefix_cache_hit_ratio:since_start", p, 2050 / 4000),
        ("stack_role:vllm_external_prefix_cache_hit_ratio:since_start", d, 940 / 1000),
        ("stack_role_instance:vllm_external_prefix_cache_hit_ratio:since_start", {**d, "instance": "decode-x"}, 0.94),
    ]
    tests = [{"expr": promql(name, lab), "eval_time": "10s", "exp_samples": [{"labels": promql(name, lab), "value": v}]}
             for name, lab, v in want]
    for absent in ("stack_role:vllm_effective_prefix_cache_hit_ratio:since_start{role=\"decode\"}",
                   "stack_role:vllm_prefix_cache_hit_ratio:since_start{role=\"decode\"}"):  # 0 local queries
        tests.append({"expr": absent, "eval_time": "10s", "exp_samples": []})
    return [{"interval": f"{SLOW}s", "input_series": inputs, "promql_expr_test": tests}]


@needs_promtool
@pytest.mark.parametrize("name", STACKS)
def test_promtool_unit_tests_of_every_alert(name, tmp_path):
    plan = committed(name)
    m = Monitoring(exporter="10.9.0.1:9478")
    write_monitoring(plan, m, tmp_path)
    fast, slow = alert_tests(plan, m)
    slow += ratio_tests(plan)
    tested = {t["alertname"] for g in fast + slow for t in g.get("alert_rule_test", [])}
    assert tested == {a.name for a in alerts(plan, m)}  # every alert; each test group holds series that must not fire
    for name, every, groups in (("fast.yml", STEP, fast), ("slow.yml", SLOW, slow)):
        (tmp_path / name).write_text(yaml.safe_dump(
            {"rule_files": ["rules/recording.yml", "rules/alerts.yml"], "evaluation_interval": f"{every}s",
             "tests": groups}, sort_keys=False, width=1 << 20))
    done = promtool("test", "rules", "fast.yml", "slow.yml", cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout[-6000:] + done.stderr[-6000:]


def test_hang_window_holds_enough_scrapes():
    assert hang_window_s(Monitoring()) == 20 and hang_window_s(Monitoring(scrapeIntervalS=1)) == 4


# ---------------------------------------------------------------------------------------------
# A real Prometheus scraping a small loopback cluster

ADDRS = {"n0": "127.0.2.41", "n1": "127.0.2.42"}
FAST = Timeouts(connect_s=1.0, request_s=3.0, smoke_s=5.0)
# test_status' counters, plus requests in flight: running/waiting per rank.
GAUGES = {"prefill-0-r0": (3, 1), "prefill-0-r1": (0, 2), "decode-0-r0": (5, 0), "decode-0-r1": (1, 4)}
LIVE = {name: {**c, "vllm:num_requests_running": GAUGES[name][0], "vllm:num_requests_waiting": GAUGES[name][1]}
        for name, c in COUNTERS.items()}
PROM_READY_S = 30
RECORDED_S = 30


class PromAPI:
    def __init__(self, url: str):
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False

    def query(self, q: str) -> list[dict]:
        r = self.session.get(f"{self.url}/api/v1/query", params={"query": q}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def one(self, q: str) -> float:
        result = self.query(q)
        assert len(result) == 1, (q, result)
        return float(result[0]["value"][1])


def start_prometheus(procs: Procs, config: Path, data: Path) -> PromAPI:
    for attempt in range(3):  # a free port can be taken between the check and prometheus' bind
        port = free_port()
        p = procs.start("prometheus", [
            PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1h"],
            clean_env())
        api = PromAPI(f"http://127.0.0.1:{port}")
        try:
            wait_until(lambda: p.poll() is None and api.session.get(f"{api.url}/-/ready", timeout=1).status_code == 200,
                       PROM_READY_S, "prometheus")
            return api
        except TimeoutError:
            log = procs.log("prometheus")
            procs.stop("prometheus")
            if "address already in use" not in log or attempt == 2:
                raise RuntimeError(f"prometheus did not start:\n{log}") from None
    raise AssertionError("unreachable")


def close(got: float, want) -> bool:
    return want is not None and math.isfinite(got) and abs(got - want) <= 1e-9


@pytest.mark.integration
@pytest.mark.skipif(not (Path(PROMETHEUS).exists() and have_etcd()), reason="needs Debian prometheus and etcd")
def test_prometheus_records_what_status_computes(tmp_path):
    values = stack(tmp_path, ADDRS, etcd_port=12479, worker_port=18581, port_base=17200, proxy_port=18120)
    plan = plan_of(values, "mon")
    m = Monitoring(scrapeIntervalS=1, rateWindowS=60, alertForS=0)
    write_monitoring(plan, m, tmp_path / "monitoring")
    procs = Procs(tmp_path / "logs")
    try:
        start_etcd(plan, procs)
        start_ranks(plan, procs, counters=LIVE, FAKE_VLLM_HISTOGRAMS="1")
        api = start_prometheus(procs, tmp_path / "monitoring" / "prometheus.yml", tmp_path / "prom-data")
        rep = collect_status(plan, timeouts=FAST, smoke=False)  # no workers, no proxy: only the rates matter here
        want = rep.since_start
        assert want.cluster.ranks == 2 and want.cluster.effective_rate == 2050 / 4000  # the prompt side

        # Every recorded ratio equals status' own, exactly; requests in flight per instance are status' sums.
        # The first evaluations may precede some targets' first scrape: wait until the numbers agree.
        counters = {r.name: r.counters for r in rep.ranks}
        rows = [("stack", {}, want.cluster)]
        rows += [("stack_role", {"role": role}, want.roles[role]) for role in ("prefill", "decode")]
        rows += [("stack_role_instance", {"role": i.role, "instance": i.name},
                  HitRates.of([counters[r.name] for r in i.ranks], prompt_side=i.role == "prefill"))
                 for i in plan.instances]

        def mismatches() -> list:
            bad = []
            for level, labels, h in rows:
                sel = promql("", {"stack": "mon", **labels})
                for metric, rate in (("vllm_prefix_cache_hit_ratio", h.local_rate),
                                     ("vllm_external_prefix_cache_hit_ratio", h.external_rate),
                                     ("vllm_effective_prefix_cache_hit_ratio", h.effective_rate)):
                    q = f"{level}:{metric}:since_start{sel}"
                    got = [float(x["value"][1]) for x in api.query(q)]
                    # status: None = undefined (no local queries on decode, or not the prompt side): not recorded
                    if (got != [] if rate is None else not (len(got) == 1 and close(got[0], rate))):
                        bad.append((q, got, rate))
            for i in rep.requests:
                for what, value in (("running", i.requests.running), ("waiting", i.requests.waiting)):
                    q = f"stack_role_instance:vllm_num_requests_{what}:sum" + promql("", {"instance": i.instance})
                    got = [float(x["value"][1]) for x in api.query(q)]
                    if got != [value]:
                        bad.append((q, got, value))
            return bad

        try:
            wait_until(lambda: not mismatches(), RECORDED_S, "recorded = status", interval=0.5)
        except TimeoutError:
            assert mismatches() == []
        assert api.one('stack_role:vllm_num_requests_running:sum{role="decode"}') == 6

        # Every rank's target carries the plan's labels; etcd is scraped on its client URL and has a leader.
        ups = {x["metric"]["rank"]: x["metric"] for x in api.query("up{job='ascend-pd-vllm'}")}
        assert set(ups) == {r.name for r in plan.ranks}
        for r in plan.ranks:
            assert {k: ups[r.name][k] for k in RANK_LABELS} == {
                "stack": "mon", "role": r.role, "instance": r.instance_name, "dp_rank": str(r.dp_rank),
                "node": r.node, "rank": r.name}
        wait_until(lambda: api.query("up{job='ascend-pd-etcd'} == 1"), RECORDED_S, "etcd scraped", interval=0.5)
        assert api.one("etcd_server_has_leader{job='ascend-pd-etcd',stack='mon'}") == 1

        # Latency quantiles from the fakes' histograms (vLLM's names and buckets), once requests finished.
        s = requests.Session()
        s.trust_env = False
        for r in plan.ranks:
            body = {"prompt": "hello " * 20, "max_tokens": 4}
            s.post(f"http://{r.address}:{r.port}/v1/completions", json=body, timeout=10).raise_for_status()
        q = 'stack_role:vllm_{}:quantile_rate1m{{stack="mon",quantile="0.99"}}'
        for hist, top in (("time_to_first_token_seconds", 2560), ("inter_token_latency_seconds", 80),
                          ("e2e_request_latency_seconds", 7680)):
            got = wait_until(lambda: len(api.query(q.format(hist))) == 2 and api.query(q.format(hist)),
                             RECORDED_S, f"recorded {hist}", interval=0.5)
            assert all(0 < float(x["value"][1]) <= top for x in got), got

        # A rank that stops answering fires AscendPdRankDown (alertForS 0) with its labels.
        gone = plan.ranks_of("decode")[1]
        procs.stop(f"rank-{gone.name}")
        firing = wait_until(lambda: api.query('ALERTS{alertname="AscendPdRankDown",alertstate="firing"}'),
                            RECORDED_S, "AscendPdRankDown", interval=0.5)
        assert [a["metric"]["rank"] for a in firing] == [gone.name]
    finally:
        procs.stop_all()


LIVE_ADDRS = {"n0": "127.0.9.41", "n1": "127.0.9.42"}  # this test's own loopback addresses
FIRE_SLACK_S = 10  # scheduling under load: scrapes and evaluations late by this much at most


@pytest.mark.integration
@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs Debian prometheus")
def test_decode_only_fallback_fires_live(tmp_path):
    """Requests flow through the release's PD proxy to fake ranks that hand KV over as Mooncake does; a
    real Prometheus records every decode's self-prefill ratio as 0. One decode rank is switched to ignore
    the KV it is given (it computes the prompts itself): the recorded ratio rises and
    AscendPdDecodeOnlyFallback fires for that rank alone, within rateWindowS + alertForS of the switch."""
    values = stack(tmp_path, LIVE_ADDRS, etcd_port=12579, worker_port=18681, port_base=17900, proxy_port=18190)
    plan = plan_of(values, "mon")
    m = Monitoring(scrapeIntervalS=1, rateWindowS=8, baselineWindowS=600, alertForS=5, nodeExporterPort=None)
    write_monitoring(plan, m, tmp_path / "monitoring")
    procs = Procs(tmp_path / "logs")
    stop = threading.Event()
    answers: list[int] = []

    def traffic() -> None:  # unique prompts: no prefix-cache hit anywhere, every prompt token is the prefill's
        s = requests.Session()
        s.trust_env = False
        while not stop.is_set():
            body = {"model": plan.cfg.model.served_name, "prompt": f"{uuid.uuid4().hex} " * 40, "max_tokens": 2}
            try:
                answers.append(s.post(f"{plan.proxy.url}/v1/completions", json=body, headers=AUTH,
                                      timeout=10).status_code)
            except requests.RequestException:
                answers.append(0)
            stop.wait(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    try:
        start_ranks(plan, procs)
        start_proxy(plan, procs)
        api = start_prometheus(procs, tmp_path / "monitoring" / "prometheus.yml", tmp_path / "prom-data")
        sender.start()
        decode = plan.ranks_of("decode")
        ratio = f'stack_role_instance:vllm_decode_self_prefill_ratio:rate8s{{instance="{decode[0].instance_name}"}}'
        fallback = 'ALERTS{alertname="AscendPdDecodeOnlyFallback"}'
        # Healthy: every decode prompt token came from prefill, the ratio is 0 (to rounding), no alert at all.
        wait_until(lambda: api.query(ratio) and abs(float(api.query(ratio)[0]["value"][1])) < 1e-9
                   and api.query(f"up{{job='{JOB_RANKS}'}} == 1") and len(api.query(f"up{{job='{JOB_RANKS}'}} == 1")) == 4,
                   RECORDED_S, "a healthy self-prefill ratio of 0", interval=0.5)
        time.sleep(m.rate_window_s)  # a whole window of healthy traffic: nothing pending
        assert api.query(fallback) == [] and abs(float(api.query(ratio)[0]["value"][1])) < 1e-9
        assert set(answers) == {200}, answers

        # The release proxy sends each request to the least loaded decode rank: one at a time, that is always the
        # same one. Switch the rank that serves (the other must stay quiet).
        served = {x["metric"]["rank"]: float(x["value"][1]) for x in api.query(
            f"increase(vllm:external_prefix_cache_queries_total{{role='decode'}}[{duration(m.rate_window_s)}])")}
        switched = next(r for r in decode if served.get(r.name, 0) == max(served.values()) > 0)
        r = requests.post(f"http://{switched.address}:{switched.port}/fake/fault", json={"fault": "ignore-kv"},
                          timeout=5, proxies={"http": None})
        assert r.json() == {"fault": "ignore-kv"}
        t0 = time.monotonic()
        bound = m.rate_window_s + m.alert_for_s + FIRE_SLACK_S
        firing = wait_until(lambda: api.query(fallback.replace("}", ',alertstate="firing"}')), bound, "AscendPdDecodeOnlyFallback",
                            interval=0.25)
        took = time.monotonic() - t0
        assert [a["metric"]["rank"] for a in firing] == [switched.name]
        assert took >= m.alert_for_s  # it waited its `for`
        assert 0 < float(api.query(ratio)[0]["value"][1]) <= 1
        print(f"AscendPdDecodeOnlyFallback fired {took:.1f}s after the switch (for {m.alert_for_s}s, "
              f"window {m.rate_window_s}s)")
        assert set(answers) == {200}  # users saw nothing but slower answers: the fallback is silent
    finally:
        stop.set()
        sender.join(timeout=15)
        procs.stop_all()


NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"


@pytest.mark.integration
@pytest.mark.skipif(not (Path(PROMETHEUS).exists() and Path(NODE_EXPORTER).exists()),
                    reason="needs Debian prometheus and prometheus-node-exporter")
def test_huge_pages_alert_reads_the_real_node_exporter(tmp_path):
    """The names and units the huge pages rule reads are node_exporter's own: a real node_exporter (this
    machine's /proc/meminfo) on one node, none on the other. The plan asks 1 GiB more huge pages than this
    host has: AscendPdHugepagesBelowPlan fires for the first node, AscendPdNodeExporterDown for the second."""
    have = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("Hugetlb:"))  # bytes of huge pages reserved, of every size
    values = stack(tmp_path, {"n0": "127.0.9.43", "n1": "127.0.9.44"}, etcd_port=12679, worker_port=18781,
                   port_base=17950, proxy_port=18191)
    values["hugepages"] = {"gib": have // 2 ** 30 + 1}
    plan = plan_of(values, "mon")
    port = free_port()
    m = Monitoring(scrapeIntervalS=1, rateWindowS=8, baselineWindowS=600, alertForS=0, nodeExporterPort=port)
    write_monitoring(plan, m, tmp_path / "monitoring")
    procs = Procs(tmp_path / "logs")
    try:
        procs.start("node-exporter", [NODE_EXPORTER, f"--web.listen-address=127.0.9.43:{port}",
                                      "--collector.disable-defaults", "--collector.meminfo"], clean_env())
        wait_until(lambda: http_ok(f"http://127.0.9.43:{port}/metrics"), PROM_READY_S, "node_exporter")
        api = start_prometheus(procs, tmp_path / "monitoring" / "prometheus.yml", tmp_path / "prom-data")
        firing = 'ALERTS{{alertname="{}",alertstate="firing"}}'
        below = wait_until(lambda: api.query(firing.format("AscendPdHugepagesBelowPlan")), RECORDED_S,
                           "AscendPdHugepagesBelowPlan", interval=0.5)
        assert [a["metric"]["node"] for a in below] == ["n0"]
        size = api.one('node_memory_Hugepagesize_bytes{job="ascend-pd-node",node="n0"}')
        assert size == int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                                if line.startswith("Hugepagesize:"))) * 1024  # bytes, as the rule assumes
        down = wait_until(lambda: api.query(firing.format("AscendPdNodeExporterDown")), RECORDED_S,
                          "AscendPdNodeExporterDown", interval=0.5)
        assert [a["metric"]["node"] for a in down] == ["n1"]
    finally:
        procs.stop_all()


@pytest.mark.integration
@pytest.mark.skipif(not (Path(PROMETHEUS).exists() and have_etcd()), reason="needs Debian prometheus and etcd")
def test_prometheus_reads_the_exporter_with_the_generated_config(tmp_path):
    """The exporter's job as render writes it (honor_labels), scraped by a real Prometheus: a rollout slot
    keeps the exporter's own role label, a planned worker that never registered fires
    AscendPdWorkerMissing with its node, and the proxy that is not running fires AscendPdProxyDown."""
    import etcd3gw

    from ascend_pd.exporter import Exporter, serve
    from ascend_pd.plan import rollout_prefix

    addrs = {"n0": "127.0.9.45", "n1": "127.0.9.46"}
    values = stack(tmp_path, addrs, etcd_port=12779, worker_port=18881, port_base=17980, proxy_port=18192)
    plan = plan_of(values, "mon")
    procs = Procs(tmp_path / "logs")
    server = exp = None
    try:
        start_etcd(plan, procs)
        exp = Exporter(plan, timeouts=FAST)
        server, _ = serve(exp, addrs["n0"], 0)
        m = Monitoring(scrapeIntervalS=1, rateWindowS=8, baselineWindowS=600, alertForS=0, nodeExporterPort=None,
                       exporter=f"{addrs['n0']}:{server.server_port}")
        write_monitoring(plan, m, tmp_path / "monitoring")
        c = etcd3gw.client(host=plan.etcd.address, port=plan.etcd.client_port, timeout=10)
        registered, missing = plan.workers[0], plan.workers[1]
        lease = c.lease(600)
        c.put(f"/datasystem/cluster/{registered.address}", "1764460000;ready", lease=lease)
        c.put(rollout_prefix("mon", "decode") + "0", "decode-0", lease=lease)
        api = start_prometheus(procs, tmp_path / "monitoring" / "prometheus.yml", tmp_path / "prom-data")

        held = wait_until(lambda: api.query('ascend_pd_rollout_slot_held_seconds{job="ascend-pd-exporter"}'),
                          RECORDED_S, "the slot's age", interval=0.5)
        assert [(x["metric"]["role"], x["metric"]["instance"], x["metric"]["stack"]) for x in held] == [
            ("decode", "decode-0", "mon")]  # the exporter's labels, not the target's
        assert "exported_role" not in held[0]["metric"] and "exported_stack" not in held[0]["metric"]
        firing = 'ALERTS{{alertname="{}",alertstate="firing"}}'
        worker = wait_until(lambda: api.query(firing.format("AscendPdWorkerMissing")), RECORDED_S,
                            "AscendPdWorkerMissing", interval=0.5)
        assert [(a["metric"]["node"], a["metric"]["address"]) for a in worker] == [(missing.node, missing.address)]
        proxy = wait_until(lambda: api.query(firing.format("AscendPdProxyDown")), RECORDED_S, "AscendPdProxyDown",
                           interval=0.5)
        assert [a["metric"]["stack"] for a in proxy] == ["mon"]
        assert api.query(firing.format("AscendPdExporterDown")) == []
        lease.revoke()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if exp is not None:
            exp.stop(5)
        procs.stop_all()
