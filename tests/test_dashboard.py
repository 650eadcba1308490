"""ascend_pd.dashboard: the Grafana dashboard of both committed stacks is valid, deterministic JSON whose every
PromQL expression reads only series the generated recording rules record (or that Prometheus and the targets
provide), and promtool parses every expression."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from ascend_pd.dashboard import ALERT_PREFIX, DASHBOARD_JSON, alert_names, dashboard, dashboard_json, write_dashboard
from ascend_pd.loader import load_stack
from ascend_pd.monitoring import QUANTILES, RECORDING_YML, duration, files
from ascend_pd.plan import Plan, build_plan

STACKS = ("a2-8node", "a3-4node")
PROMTOOL = shutil.which("promtool")
# Series not recorded by the rules: Prometheus' own per-target `up` and `ALERTS`, and etcd's gauge.
PROVIDED = {"up", "ALERTS", "etcd_server_has_leader"}
# What the variables stand for when an expression is handed to promtool (Grafana substitutes them).
VARIABLES = {"$stack": None, "$role": "prefill|decode", "$instance": ".*"}


def committed(name: str) -> Plan:
    return build_plan(load_stack(name), name)


def recorded_names(plan: Plan) -> set[str]:
    """The `record:` names of the rule file `render --out` writes for the plan."""
    text = files(plan, plan.cfg.monitoring)[RECORDING_YML]
    return {r["record"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "record" in r}


def panels(board: dict) -> list[dict]:
    """Every panel, rows' nested panels included (rows themselves excluded)."""
    out = []
    for p in board["panels"]:
        if p["type"] == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def exprs(board: dict) -> list[str]:
    """Every PromQL expression: the panels' targets and the instance variable's label_values selector."""
    out = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), *(\w+)\)", v["query"], re.S)
            assert m, v["query"]
            out.append(m.group(1))
    return out


KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
            "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: strip strings, label matchers, ranges, grouping clauses and
    function/aggregation calls; what identifiers remain are metric names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, variables)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range / subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"[A-Za-z_][A-Za-z0-9_]*\s*\(", "(", text)  # function and aggregation names
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {n for n in names if n.lower() not in KEYWORDS}


def test_metric_name_parser():
    assert metric_names('min by (role, instance) (up{job="x", stack="$stack"})') == {"up"}
    assert metric_names('sum(rate(a:b:c{x=~"y|z"}[5m])) / on (stack) d_total > 0 and e') == {"a:b:c", "d_total", "e"}
    assert metric_names('ALERTS{alertname=~"AscendPd.*"}') == {"ALERTS"}


@pytest.fixture(scope="module", params=STACKS)
def stack(request):
    plan = committed(request.param)
    return plan, dashboard(plan, plan.cfg.monitoring)


def test_valid_and_deterministic_json(stack, tmp_path):
    plan, board = stack
    text = dashboard_json(plan, plan.cfg.monitoring)
    assert json.loads(text) == board
    assert dashboard_json(plan, plan.cfg.monitoring) == text  # same plan, same bytes
    assert dashboard_json(committed(plan.stack), plan.cfg.monitoring) == text  # ... from a fresh plan too
    path = write_dashboard(plan, plan.cfg.monitoring, tmp_path / "monitoring")
    assert path == tmp_path / "monitoring" / DASHBOARD_JSON
    assert path.read_bytes() == text.encode()
    assert board["uid"] and len(board["uid"]) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", board["uid"])
    assert plan.stack in board["title"]
    ids = [p["id"] for p in board["panels"]] + [p["id"] for p in panels(board) if p not in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in board["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_same_bytes_in_another_process(tmp_path):
    """No dependence on hash seeds or on what else the process imported."""
    code = ("import sys; from ascend_pd.dashboard import dashboard_json; from ascend_pd.loader import load_stack; "
            "from ascend_pd.plan import build_plan; n = sys.argv[1]; p = build_plan(load_stack(n), n); "
            "sys.stdout.write(dashboard_json(p, p.cfg.monitoring))")
    name = STACKS[0]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    plan = committed(name)
    assert out == dashboard_json(plan, plan.cfg.monitoring)


def test_variables(stack):
    plan, board = stack
    by_name = {v["name"]: v for v in board["templating"]["list"]}
    assert by_name["stack"]["type"] in ("constant", "custom") and by_name["stack"]["query"] == plan.stack
    assert by_name["role"]["type"] == "custom"
    assert by_name["role"]["query"].split(",") == ["prefill", "decode"]
    inst = by_name["instance"]
    assert inst["type"] == "query"
    selector = exprs({"panels": [], "templating": {"list": [inst]}})[0]
    assert 'stack="$stack"' in selector and 'role=~"$role"' in selector
    assert metric_names(selector) <= recorded_names(plan)
    assert inst["query"].endswith(", instance)")
    assert by_name["datasource"]["type"] == "datasource" and by_name["datasource"]["query"] == "prometheus"


def test_every_expr_reads_recorded_or_provided_series(stack):
    plan, board = stack
    allowed = recorded_names(plan) | PROVIDED
    used = set()
    for expr in exprs(board):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= allowed, f"{expr!r} reads {sorted(names - allowed)}, neither recorded nor provided"
        used |= names
        assert 'stack="$stack"' in expr, f"{expr!r} does not select the stack"
    assert PROVIDED <= used
    # every family of recorded series the dashboard promises is on it
    for part in ("vllm_request_success", "vllm_request_failure", "vllm_num_requests_running",
                 "vllm_num_requests_waiting", "vllm_prefix_cache_hit_ratio", "vllm_external_prefix_cache_hit_ratio",
                 "vllm_effective_prefix_cache_hit_ratio", "vllm_time_to_first_token_seconds",
                 "vllm_inter_token_latency_seconds", "vllm_e2e_request_latency_seconds",
                 "vllm_external_prefix_cache_hits", "vllm_pd_handover_tokens", "vllm_decode_self_prefill_ratio"):
        assert any(f":{part}:" in n for n in used), part


def test_panels_for_both_roles_and_health(stack):
    plan, board = stack
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["prefill", "decode", "health"]
    # panels follow their row (rows are open): group them by the row above
    by_row: dict[str, list[dict]] = {}
    current = None
    for p in board["panels"]:
        if p["type"] == "row":
            current = p["title"]
            by_row[current] = list(p.get("panels", []))
        else:
            by_row[current].append(p)
    for role in ("prefill", "decode"):
        titles = [p["title"] for p in by_row[role]]
        for what in ("throughput", "queue", "prefix-cache hit rates", "time to first token", "inter-token latency",
                     "end-to-end latency"):
            assert f"{role}: {what}" in titles, (role, what, titles)
        for p in by_row[role]:
            for t in p["targets"]:  # the stack-level hand-over total has no role label: decode's by definition
                assert f'role="{role}"' in t["expr"] or t["expr"].startswith("stack:"), (role, t["expr"])
        latency = [p for p in by_row[role] if "latency" in p["title"] or "first token" in p["title"]]
        assert len(latency) == 3
        for p in latency:
            assert sorted(t["legendFormat"] for t in p["targets"]) == sorted(f"p{q * 100:g}" for q in QUANTILES)
            assert p["fieldConfig"]["defaults"]["unit"] == "s"
        hits = next(p for p in by_row[role] if p["title"].endswith("hit rates"))
        legends = {t["legendFormat"].split()[-1] for t in hits["targets"]}
        assert legends == ({"local", "external", "effective"} if role == "prefill" else {"local", "external"})
        served = next(p for p in by_row[role] if p["title"].endswith("throughput"))
        assert {t["legendFormat"].split()[-1] for t in served["targets"]} == {"served", "failed"}
    assert any("hand-over" in p["title"] for p in by_row["decode"])
    assert not any("hand-over" in p["title"] for p in by_row["prefill"])
    (computed,) = [p for p in by_row["decode"] if p["title"] == "decode: prompt tokens computed by decode"]
    assert [t["expr"].split("{")[0] for t in computed["targets"]] == [
        f"stack_role_instance:vllm_decode_self_prefill_ratio:rate{duration(plan.cfg.monitoring.rate_window_s)}"]
    health = {p["title"]: p for p in by_row["health"]}
    assert set(health) == {"instances up", "etcd", "firing alerts"}
    assert all("up{" in t["expr"] for t in health["instances up"]["targets"])
    assert {metric_names(t["expr"]).pop() for t in health["etcd"]["targets"]} == {"up", "etcd_server_has_leader"}
    (alerts_expr,) = [t["expr"] for t in health["firing alerts"]["targets"]]
    assert alerts_expr.startswith("ALERTS{") and f'alertname=~"{ALERT_PREFIX}.*"' in alerts_expr
    # the panel's regex covers every generated alert
    assert all(re.fullmatch(f"{ALERT_PREFIX}.*", a) for a in alert_names(plan, plan.cfg.monitoring))


def test_every_panel_has_prometheus_datasource(stack):
    _, board = stack
    for p in panels(board):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (apt-get install prometheus)")
def test_promtool_parses_every_expr(stack, tmp_path):
    plan, board = stack
    rules = []
    for i, expr in enumerate(exprs(board)):
        for var, value in VARIABLES.items():
            expr = expr.replace(var, plan.stack if value is None else value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard_check:expr_{i}:value", "expr": expr})
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout + done.stderr


def test_exporter_panels_only_where_the_exporter_is_scraped():
    plan = committed(STACKS[0])
    m = plan.cfg.monitoring.model_copy(update={"exporter": "10.9.0.1:9478"})
    board = dashboard(plan, m)
    titles = {p["title"]: p for p in panels(board)}
    assert {"proxy and P/D smoke", "openYuanrong workers"} <= set(titles)
    assert not {"proxy and P/D smoke", "openYuanrong workers"} & {p["title"] for p in panels(dashboard(plan))}
    read = {n for t in ("proxy and P/D smoke", "openYuanrong workers") for q in titles[t]["targets"]
            for n in metric_names(q["expr"])}
    assert read == {"ascend_pd_proxy_up", "ascend_pd_smoke_success", "ascend_pd_worker_registered"}
    assert all('job="ascend-pd-exporter"' in q["expr"] and 'stack="$stack"' in q["expr"]
               for t in ("proxy and P/D smoke", "openYuanrong workers") for q in titles[t]["targets"])
