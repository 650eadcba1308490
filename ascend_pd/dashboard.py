"""A Grafana dashboard for a stack, from its plan and the Prometheus rules monitoring.py generates (issue 23).

Built with grafana-foundation-sdk's typed builders (imported inside `dashboard`, so `render` without --out
does not load it). Pure but for `write_dashboard`.

Every panel reads the series `monitoring.recording_rules` records for the same plan, looked up in those
rules by level and metric (`_Recorded`): a name the rules do not record is an error here, not an empty
panel in Grafana. Besides them only what Prometheus itself provides is queried: `up` of the scrape targets,
etcd's own `etcd_server_has_leader`, and `ALERTS` of the generated alerts.

Layout: the variables `datasource` (a Prometheus data source), `stack` (constant: the plan's stack), `role`
(prefill, decode) and `instance` (the DP instances of the chosen roles, from the recorded queue series);
a row per role (throughput, queue, TTFT / inter-token / end-to-end latency p50 and p99, prefix-cache hit
rates; decode also the prefill -> decode hand-over), then a row "health" (instances up, etcd up and
leader, the firing alerts).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .monitoring import (
    CLUSTER, HISTOGRAMS, INSTANCE, JOB_ETCD, JOB_EXPORTER, JOB_RANKS, PROXY_UP, QUANTILES, ROLE, SMOKE_SUCCESS,
    WORKER_REGISTERED, Monitoring, alerts, duration, recording_rules,
)

if TYPE_CHECKING:
    from .plan import Plan

DASHBOARD_JSON = "grafana-dashboard.json"  # render --out <out> writes <out>/monitoring/grafana-dashboard.json
ROLES = ("prefill", "decode")
ALERT_PREFIX = "AscendPd"  # every alert of monitoring.alerts is named AscendPd<Something> (the tests check it)
ETCD_LEADER = "etcd_server_has_leader"  # etcd's own gauge (monitoring's AscendPdEtcdNoLeader reads it too)
# Grafana variables the queries use: the panels select with these, not with the plan's values, so one
# imported dashboard follows what the user picks.
STACK_VAR, ROLE_VAR, INSTANCE_VAR, DATASOURCE_VAR = "stack", "role", "instance", "datasource"

_W = 24  # Grafana's grid width
_H = 8  # panel height


class _Recorded:
    """The names `recording_rules(plan, monitoring)` records, by (level, metric, kind): kind "window" is the
    one over `rateWindowS` (rate<w> or quantile_rate<w>), "sum" the gauge sums."""

    def __init__(self, plan: "Plan", monitoring: Monitoring):
        self.window = duration(monitoring.rate_window_s)
        self.names: list[str] = []
        self.labels: dict[str, list[dict]] = {}
        for group in recording_rules(plan, monitoring)["groups"]:
            for rule in group["rules"]:
                name = rule["record"]
                if name not in self.labels:
                    self.names.append(name)
                    self.labels[name] = []
                self.labels[name].append(rule.get("labels", {}))

    def __call__(self, level: str, metric: str, kind: str = "window") -> str:
        def fits(op: str) -> bool:
            return op.endswith(f"rate{self.window}") if kind == "window" else op == kind

        found = [n for n in self.names if n.split(":")[:2] == [level, metric] and fits(n.split(":")[2])]
        if len(found) != 1:
            raise KeyError(f"the recording rules record {len(found)} series {level}:{metric}:<{kind}> "
                           f"(window {self.window}): {found}")
        return found[0]


def _sel(*matchers: tuple[str, str, str]) -> str:
    """A PromQL selector from (label, operator, value) matchers; values may hold Grafana variables."""
    return "{" + ", ".join(f"{label}{op}{json.dumps(value)}" for label, op, value in matchers) + "}"


def _uid(stack: str) -> str:
    """A Grafana uid (at most 40 of [A-Za-z0-9_-]) that is the same for every render of the stack."""
    uid = f"ascend-pd-{stack}"
    if re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid):
        return uid
    digest = hashlib.sha256(stack.encode()).hexdigest()[:12]
    return "ascend-pd-" + re.sub(r"[^A-Za-z0-9_-]", "-", stack)[:17] + "-" + digest


def dashboard(plan: "Plan", monitoring: Monitoring = Monitoring()) -> dict:
    """The Grafana dashboard of the stack as a JSON-ready dict (the same plan gives the same dict)."""
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    rec = _Recorded(plan, monitoring)
    w = rec.window
    ds = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
    stack_m = ("stack", "=", f"${STACK_VAR}")
    role_var_m = ("role", "=~", f"${ROLE_VAR}")
    instance_m = ("instance", "=~", f"${INSTANCE_VAR}")
    ids = iter(range(1, 1000))

    def query(expr: str, legend: str, ref: str, instant: bool = False, fmt: Optional[PromQueryFormat] = None):
        q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(ds)
        q = q.instant() if instant else q.range()
        return q.format(fmt) if fmt else q

    def graph(title: str, description: str, unit: str, queries: list, span: int = 8, ratio: bool = False):
        p = (timeseries.Panel().id(next(ids)).title(title).description(description).datasource(ds)
             .unit(unit).span(span).height(_H).fill_opacity(10).show_points(cm.VisibilityMode.NEVER)
             .legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))
        if ratio:
            p = p.min(0).max(1)
        else:
            p = p.min(0)
        for q in queries:
            p = p.with_target(q)
        return p

    def up_stat(title: str, description: str, queries: list, span: int):
        mappings = [dm.ValueMap(options={"0": dm.ValueMappingResult(text="DOWN", color="red", index=0),
                                         "1": dm.ValueMappingResult(text="UP", color="green", index=1)})]
        p = (stat.Panel().id(next(ids)).title(title).description(description).datasource(ds).span(span).height(_H)
             .color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
             .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .mappings(mappings).no_value("no target")
             .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([
                 dm.Threshold(value=None, color="red"), dm.Threshold(value=1, color="green")])))
        for q in queries:
            p = p.with_target(q)
        return p

    board = (db.Dashboard(f"ascend-pd {plan.stack}").uid(_uid(plan.stack))
             .description(f"Prefill/decode-disaggregated vLLM-Ascend stack {plan.stack}, generated by "
                          f"`ascend-pd render --out` (ascend_pd/dashboard.py) from the stack file: do not edit, "
                          f"render again. Reads the recording rules of monitoring/rules/recording.yml.")
             .tags(["ascend-pd", plan.stack]).editable().time("now-3h", "now").refresh("30s")
             .tooltip(dm.DashboardCursorSync.CROSSHAIR).timezone("browser"))

    # -- variables
    board = board.with_variable(
        db.DatasourceVariable(DATASOURCE_VAR).label("Prometheus").type("prometheus"))
    board = board.with_variable(
        db.ConstantVariable(STACK_VAR).label("stack").value(plan.stack)
        .description("The Pulumi stack this dashboard was rendered for."))
    board = board.with_variable(
        db.CustomVariable(ROLE_VAR).label("role").values(",".join(ROLES)).multi(True).include_all(True)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .options([dm.VariableOption(selected=True, text="All", value="$__all")]
                 + [dm.VariableOption(selected=False, text=r, value=r) for r in ROLES])
        .description("The roles whose instances the instance list offers (and the health row shows)."))
    queue_series = rec(INSTANCE.prefix, "vllm_num_requests_running", "sum")
    board = board.with_variable(
        db.QueryVariable(INSTANCE_VAR).label("instance").datasource(ds)
        .query(f"label_values({queue_series}{_sel(stack_m, role_var_m)}, instance)")
        .multi(True).include_all(True).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .description("DP instances (prefill-0, decode-0, ...) of the chosen roles."))

    # -- a row per role
    for role in ROLES:
        role_m = ("role", "=", role)
        per_instance = _sel(stack_m, role_m, role_var_m, instance_m)
        board = board.with_row(db.Row(f"{role}").id(next(ids)))
        board = board.with_panel(graph(
            f"{role}: throughput", f"Requests finished per second over {w}, per instance: served (finished_reason "
            f"stop or length) and failed (abort or error).", "reqps", [
                query(f"{rec(INSTANCE.prefix, 'vllm_request_success')}{per_instance}", "{{instance}} served", "A"),
                query(f"{rec(INSTANCE.prefix, 'vllm_request_failure')}{per_instance}", "{{instance}} failed", "B"),
            ]))
        board = board.with_panel(graph(
            f"{role}: queue", "Requests running and waiting, summed over each instance's ranks.", "short", [
                query(f"{rec(INSTANCE.prefix, 'vllm_num_requests_running', 'sum')}{per_instance}",
                      "{{instance}} running", "A"),
                query(f"{rec(INSTANCE.prefix, 'vllm_num_requests_waiting', 'sum')}{per_instance}",
                      "{{instance}} waiting", "B"),
            ]))
        hit = [
            query(f"{rec(INSTANCE.prefix, 'vllm_prefix_cache_hit_ratio')}{per_instance}", "{{instance}} local", "A"),
            query(f"{rec(INSTANCE.prefix, 'vllm_external_prefix_cache_hit_ratio')}{per_instance}",
                  "{{instance}} external", "B"),
        ]
        if role == "prefill":  # recorded for the prompt side only: decode's external hits are KV from prefill
            hit.append(query(f"{rec(INSTANCE.prefix, 'vllm_effective_prefix_cache_hit_ratio')}{per_instance}",
                             "{{instance}} effective", "C"))
            hit_text = ("Prefix-cache hit ratios over {w}, as `ascend-pd status` computes them: local (vLLM's own "
                        "prefix cache), external (the openYuanrong KV pool) and effective ((local + external hits) "
                        "/ local queries: the prompt tokens not computed).")
        else:
            hit_text = ("Prefix-cache hit ratios over {w}: local (vLLM's own prefix cache) and external (KV received "
                        "from prefill: near 1 when the hand-over works). No effective ratio on the decode side.")
        board = board.with_panel(graph(f"{role}: prefix-cache hit rates", hit_text.format(w=w), "percentunit", hit,
                                       ratio=True))
        titles = {"vllm_time_to_first_token_seconds": "time to first token",
                  "vllm_inter_token_latency_seconds": "inter-token latency",
                  "vllm_e2e_request_latency_seconds": "end-to-end latency"}
        for name, metric, _older in HISTOGRAMS:
            series = rec(ROLE.prefix, name)
            board = board.with_panel(graph(
                f"{role}: {titles.get(name, name)}",
                f"p50 and p99 of {metric} over {w}, over all {role} ranks (no requests in the window: no point).",
                "s", [query(f"{series}{_sel(stack_m, role_m, role_var_m, ('quantile', '=', str(q)))}",
                            f"p{q * 100:g}", chr(ord('A') + i)) for i, q in enumerate(QUANTILES)]))
        if role == "decode":
            board = board.with_panel(graph(
                "decode: prefill → decode hand-over",
                f"KV tokens decode received from prefill per second over {w} (decode's "
                f"vllm:external_prefix_cache_hits_total), per decode instance and for the stack. Zero while decode "
                f"serves: the decode-only fallback alert.", "short", [
                    query(f"{rec(INSTANCE.prefix, 'vllm_external_prefix_cache_hits')}{per_instance}",
                          "{{instance}}", "A"),
                    query(f"{rec(CLUSTER.prefix, 'vllm_pd_handover_tokens')}{_sel(stack_m)}", "stack", "B"),
                ], span=12))
            board = board.with_panel(graph(
                "decode: prompt tokens computed by decode",
                f"Share of decode's prompt tokens it computed itself over {w}: neither received from prefill nor in "
                f"its own prefix cache (1 - (local + external hits) / external queries). About 0 when P/D works; "
                f"above decodeSelfPrefillPercent the decode-only fallback alert fires (a partial fallback too).",
                "percentunit", [query(f"{rec(INSTANCE.prefix, 'vllm_decode_self_prefill_ratio')}{per_instance}",
                                      "{{instance}}", "A")], span=12, ratio=True))

    # -- health
    board = board.with_row(db.Row("health").id(next(ids)))
    ranks = _sel(("job", "=", JOB_RANKS), stack_m, role_var_m, instance_m)
    board = board.with_panel(up_stat(
        "instances up", f"Per DP instance, whether Prometheus reads every one of its ranks' /metrics (job "
        f"{JOB_RANKS}: min of `up` over the instance's ranks; one rank down is DOWN).",
        [query(f"min by (role, instance) (up{ranks})", "{{instance}}", "A", instant=True)], span=12))
    etcd = _sel(("job", "=", JOB_ETCD), stack_m)
    board = board.with_panel(up_stat(
        "etcd", f"etcd's /metrics answers (`up`, job {JOB_ETCD}) and etcd has a raft leader ({ETCD_LEADER}).",
        [query(f"up{etcd}", "up", "A", instant=True), query(f"{ETCD_LEADER}{etcd}", "leader", "B", instant=True)],
        span=12))
    if monitoring.exporter is not None:  # what only `ascend-pd exporter` reports
        ex = _sel(("job", "=", JOB_EXPORTER), stack_m)
        board = board.with_panel(up_stat(
            "proxy and P/D smoke", f"The PD proxy answers /healthcheck ({PROXY_UP}) and the exporter's last smoke "
            f"completion through it was served by a prefill and a decode rank ({SMOKE_SUCCESS}; every "
            f"monitoring.smokeIntervalS).",
            [query(f"{PROXY_UP}{ex}", "proxy", "A", instant=True),
             query(f"{SMOKE_SUCCESS}{ex}", "smoke", "B", instant=True)], span=12))
        board = board.with_panel(up_stat(
            "openYuanrong workers", f"Per planned worker, whether it is registered in etcd ({WORKER_REGISTERED}; "
            f"nothing while etcd is unreadable).",
            [query(f"{WORKER_REGISTERED}{ex}", "{{node}}", "A", instant=True)], span=12))
    firing = _sel(("alertname", "=~", f"{ALERT_PREFIX}.*"), ("alertstate", "=", "firing"), stack_m)
    board = board.with_panel(
        table.Panel().id(next(ids)).title("firing alerts").datasource(ds).span(_W).height(_H)
        .description("The alerts of monitoring/rules/alerts.yml firing now, one line each with its labels.")
        .no_value("none firing")
        .with_target(query(f"ALERTS{firing}", "", "A", instant=True, fmt=PromQueryFormat.TABLE))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "Value": True, "__name__": True, "alertstate": True}})))

    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def dashboard_json(plan: "Plan", monitoring: Monitoring = Monitoring()) -> str:
    """The text `write_dashboard` writes: stable key order, so one plan gives the same bytes."""
    return json.dumps(dashboard(plan, monitoring), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_dashboard(plan: "Plan", monitoring: Monitoring = Monitoring(), out_dir: Path = Path("monitoring")) -> Path:
    """Write out_dir/grafana-dashboard.json (import it in Grafana, or provision it from that directory)."""
    path = Path(out_dir) / DASHBOARD_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dashboard_json(plan, monitoring))
    return path


def alert_names(plan: "Plan", monitoring: Monitoring = Monitoring()) -> list[str]:
    """The generated alerts' names (the firing-alerts panel selects those starting with ALERT_PREFIX)."""
    return [a.name for a in alerts(plan, monitoring)]


__all__ = ["dashboard", "dashboard_json", "write_dashboard", "DASHBOARD_JSON", "ALERT_PREFIX", "alert_names"]
