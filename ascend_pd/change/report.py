"""The change report in three forms: text (a terminal or a log), markdown (a PR comment: a summary,
then collapsible sections per node) and JSON (for tools). No change is one line in every form."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from ..engine.model import CREATE, DELETE, DELETE_REPLACED, REPLACE, UPDATE
from .compare import FAILS, NOT_RUN, Change, ScriptChange
from ..term import Block, Table, plain
from .effect import AT_END, REPLACED, RESTART, ROLLING, START, STOP, Process

# GitHub refuses a comment over 65,536 characters: the markdown report stays under this, the rest
# of it is in the full report (the CI artifact, or `diff --format text` locally).
MARKDOWN_BUDGET = 60_000
FULL_REPORT = ("the full report: the PR run's artifact `ascend-pd-diff` (full-report.md), or "
               "`python -m ascend_pd diff --stack {stack} --base <base>` locally")
MODEL_NOTE = ("engine model (ascend_pd/engine/), held in CI to the steps of the real engine on every change "
              "scenario (tests/realengine, tests/engine_steps): order and times are its estimates")

CODE_NOTE = "program code: the working tree's on both sides (only the stack file differs)"
OPS = {CREATE: "create", UPDATE: "update", REPLACE: "replace", DELETE_REPLACED: "delete (replaced)",
       DELETE: "delete"}


def _minutes(seconds: float) -> str:
    if seconds == float("inf"):
        return "never (the model cannot finish this run: a DP group cannot start all its nodes at this --parallel)"
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


def _outage_s(change: Change) -> float:
    return max((r.duration_s for r in change.effect.roles if r.verdict == "outage"), default=0.0)


def _proxy_restarts(change: Change) -> bool:
    return any(p.name == "proxy" and (p.action == RESTART or (p.action == STOP and p.how != AT_END))
               for p in change.effect.processes)


def service_verdict(change: Change) -> str:
    """The whole service: P/D serves a request only while the proxy, a prefill and a decode instance do."""
    roles = change.effect.roles
    if all(r.verdict.startswith("starts") for r in roles):
        return "starts (nothing served before)"
    down = [r.role for r in roles if r.verdict == "outage"]
    if down:
        return (f"outage, about {_minutes(_outage_s(change))} (no request is served while no {' and no '.join(down)} "
                "instance serves: every request needs a prefill and a decode instance)")
    if _proxy_restarts(change):
        return "interrupted for seconds (the proxy restarts)"
    if any(r.restarting for r in roles):
        return "keeps serving (rolling restarts)"
    return "keeps serving"


def verdict(change: Change) -> str:
    """The first line of every report: will the run fail, is the service served, does the endpoint move."""
    e = change.effect
    parts = [f"service: {service_verdict(change)}"]
    for r in e.roles:
        v = r.verdict
        if v == "outage":
            v = f"outage, about {_minutes(r.duration_s)}"
        elif r.restarting and r.serving:
            v = f"{v}, about {_minutes(r.duration_s)}"
        if r.restarting and r.serving and e.mixed_models:
            v += ", old and new model mixed meanwhile"
        parts.append(f"{r.role}: {v}")
    parts.append(f"endpoint moves: `proxyUrl` {e.endpoint[0]} -> {e.endpoint[1]}" if e.endpoint
                 else "endpoint unchanged")
    if e.fails:
        return f"this run will fail: {'; '.join(e.fails_short)}. Until it fails: {'; '.join(parts)}"
    return "; ".join(parts)


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
    lines = [f"this run will fail: {why}" for why in e.fails]
    if e.fails:
        lines.append("what follows is what runs until it fails: the steps marked \"does not run\" never start")
    lines.append(f"service (P/D as a whole): {service_verdict(change)}")
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
                replaced = any(p.how == REPLACED for p in e.processes
                               if p.kind == "rank" and p.name.startswith(r.role + "-"))
                why = (f"{r.instances} instance(s), `rollout.maxUnavailable` {r.max_unavailable}" if r.rolling
                       else "replaced: the old delete stops every instance first" if replaced
                       else "the launches' updates stop the old ranks and start the new ones, not drained one "
                            "instance at a time")
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
    until = "until it fails " if e.fails else ""
    lines.append(f"`pulumi up --parallel {change.parallel}`: about {_minutes(e.up_s)} {until}({MODEL_NOTE}"
                 + ("; rolling restarts included" if e.up_s > (e.timing.makespan_s if e.timing else 0) else "") + ")")
    return lines


def restart_rows(change: Change) -> list[tuple[str, str, str, str]]:
    """(node, action, how, what) for every process that starts, stops or restarts."""
    rows = []
    order = {START: 1, RESTART: 0, STOP: 2}
    # "rolling" goes through the restart slots; where the role has no spare instance that is still an outage.
    down = {r.role for r in change.effect.roles if r.restarting and not r.serving}
    for action, how, node, names in sorted(_process_groups(change.effect.processes),
                                           key=lambda g: (g[2], order.get(g[0], 9))):
        if how == ROLLING and any(n.split("-", 1)[0] in down for n in names):
            how = "outage (no spare instance)"
        rows.append((node, action, how, _ranks_text(names)))
    return rows


# How a changed input reads in the step list (the engine names the inputs).
WHY = {"create": "create script changed", "delete": "delete script changed", "triggers": "triggers (identity) changed",
       "connection": "SSH connection changed"}


def step_rows(change: Change) -> list[tuple[str, str, str, str, str]]:
    def start(s) -> str:
        if s.outcome == NOT_RUN:
            return NOT_RUN
        at = f"t+{_minutes(s.start_s)}" if s.phase == "main" else "end"
        return f"{at}, FAILS" if s.outcome == FAILS else at

    return [(str(s.order), start(s), OPS[s.op], s.name, ", ".join(WHY.get(w, w) for w in s.why))
            for s in change.steps]


def problems_text(change: Change) -> str:
    return str(change.problems)


# ---------------------------------------------------------------------------------------------


def _signature(sc: ScriptChange, node: str) -> tuple:
    """What a node's change of one resource is, without where it is: the resource's kind, the step,
    the changed lines (no headers, line numbers or context) and the other inputs' changes."""
    body, hunks = [], False
    for line in sc.diff:
        if line.startswith("@@"):
            hunks = True
        elif hunks and line[:1] in "+-":
            body.append(line)
    kind = sc.resource[len(node) + 1:] if node and sc.resource.startswith(node + "-") else sc.resource
    return kind, sc.op, tuple(body), tuple(sc.inputs)


def node_groups(change: Change) -> list[tuple[list[str], list[ScriptChange]]]:
    """Nodes whose changes are the same (the same lines of the same scripts change: a flag of a role
    on each of its nodes), merged: (nodes, the first node's changes)."""
    by_node = _by_node(change)
    groups: dict[tuple, list[str]] = {}
    for node, items in by_node.items():
        groups.setdefault(tuple(_signature(sc, node) for sc in items), []).append(node)
    return [(nodes, by_node[nodes[0]]) for nodes in groups.values()]


def _group_title(nodes: list[str]) -> str:
    if len(nodes) == 1:
        return nodes[0] or "(no node)"
    return f"{', '.join(nodes)}: the same change on each (shown for {nodes[0]})"


def text_blocks(change: Change) -> list[Block]:
    """The text report: lines and tables (rich on a terminal, aligned columns otherwise)."""
    if change.problems is not None:
        return [problems_text(change)]
    warned = [f"warning: {p}" for p in change.warnings]
    if not change.changed:
        return [headline(change), *warned]
    out: list[Block] = [verdict(change), "", headline(change), f"steps: {change.source}", ""]
    out += warned + ([""] if warned else [])
    out += [f"engine: {n}" for n in change.engine_notes] + ([""] if change.engine_notes else [])
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
    for nodes, items in node_groups(change):
        out += ["", f"== {_group_title(nodes)} =="]
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


def _fit(blocks: list[tuple[str, list[str], list[str], bool]], budget: int, stack: str) -> list[str]:
    """The blocks (name, lines, closing lines, may be cut) within `budget` characters, in order: a
    block that does not fit is cut at a line (tables) or left out (a node's diffs); what is left
    out is named in a last line that points to the full report."""
    pointer = "*… {what} not shown here to fit a PR comment: " + FULL_REPORT.format(stack=stack) + ".*"
    room = budget - len(pointer) - 400
    out: list[str] = []
    size, left_out = 0, []
    for name, lines, closing, cuttable in blocks:
        text_size = sum(len(x) + 1 for x in lines + closing)
        if size + text_size <= room:
            out += lines + closing
            size += text_size
            continue
        if cuttable:
            kept = []
            for line in lines:
                if size + len(line) + 1 + sum(len(x) + 1 for x in closing) > room:
                    break
                kept.append(line)
                size += len(line) + 1
            out += kept + closing
            size += sum(len(x) + 1 for x in closing)
            left_out.append(f"the rest of {name}")
        else:
            left_out.append(name)
    if left_out:
        shown = ", ".join(left_out[:12]) + (f" and {len(left_out) - 12} more" if len(left_out) > 12 else "")
        out += [pointer.format(what=shown), ""]
    return out


def markdown(change: Change, budget: int = MARKDOWN_BUDGET) -> str:
    """The PR comment's form: the verdict first, at most `budget` characters (None: no limit)."""
    if change.problems is not None:
        items = "\n".join(f"- {f'{p.where}: ' if p.where else ''}`{p.setting}`: {p.message}. Fix: {p.fix}."
                          for p in change.problems.problems)
        return f"`{change.stack}`: **invalid configuration** ({len(change.problems.problems)} problem(s)):\n\n{items}"
    warned = [f"- warning: {f'{p.where}: ' if p.where else ''}`{p.setting}`: {p.message}. Fix: {p.fix}."
              for p in change.warnings]
    if not change.changed:
        return "\n".join([headline(change), *([""] + warned if warned else [])])
    head = [f"**{verdict(change)}**", "", headline(change), "", f"Steps: {change.source}.", ""]
    head += warned + ([""] if warned else [])
    head += [f"- engine: {n}" for n in change.engine_notes] + ([""] if change.engine_notes else [])
    if change.base_problem is not None:
        head += [f"The base is invalid and is compared as not deployed: `{change.base_problem.problems[0]}`", ""]
    if change.base.config is None:
        head += ["The stack file does not exist at the base: everything is created.", ""]
    head += ["**Service**", ""] + [f"- {line}" for line in service_lines(change)] + [""]
    blocks: list[tuple[str, list[str], list[str], bool]] = [("the summary", head, [], True)]
    if change.effect.processes:
        blocks.append(("the process table", _md_table(("node", "action", "how", "what"), restart_rows(change)),
                       [""], True))
    blocks.append(("the step table",
                   [f"<details><summary>Steps of <code>pulumi up</code> in the engine's order ({len(change.steps)})"
                    "</summary>", ""] + _md_table(("#", "start", "op", "resource", "why"), step_rows(change)),
                   ["", "</details>", ""], True))
    for name, diff in change.libraries.items():
        blocks.append((f"library {name}", [f"<details><summary>library <code>{name}</code> changed (shown once)"
                                           "</summary>", "", _fenced(diff), "", "</details>", ""], [], False))
    for nodes, items in node_groups(change):
        summary = ", ".join(f"{sc.resource} {OPS[sc.op]}" for sc in items)
        lines = [f"<details><summary><b>{_group_title(nodes)}</b>: {summary}</summary>", ""]
        for sc in items:
            lines.append(f"`{sc.resource}` ({OPS[sc.op]})" + ("" if not sc.inputs else ": " + "; ".join(
                _md_cell(i) for i in sc.inputs)))
            lines.append("")
            if sc.diff:
                lines += [_fenced(sc.diff), ""]
        lines += ["</details>", ""]
        blocks.append((f"the scripts of {', '.join(nodes) or '(no node)'}", lines, [], False))
    if budget is None:
        out = [line for _, lines, closing, _ in blocks for line in lines + closing]
    else:
        out = _fit(blocks, budget, change.stack)
    return "\n".join(out).rstrip() + "\n"


def _finite(value: float) -> Any:
    """JSON has no Infinity: a time the model cannot give (a stalled run) is null."""
    return value if value not in (float("inf"), float("-inf")) and value == value else None


def as_json(change: Change) -> str:
    doc: dict[str, Any] = {"stack": change.stack, "base": change.base.label, "code": CODE_NOTE,
                           "codeChanges": list(change.base.code_changes)}
    if change.problems is not None:
        doc["problems"] = [{"where": p.where, "setting": p.setting, "message": p.message, "fix": p.fix}
                           for p in change.problems.problems]
        return json.dumps(doc, indent=2, allow_nan=False)
    doc["changed"] = change.changed
    doc["warnings"] = [{"where": p.where, "setting": p.setting, "message": p.message, "fix": p.fix}
                       for p in change.warnings]
    doc["source"] = {"steps": "engine" if change.engine is not None else "model",
                     "preview": change.engine.label if change.engine is not None else None,
                     "text": change.source, "engineNotes": change.engine_notes}
    doc["resources"] = change.resources
    if change.base_problem is not None:
        doc["baseProblems"] = [str(p) for p in change.base_problem.problems]
    if change.effect is not None and change.changed:
        e = change.effect
        doc["verdict"] = verdict(change)
        doc["service"] = service_verdict(change)
        doc["fails"] = list(e.fails)
        doc["endpoint"] = {"old": e.endpoint[0], "new": e.endpoint[1]} if e.endpoint else None
    doc["steps"] = [{"order": s.order, "op": s.op, "resource": s.name, "type": s.type, "node": s.node,
                     "why": list(s.why), "phase": s.phase, "startS": _finite(s.start_s),
                     "outcome": s.outcome or "runs"} for s in change.steps]
    if change.effect is not None and change.changed:
        e = change.effect
        doc["processes"] = [{"node": p.node, "process": p.name, "action": p.action, "how": p.how,
                             "resource": p.resource} for p in e.processes]
        doc["roles"] = [{"role": r.role, "verdict": r.verdict, "instances": r.instances, "before": r.before,
                         "restarting": list(r.restarting), "added": list(r.added), "removed": list(r.removed),
                         "rolling": r.rolling, "serving": r.serving, "durationS": _finite(r.duration_s)}
                        for r in e.roles]
        doc["notes"] = e.notes
        doc["model"] = MODEL_NOTE
        doc["upS"] = _finite(e.up_s)
    doc["scripts"] = [{"node": sc.node, "resource": sc.resource, "op": sc.op, "inputs": list(sc.inputs),
                       "diff": list(sc.diff)} for sc in change.scripts]
    doc["libraries"] = change.libraries
    return json.dumps(doc, indent=2, allow_nan=False)


__all__ = ["text", "text_blocks", "markdown", "as_json", "headline", "service_lines", "restart_rows", "step_rows", "CODE_NOTE",
           "verdict", "service_verdict", "node_groups", "MARKDOWN_BUDGET"]
