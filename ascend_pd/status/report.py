"""Reporting: the table, JSON, the down-cluster summary, and `run` (the status command)."""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime, timezone
from typing import Optional

from .. import term
from ..hang import DEAD, InstanceVerdict
from ..logsources import pointer_blocks
from ..plan import ROLES, Plan
from .judge import collect_status, hang_tracker
from .model import RANK_HUNG, UNREACHABLE, HitRates, NodeStatus, Problem, RankStatus, StatusReport, Timeouts
from .text import _printable


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
    if rep.spares:
        rows.append(_spares_row(rep))
    return term.Table(("COMPONENT", "STATE", "DETAIL"), rows, styles=STYLES)


def _spares_row(rep: StatusReport) -> tuple[str, str, str]:
    """Nodes of no role: ready to take a lost node's place when their openYuanrong worker is (the rest of
    their preparation is `pulumi up`'s)."""
    workers = {w.node: w for w in rep.workers}
    ready = [n for n in rep.spares if n in workers and workers[n].ok]
    detail = ", ".join(f"{n} ({'ready' if n in ready else 'worker not ready'})" for n in rep.spares)
    return "spare nodes (no ranks)", "ok" if len(ready) == len(rep.spares) else "FAIL", detail


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
                from ..logs import status_tails

                out.write(_for_terminal(status_tails(plan, rep, timeouts.request_s)))
            out.flush()
            code, polls, previous = rep.exit_code, polls + 1, rep
            if not watch or (count is not None and polls >= count):
                return code
            time.sleep(max(0.0, watch - (time.time() - rep.polled_at)))
    except KeyboardInterrupt:
        return code

