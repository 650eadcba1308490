"""`python -m ascend_pd doctor --stack S`: the preflight checks on every node, then across nodes.

Round 1 runs the rendered check script (ascend_pd.scripts.preflight, report mode) on every node at
once over ssh (ascend_pd.ssh) and parses its JSON lines. The cross-node checks come from those
lines: `clock-skew` (each node's clock against the operator's at the moment its first line
arrived: the error is one network latency, milliseconds on a LAN), `same-versions` and
`same-weights` (a node that differs from the majority fails). Round 2 pings, from each NPU, the NPU
with the same index on every node it exchanges KV with (prefill <-> decode) or shares a DP group
with, at the addresses round 1 read from the NPUs themselves; on A3 also `hccs_ping` to their vNICs.

Exit 0: nothing failed (warnings allowed); 1: a check failed or a node was unreachable.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .plan import Plan
from .scripts.preflight import ALL_CHECKS, CHECKS, ping_script, preflight_script
from .ssh import Result, Target, run_on_nodes

CROSS_CHECKS = ("clock-skew", "same-versions", "same-weights")
COLUMNS = ("ssh", "clock", "versions", "page-size", "memory", "npu", "hccn-conf", "fabric", "ping", "ports",
           "weights", "docker", "network", "firewall") + CROSS_CHECKS
# One node's checks finish in a few seconds; the bound is for a node that hangs in a tool.
DEFAULT_TIMEOUT_S = 30.0
STATUS_ORDER = {"pass": 0, "warn": 1, "fail": 2}


@dataclass
class Row:
    status: str  # pass, warn, fail
    detail: str
    fix: str = ""
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass
class Report:
    rows: dict[str, dict[str, Row]]  # node -> check -> row
    skew_ms: Optional[float] = None
    elapsed_s: float = 0.0

    @property
    def failed(self) -> bool:
        return any(r.status == "fail" for checks in self.rows.values() for r in checks.values())

    def as_json(self) -> dict:
        return {"ok": not self.failed, "elapsed_s": round(self.elapsed_s, 3), "clock_skew_ms": self.skew_ms,
                "nodes": {n: {c: r.as_dict() for c, r in checks.items()} for n, checks in self.rows.items()}}


def parse(result: Result) -> dict[str, Row]:
    """The check rows of one node's run; an unreachable node or a broken run is an `ssh` failure."""
    if result.error:
        return {"ssh": Row("fail", result.error, "check the address, sshd and the key (ascend-pd:ssh)")}
    rows: dict[str, Row] = {}
    for line in result.stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[item["check"]] = Row(item["status"], item["detail"], item.get("fix", ""), item.get("data") or {})
    if result.rc == 0 and not rows:
        rows["ssh"] = Row("fail", f"the check script printed no result: {result.stdout.strip()[:200] or 'nothing'}",
                          "check that the node has bash and coreutils, and that the login shell prints nothing")
        return rows
    if result.rc != 0:
        tail = " ".join(result.stderr.strip().splitlines()[-2:])[:300]
        rows["ssh"] = Row("fail", f"the check script exited {result.rc}: {tail or 'no message'}",
                          "run the script by hand (python -m ascend_pd render) and fix what it reports")
    else:
        rows["ssh"] = Row("pass", f"ran in {result.elapsed:.1f} s")
    return rows


def _majority(values: dict[str, object]) -> Optional[object]:
    counts = Counter(json.dumps(v, sort_keys=True) for v in values.values())
    if not counts:
        return None
    return json.loads(counts.most_common(1)[0][0])


def cross_checks(plan: Plan, rows: dict[str, dict[str, Row]], arrivals: dict[str, float]) -> Optional[float]:
    """Add clock-skew, same-versions and same-weights rows; return the cluster's skew in ms."""
    max_skew = plan.cfg.preflight.max_clock_skew_ms
    offsets = {n: r["clock"].data["ms"] - arrivals[n] * 1000 for n, r in rows.items()
               if "clock" in r and "ms" in r["clock"].data and n in arrivals}
    skew = None
    if offsets:
        mid = statistics.median(offsets.values())
        skew = round(max(offsets.values()) - min(offsets.values()), 1)
        for n, off in offsets.items():
            d = off - mid
            status = "fail" if abs(d) > max_skew else "warn" if abs(d) > max_skew / 2 else "pass"
            rows[n]["clock-skew"] = Row(status, f"clock {d:+.0f} ms from the cluster's median (limit {max_skew} ms)",
                                        "synchronize the clocks (chrony/NTP against one server)")
    versions = {n: r["versions"].data for n, r in rows.items() if "versions" in r and r["versions"].data}
    common = _majority(versions)
    for n, v in versions.items():
        if v == common:
            rows[n]["same-versions"] = Row("pass", "same driver and CANN as the other nodes")
        else:
            rows[n]["same-versions"] = Row(
                "fail", f"driver {v.get('driver') or '-'}, CANN {v.get('cann') or '-'} while most nodes have driver "
                f"{common.get('driver') or '-'}, CANN {common.get('cann') or '-'}",
                "install the same driver and CANN on every node")
    weights = {n: r["weights"].data for n, r in rows.items() if "weights" in r and r["weights"].data.get("digest")}
    common_digest = _majority({n: w["digest"] for n, w in weights.items()})
    reference = next((w for w in weights.values() if w["digest"] == common_digest), None)
    for n, w in weights.items():
        if w["digest"] == common_digest:
            rows[n]["same-weights"] = Row("pass", f"same {w['count']} files as the other nodes")
            continue
        mine, theirs = dict(map(tuple, w["files"])), dict(map(tuple, reference["files"]))
        diffs = [f"{f} missing" for f in sorted(set(theirs) - set(mine))]
        diffs += [f"{f} extra" for f in sorted(set(mine) - set(theirs))]
        diffs += [f"{f} {mine[f]} bytes, not {theirs[f]}" for f in sorted(set(mine) & set(theirs)) if mine[f] != theirs[f]]
        rows[n]["same-weights"] = Row("fail", f"{plan.cfg.model.path} differs from the other nodes: "
                                      + "; ".join(diffs[:5]) + (f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else ""),
                                      "copy the weights again (rsync -a --delete from a good node)")
    return skew


def peers(plan: Plan, node: str) -> list[str]:
    """The nodes `node` exchanges KV with (the other role) or shares a DP group with."""
    roles = plan.node(node).roles
    out: set[str] = set()
    if "prefill" in roles:
        out |= set(plan.cfg.decode.nodes)
    if "decode" in roles:
        out |= set(plan.cfg.prefill.nodes)
    inst = plan.instance_on(node)
    if inst is not None:
        out |= set(inst.nodes)
    out.discard(node)
    return [n.name for n in plan.nodes if n.name in out]


def ping_targets(plan: Plan, node: str, rows: dict[str, dict[str, Row]]) -> list[tuple[int, str, str]]:
    """(device, kind, address) for `node`: the same device index on every peer whose fabric was read."""
    out = []
    for peer in peers(plan, node):
        data = rows.get(peer, {}).get("fabric")
        if data is None:
            continue
        for dev, ip in enumerate(data.data.get("ips", [])):
            if ip:
                out.append((dev, "ping", ip))
        for dev, ip in enumerate(data.data.get("vnics", [])):
            if ip:
                out.append((dev, "hccs_ping", ip))
    return out


def run_doctor(plan: Plan, targets: dict[str, Target], *, nodes: Sequence[str] = (), only: Sequence[str] = (),
               timeout_s: float = DEFAULT_TIMEOUT_S) -> Report:
    """Every check on every node, as many nodes at once as ssh's `--parallel` gate lets through."""
    start = time.monotonic()
    names = list(nodes) or [n.name for n in plan.nodes]
    wanted = list(only) or list(ALL_CHECKS)
    checks = [c for c in CHECKS if c in wanted]
    if "ping" in wanted and "fabric" not in checks:
        checks.append("fabric")  # the ping round needs the NPU addresses
    scripts = {n: preflight_script(plan, n, mode="report", checks=checks) for n in names}
    results = run_on_nodes(targets, scripts, timeout_s=timeout_s)
    rows = {n: parse(results[n]) for n in names}
    arrivals = {n: r.first_output_at for n, r in results.items() if r.first_output_at}
    skew = cross_checks(plan, rows, arrivals) if len(names) > 1 else None
    if "ping" in wanted:
        wanted_pings = {n: ping_targets(plan, n, rows) for n in names if rows[n]["ssh"].status == "pass"}
        pings = {n: ping_script(plan, n, t) for n, t in wanted_pings.items() if t}
        for n, res in run_on_nodes(targets, pings, timeout_s=timeout_s).items():
            got = parse(res)
            rows[n]["ping"] = got.get("ping") or got["ssh"]
    for n in names:  # only what was asked for (fabric may have run for the ping round alone)
        rows[n] = {c: r for c, r in rows[n].items()
                   if c == "ssh" or c in wanted or (c == "hccn-conf" and "fabric" in wanted)
                   or (c in CROSS_CHECKS and {"clock-skew": "clock", "same-versions": "versions",
                                              "same-weights": "weights"}[c] in wanted)}
    return Report(rows=rows, skew_ms=skew, elapsed_s=time.monotonic() - start)


def table(report: Report) -> str:
    used = [c for c in COLUMNS if any(c in r for r in report.rows.values())]
    head = ["node"] + used
    body = [[n] + [checks[c].status.upper() if c in checks else "-" for c in used] for n, checks in report.rows.items()]
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + body]
    problems = []
    for n, checks in report.rows.items():
        for c in used:
            r = checks.get(c)
            if r is not None and r.status != "pass":
                problems.append(f"{r.status.upper()} {n} {c}: {r.detail}" + (f"\n      fix: {r.fix}" if r.fix else ""))
    out = "\n".join(lines)
    if problems:
        out += "\n\n" + "\n".join(problems)
    verdict = "FAILED" if report.failed else "all checks passed"
    skew = f", clock skew {report.skew_ms:.0f} ms" if report.skew_ms is not None else ""
    return out + f"\n\ndoctor: {verdict} on {len(report.rows)} nodes in {report.elapsed_s:.1f} s{skew}"


__all__ = ["run_doctor", "Report", "Row", "table", "parse", "cross_checks", "peers", "ping_targets", "COLUMNS"]
