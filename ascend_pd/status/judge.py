"""Judging: per rank, instance, role, node and cluster, ok/hung/down and why (`collect_status`, which status
and heal call). The exporter judges what it exports with the same functions (`registrations`,
`rollout_verdicts`, `proxy_verdict`, `smoke_verdict`): a fact is judged in one place."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

from ..hang import HUNG, ONE_SHOT_NOTE, SPLIT, HangTracker, InstanceVerdict, Observation
from ..plan import ROLES, Plan, Rank
from .model import (NODE_FAIL, NODE_OK, RANK_FAIL, RANK_HUNG, RANK_OK, UNREACHABLE, WORKER_PREFIX, CacheCounters,
                    EtcdStatus, HitRates, HitRateTable, InstanceRequests, NodeStatus, Problem, ProxyStatus, RankStatus,
                    RequestCounters, RolloutKey, RolloutStatus, SmokeStatus, StatusReport, Timeouts, WorkerStatus)
from .read import (_check_etcd_health, _check_etcd_members, _check_proxy, _check_rank_health, _check_rank_metrics,
                   _check_rank_models, _check_registrations, _check_rollout, _check_tcp, _poll, _rank_component,
                   MetricsBoard, _smoke, _unreachable)


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


def registrations(plan: Plan, registered: dict[str, str]) -> tuple[dict[str, Optional[str]], list[str]]:
    """Each planned worker's registration state by address (None: not registered), and the registered
    addresses the plan has no worker on."""
    planned = {w.address for w in plan.workers}
    return {w.address: registered.get(w.address) for w in plan.workers}, sorted(a for a in registered if a not in planned)


def _worker_verdicts(plan: Plan, results: dict) -> tuple[list[WorkerStatus], list[str], list[Problem]]:
    w_ok, w_val = results[("etcd", "workers")]
    endpoint = plan.etcd.endpoint
    if not w_ok:
        return _unknown_registrations(plan, results)
    states, unplanned = registrations(plan, w_val)
    workers, problems = [], []
    for w in plan.workers:
        state = states[w.address]
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
    return workers, unplanned, problems


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
                      url=r.url, health=hok, model_listed=listed, models=models,
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


def rollout_verdicts(keys: list[RolloutKey]) -> list[RolloutStatus]:
    """Per role with a restart under way or stopped: who holds its slots, whose restart failed."""
    held: dict[str, list[str]] = {r: [] for r in ROLES}
    failed: dict[str, str] = {}
    for k in keys:
        if k.failed:
            failed[k.role] = k.instance
        else:
            held[k.role].append(k.instance)
    return [RolloutStatus(r, sorted(held[r]), failed.get(r)) for r in ROLES if held[r] or r in failed]


def proxy_verdict(plan: Plan, result: tuple[bool, object]) -> ProxyStatus:
    """The proxy's /healthcheck (ok, answer or reason) against the plan's rank endpoints."""
    p = plan.proxy
    exp_p, exp_d = len(p.prefillers), len(p.decoders)
    ok, answer = result
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
    board = MetricsBoard([r.url for r in plan.ranks]) if smoke else None
    if smoke:
        jobs[("proxy", "smoke")] = lambda: _smoke(plan, t, board)
    # The /metrics reads first: the smoke's "before" is made of them (they start before the other
    # rank requests when the ranks outnumber the threads).
    for r in plan.ranks:
        jobs[("rank", r.name, "metrics")] = lambda r=r: _check_rank_metrics(r, t, board)
    for w in plan.workers:
        jobs[("worker", w.address)] = lambda w=w: _check_tcp(w.address, t)
    for r in plan.ranks:
        jobs[("rank", r.name, "health")] = lambda r=r: _check_rank_health(r, t)
        jobs[("rank", r.name, "models")] = lambda r=r: _check_rank_models(r, t)
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
    rollout = rollout_verdicts(r_val) if r_ok else []  # etcd unreadable: its own row says so
    for ro in rollout:
        if ro.failed:
            problems.append(Problem(f"{ro.role} rollout", f"stopped: the restart of {ro.failed} failed; the role's "
                                    f"other restarts wait until it serves again (fix it, then pulumi up)"))
    proxy_status = proxy_verdict(plan, results[("proxy", "healthcheck")])
    if not proxy_status.ok:
        problems.append(Problem(f"proxy {plan.proxy.url}", proxy_status.reason, plan.proxy.node))
    smoke_status = None
    if smoke:
        sok, sv = results[("proxy", "smoke")]
        smoke_status = smoke_verdict((sok, sv))
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
        spares=list(plan.spares),
    )


def smoke_verdict(result: tuple[bool, object]) -> SmokeStatus:
    """The P/D smoke's (ok, (latency, text, served_by) or reason)."""
    ok, value = result
    return SmokeStatus(True, round(value[0], 4), value[1], served_by=value[2]) if ok else SmokeStatus(False, None, "", value)


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
