"""The change report in three forms: text (a terminal or a log), markdown (a PR comment: a summary,
then collapsible sections per node) and JSON (for tools). No change is one line in every form."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from ..engine.model import CREATE, DELETE, DELETE_REPLACED, REPLACE, UPDATE
from .compare import Change
from ..term import Block, Table, plain
from .effect import RESTART, START, STOP, Process

CODE_NOTE = "program code: the working tree's on both sides (only the stack file differs)"
OPS = {CREATE: "create", UPDATE: "update", REPLACE: "replace", DELETE_REPLACED: "delete (replaced)",
       DELETE: "delete"}


def _minutes(seconds: float) -> str:
    if seconds == float("inf"):
        return "never (a DP group cannot start all its nodes at this --parallel)"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def counts(change: Change) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for s in change.steps:
        if s.op != DELETE_REPLACED:
            out[OPS[s.op]] += 1
    return dict(out)


def code_note(change: Change) -> str:
    files = change.base.code_changes
    if not files:
        return ""
    shown = ", ".join(f"`{f}`" for f in files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (f" Note: the program itself differs from the base ({shown}); both sides are rendered with the working "
            "tree's, so what that change does to the scripts is not in this report (see the tests/golden/ diff).")


def headline(change: Change) -> str:
    against = f"against {change.base.label}"
    if not change.changed:
        return f"`{change.stack}`: no change {against} ({change.resources} resources, all the same).{code_note(change)}"
    c = counts(change)
    done = {"create": "created", "update": "updated", "replace": "replaced", "delete": "deleted"}
    what = ", ".join(f"{n} {done[k]}" for k, n in sorted(c.items(), key=lambda kv: -kv[1]))
    return f"`{change.stack}`: {what} {against}; {CODE_NOTE}.{code_note(change)}"


def _process_groups(processes: list[Process]) -> list[tuple[str, str, str, list[str]]]:
    """(action, how, node, names) with ranks of one node and action grouped together."""
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for p in processes:
        groups[(p.action, p.how, p.node)].append(p.name)
    return [(a, h, n, names) for (a, h, n), names in groups.items()]


def _ranks_text(names: list[str]) -> str:
    ranks = [n for n in names if re.match(r"(prefill|decode)-\d+-r\d+$", n)]
    other = [n for n in names if n not in ranks]
    parts = []
    if ranks:
        by_inst: dict[str, list[str]] = defaultdict(list)
        for r in ranks:
            inst, _, num = r.rpartition("-r")
            by_inst[inst].append(num)
        parts += [f"{inst} ranks {','.join(nums)}" if len(nums) > 1 else f"{inst} rank {nums[0]}"
                  for inst, nums in by_inst.items()]
    return ", ".join(parts + other)


def service_lines(change: Change) -> list[str]:
    e = change.effect
    lines = []
    for r in e.roles:
        verdict = r.verdict
        detail = ""
        if r.restarting:
            if r.serving:
                detail = (f": {len(r.restarting)} of {r.instances} instances restart, at most {r.max_unavailable} at a "
                          f"time (`rollout.maxUnavailable`), about {_minutes(r.duration_s)} in all"
                          if r.rolling else f": {len(r.restarting)} of {r.instances} instances restart at once, "
                          f"the others serve; about {_minutes(r.duration_s)}")
            else:
                why = (f"{r.instances} instance(s), `rollout.maxUnavailable` {r.max_unavailable}" if r.rolling
                       else "replaced: the old delete stops every instance first")
                detail = f": no {r.role} instance serves for about {_minutes(r.duration_s)} ({why})"
        if r.added:
            detail += f"; new: {', '.join(r.added)}"
        if r.removed:
            detail += f"; removed at the end of the run: {', '.join(r.removed)}"
        lines.append(f"{r.role}: {verdict}{detail}")
    for kind in ("worker", "etcd", "proxy"):
        moved = [p for p in e.processes if p.kind == kind]
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for p in moved:
            groups[(p.action, p.how)].append(p.node)
        if groups:
            lines.append(f"{kind}: " + "; ".join(f"{action} on {', '.join(sorted(nodes))} ({how})"
                                                 for (action, how), nodes in groups.items()))
    lines += e.notes
    lines.append(f"`pulumi up --parallel {change.parallel}`: about {_minutes(e.up_s)} (engine model"
                 + (", rolling restarts included" if e.up_s > (e.timing.makespan_s if e.timing else 0) else "") + ")")
    return lines


def restart_rows(change: Change) -> list[tuple[str, str, str, str]]:
    """(node, action, how, what) for every process that starts, stops or restarts."""
    rows = []
    order = {START: 1, RESTART: 0, STOP: 2}
    for action, how, node, names in sorted(_process_groups(change.effect.processes),
                                           key=lambda g: (g[2], order.get(g[0], 9))):
        rows.append((node, action, how, _ranks_text(names)))
    return rows


# How a changed input reads in the step list (the engine names the inputs).
WHY = {"create": "create script changed", "delete": "delete script changed", "triggers": "triggers (identity) changed",
       "connection": "SSH connection changed"}


def step_rows(change: Change) -> list[tuple[str, str, str, str, str]]:
    return [(str(s.order), f"t+{_minutes(s.start_s)}" if s.phase == "main" else "end", OPS[s.op], s.name,
             ", ".join(WHY.get(w, w) for w in s.why)) for s in change.steps]


def problems_text(change: Change) -> str:
    return str(change.problems)


# ---------------------------------------------------------------------------------------------


def text_blocks(change: Change) -> list[Block]:
    """The text report: lines and tables (rich on a terminal, aligned columns otherwise)."""
    if change.problems is not None:
        return [problems_text(change)]
    if not change.changed:
        return [headline(change)]
    out: list[Block] = [headline(change), ""]
    if change.base_problem is not None:
        out += [f"the base is invalid, compared as not deployed: {change.base_problem}", ""]
    if change.base.config is None:
        out += ["the stack file does not exist at the base: everything is created", ""]
    out += ["service:"] + [f"  {line}" for line in service_lines(change)] + [""]
    if change.effect.processes:
        out += [Table(("node", "action", "how", "what"), restart_rows(change), title="processes:"), ""]
    out.append(Table(("#", "start", "op", "resource", "why"), step_rows(change),
                     title=f"steps ({len(change.steps)}, in the engine's order):"))
    for name, diff in change.libraries.items():
        out += ["", f"library {name} changed (embedded in every script that uses it):", *diff]
    for node, items in _by_node(change).items():
        out += ["", f"== {node or '(no node)'} =="]
        for sc in items:
            out.append(f"-- {OPS[sc.op]} {sc.resource}")
            out += [f"   {i}" for i in sc.inputs]
            out += list(sc.diff)
    return out


def text(change: Change) -> str:
    return plain(text_blocks(change))


def _by_node(change: Change) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for sc in change.scripts:
        out[sc.node].append(sc)
    return dict(sorted(out.items()))


def _fenced(lines: list[str] | tuple[str, ...], lang: str = "diff") -> str:
    body = "\n".join(lines)
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _md_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]


def markdown(change: Change) -> str:
    if change.problems is not None:
        items = "\n".join(f"- `{p.setting}`: {p.message}. Fix: {p.fix}." for p in change.problems.problems)
        return f"`{change.stack}`: **invalid configuration** ({len(change.problems.problems)} problem(s)):\n\n{items}"
    if not change.changed:
        return headline(change)
    out = [headline(change), ""]
    if change.base_problem is not None:
        out += [f"The base is invalid and is compared as not deployed: `{change.base_problem.problems[0]}`", ""]
    if change.base.config is None:
        out += ["The stack file does not exist at the base: everything is created.", ""]
    out += ["**Service**", ""] + [f"- {line}" for line in service_lines(change)] + [""]
    if change.effect.processes:
        out += _md_table(("node", "action", "how", "what"), restart_rows(change)) + [""]
    out += [f"<details><summary>Steps of <code>pulumi up</code> in the engine's order ({len(change.steps)})</summary>", ""]
    out += _md_table(("#", "start", "op", "resource", "why"), step_rows(change)) + ["", "</details>", ""]
    for name, diff in change.libraries.items():
        out += [f"<details><summary>library <code>{name}</code> changed (shown once)</summary>", "",
                _fenced(diff), "", "</details>", ""]
    for node, items in _by_node(change).items():
        summary = ", ".join(f"{sc.resource} {OPS[sc.op]}" for sc in items)
        out += [f"<details><summary><b>{node or '(no node)'}</b>: {summary}</summary>", ""]
        for sc in items:
            out.append(f"`{sc.resource}` ({OPS[sc.op]})" + ("" if not sc.inputs else ": " + "; ".join(
                _md_cell(i) for i in sc.inputs)))
            out.append("")
            if sc.diff:
                out += [_fenced(sc.diff), ""]
        out += ["</details>", ""]
    return "\n".join(out).rstrip() + "\n"


def as_json(change: Change) -> str:
    doc: dict[str, Any] = {"stack": change.stack, "base": change.base.label, "code": CODE_NOTE,
                           "codeChanges": list(change.base.code_changes)}
    if change.problems is not None:
        doc["problems"] = [{"setting": p.setting, "message": p.message, "fix": p.fix} for p in change.problems.problems]
        return json.dumps(doc, indent=2)
    doc["changed"] = change.changed
    doc["resources"] = change.resources
    if change.base_problem is not None:
        doc["baseProblems"] = [str(p) for p in change.base_problem.problems]
    doc["steps"] = [{"order": s.order, "op": s.op, "resource": s.name, "type": s.type, "node": s.node,
                     "why": list(s.why), "phase": s.phase, "startS": s.start_s} for s in change.steps]
    if change.effect is not None and change.changed:
        e = change.effect
        doc["processes"] = [{"node": p.node, "process": p.name, "action": p.action, "how": p.how,
                             "resource": p.resource} for p in e.processes]
        doc["roles"] = [{"role": r.role, "verdict": r.verdict, "instances": r.instances, "before": r.before,
                         "restarting": list(r.restarting), "added": list(r.added), "removed": list(r.removed),
                         "rolling": r.rolling, "serving": r.serving, "durationS": r.duration_s} for r in e.roles]
        doc["notes"] = e.notes
        doc["upS"] = e.up_s if e.up_s != float("inf") else None
    doc["scripts"] = [{"node": sc.node, "resource": sc.resource, "op": sc.op, "inputs": list(sc.inputs),
                       "diff": list(sc.diff)} for sc in change.scripts]
    doc["libraries"] = change.libraries
    return json.dumps(doc, indent=2)


__all__ = ["text", "text_blocks", "markdown", "as_json", "headline", "service_lines", "restart_rows", "step_rows", "CODE_NOTE"]
