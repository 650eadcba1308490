"""`ascend-pd replan --stack S --without NODE`: the stack edit that keeps serving without a node lost
for good.

The edit is found, not designed: a few layouts are tried in order of preference, and each is held to
the plan's own rules (`build_plan`: DP sizes, ranks, ports, kv ports, devices); the first legal one is
proposed. Every layout drops NODE from `nodes`, from `ssh.hostKeys`, and from whichever of
`etcd.node`, `proxy.node` and `monitoring.node` names it (the first remaining node takes that over).
Then, for NODE's role:

0. **a warm spare takes its place** (a node of `nodes` that no role names: `pulumi up` keeps it
   prepared, so the takeover costs one model load): nothing else moves;
1. decode only: **a prefill instance gives its node** to the decode group, in NODE's place, and
   prefill runs with one instance fewer. Decode is the scarce side (on a2-8node its one instance
   spans four nodes: without it nothing is served), prefill is the side with instances to spare.
   The last prefill instance gives, so no other prefill instance is renamed (a rename restarts it).
2. **the role runs one instance fewer**: the instance that held NODE goes; the role's last instance
   takes its place in the node list (again: no other instance renamed), and the instance's other
   nodes serve nothing (they stay in the stack: their workers keep their memory in the KV pool).
3. **the instance shrinks** (a role of one instance spanning several nodes): one node fewer per
   instance, and `dp` in proportion (each node keeps its ranks).

Applying it is the operator's call: `--write` writes it to the stack file (comments kept; the file
as it was backed up beside it, which is also how the node comes back once repaired), and the state
is then converged without the dead machine by `ascend-pd forget-node` (a machine that still answers:
a plain `pulumi up`).
"""

from __future__ import annotations

import copy
import difflib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .config import PROJECT
from .errors import ConfigError
from .loader import _decode, cli_config_map, load_config
from .plan import Plan, build_plan

ROLES = ("prefill", "decode")


class ReplanError(Exception):
    """No proposal: NODE unknown, or no legal layout without it (the message says what would help)."""


@dataclass(frozen=True)
class Edit:
    """One change of a setting: `path` (top-level setting first), and the new value (None: removed)."""

    path: tuple[str, ...]
    value: Any


@dataclass(frozen=True)
class Proposal:
    summary: str  # one line: what the layout does
    edits: tuple[Edit, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """The first legal proposal, the plan it makes, and why the preferred ones before it were refused."""

    proposal: Proposal
    plan: Plan
    refused: tuple[tuple[str, str], ...] = field(default=())  # (summary, why)


def _settings(raw: dict[str, str]) -> dict[str, Any]:
    """The CLI's flat map (strings, objects as JSON) as Python values, decoded as the loader decodes it."""
    return {k: _decode(v) for k, v in raw.items()}


def _instances(role: dict[str, Any]) -> list[list[str]]:
    k = int(role.get("nodesPerInstance", 1))
    nodes = list(role["nodes"])
    return [nodes[i:i + k] for i in range(0, len(nodes), k)]


def _fill(groups: list[list[str]], hole: int) -> list[list[str]]:
    """The groups without group `hole`, the last group moved into its place (no other group renamed)."""
    groups = [list(g) for g in groups]
    last = groups.pop()
    if hole < len(groups):
        groups[hole] = last
    return groups


def _flat(groups: list[list[str]]) -> list[str]:
    return [n for g in groups for n in g]


def _common(s: dict[str, Any], node: str) -> tuple[list[Edit], list[str]]:
    """What every layout does: NODE out of `nodes` and `ssh.hostKeys`; etcd, proxy and Prometheus off it."""
    nodes = [n for n in s["nodes"] if n["name"] != node]
    edits = [Edit(("nodes",), nodes)]
    notes = []
    if node in (s.get("ssh") or {}).get("hostKeys", {}):
        edits.append(Edit(("ssh", "hostKeys", node), None))
    heir = nodes[0]["name"]
    for setting, what in (("etcd", "etcd (its data starts empty: every openYuanrong worker registers again)"),
                          ("proxy", "the PD proxy (clients move to its address)"),
                          ("monitoring", "Prometheus (its history stays on the lost machine)")):
        if (s.get(setting) or {}).get("node") == node:
            edits.append(Edit((setting, "node"), heir))
            notes.append(f"{what} moves from {node} to {heir}")
    return edits, notes


def candidates(s: dict[str, Any], node: str) -> list[Proposal]:
    """The layouts without NODE, in order of preference (module docstring)."""
    names = [n["name"] for n in s["nodes"]]
    if node not in names:
        raise ReplanError(f"{node} is not a node of the stack (its nodes: {', '.join(names)})")
    if len(names) == 1:
        raise ReplanError(f"{node} is the stack's only node")
    base, notes = _common(s, node)
    role = next((r for r in ROLES if node in (s.get(r) or {}).get("nodes", [])), None)
    if role is None:
        return [Proposal(f"{node} served no role: it leaves the stack", tuple(base), tuple(notes))]
    r = s[role]
    groups = _instances(r)
    hole = next(i for i, g in enumerate(groups) if node in g)
    k = int(r.get("nodesPerInstance", 1))
    out = []
    serving = {n for rr in ROLES for n in (s.get(rr) or {}).get("nodes", [])}
    spares = [n for n in names if n not in serving and n != node]
    if spares:
        out.append(Proposal(
            f"{spares[0]} (a spare) takes {node}'s place in {role}-{hole}",
            (*base, Edit((role, "nodes"), [spares[0] if n == node else n for n in r["nodes"]])), tuple(notes)))
    if role == "decode" and len(_instances(s["prefill"])) >= 2:
        donors = _instances(s["prefill"])
        giver = donors[-1]
        kept = [n if n != node else giver[0] for n in r["nodes"]]
        idle = giver[1:]
        out.append(Proposal(
            f"{giver[0]} (prefill-{len(donors) - 1}) joins the decode group in {node}'s place; prefill runs "
            f"{len(donors) - 1} instances instead of {len(donors)}",
            (*base, Edit(("decode", "nodes"), kept), Edit(("prefill", "nodes"), _flat(donors[:-1]))),
            (*notes, *([f"{', '.join(idle)} served prefill-{len(donors) - 1} with {giver[0]} and serve nothing now "
                        f"(their openYuanrong workers stay in the KV pool)"] if idle else []))))
    if len(groups) >= 2:
        rest = [n for n in groups[hole] if n != node]
        moved = groups[-1] if hole != len(groups) - 1 else []
        out.append(Proposal(
            f"{role} runs {len(groups) - 1} instances instead of {len(groups)}: {role}-{hole} goes"
            + (f", {role}-{len(groups) - 1} ({', '.join(moved)}) takes its place" if moved else ""),
            (*base, Edit((role, "nodes"), _flat(_fill(groups, hole)))),
            (*notes, *([f"{', '.join(rest)} served {role}-{hole} with {node} and serve nothing now (their "
                        f"openYuanrong workers stay in the KV pool)"] if rest else []))))
    if len(groups) == 1 and k > 1 and int(r["dp"]) % k == 0:
        dp = int(r["dp"]) // k * (k - 1)
        grows = ("; with expert parallelism each rank holds a larger share of the experts "
                 f"({r['dp']} x {r.get('tp', 1)} ranks before, {dp} x {r.get('tp', 1)} after): check that the weights "
                 f"still fit (vllm.flags gpu-memory-utilization)") if _expert_parallel(s, role) else ""
        out.append(Proposal(
            f"{role}-0 runs on {k - 1} nodes instead of {k}: dp {r['dp']} -> {dp}",
            (*base, Edit((role, "nodes"), [n for n in r["nodes"] if n != node]),
             Edit((role, "nodesPerInstance"), k - 1), Edit((role, "dp"), dp)),
            (*notes, f"{role} keeps {k - 1}/{k} of its ranks{grows}")))
    return out


def _expert_parallel(s: dict[str, Any], role: str) -> bool:
    flags = {**((s.get("vllm") or {}).get("flags") or {}), **((s.get(role) or {}).get("flags") or {})}
    return bool(flags.get("enable-expert-parallel"))


def apply(s: dict[str, Any], edits: tuple[Edit, ...]) -> dict[str, Any]:
    out = copy.deepcopy(s)
    for e in edits:
        target = out
        for key in e.path[:-1]:
            target = target.setdefault(key, {})
        if e.value is None:
            target.pop(e.path[-1], None)
        else:
            target[e.path[-1]] = copy.deepcopy(e.value)
    return out


def choose(stack: str, raw: dict[str, str], node: str) -> Outcome:
    """The first proposal whose settings make a plan; ReplanError naming each refusal when none does."""
    s = _settings(raw)
    refused = []
    for p in candidates(s, node):
        new = apply(s, p.edits)
        try:
            plan = build_plan(load_config({k: json.dumps(v) for k, v in new.items()}), stack)
        except ConfigError as exc:
            refused.append((p.summary, "; ".join(str(x) for x in exc.problems)))
            continue
        return Outcome(p, plan, tuple(refused))
    why = "".join(f"\n  - {summary}: refused: {reason}" for summary, reason in refused)
    raise ReplanError(f"no layout without {node} that the plan accepts{why or ''}\n"
                      f"  {node}'s role cannot give up a node and still serve: put a spare in its place (a node of "
                      f"another name in `nodes` and in the role's nodes), then `ascend-pd forget-node`")


# -- the stack file ------------------------------------------------------------------------------------


def _yaml():
    from ruamel.yaml import YAML  # round trip: the operator's comments and layout stay

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)  # the stack files' style: `    - item` under `  key:`
    return y


def edited_text(text: str, edits: tuple[Edit, ...], merged: dict[str, Any]) -> str:
    """The stack file with `edits` applied in place. A setting the file does not write (a default from
    Pulumi.yaml) is written whole, from `merged`, then edited."""
    y = _yaml()
    doc = y.load(text)
    config = doc["config"]
    for e in edits:
        key = f"{PROJECT}:{e.path[0]}"
        if key not in config:
            config[key] = copy.deepcopy(merged.get(e.path[0], {}))
        if len(e.path) == 1:
            _replace(config, key, e.value)
            continue
        target = config[key]
        for part in e.path[1:-1]:
            if part not in target:
                target[part] = {}
            target = target[part]
        if e.value is None:
            target.pop(e.path[-1], None)
        else:
            _replace(target, e.path[-1], e.value)
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue()


def _replace(container: Any, key: str, value: Any) -> None:
    """Set container[key] = value, keeping the old list's entries (and their comments and flow style)
    for the items that stay: the `nodes` list keeps every other node's line as it was."""
    old = container.get(key)
    if isinstance(old, list) and isinstance(value, list):
        kept = [x for x in old if _plain(x) in [_plain(v) for v in value]]
        if [_plain(x) for x in kept] == value:
            while len(old) > len(kept):
                for i, x in enumerate(old):
                    if _plain(x) not in value:
                        del old[i]
                        break
            return
        if len(old) == len(value) and all(not isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                old[i] = v
            return
        if getattr(getattr(old, "fa", None), "flow_style", lambda: False)():
            from ruamel.yaml.comments import CommentedSeq

            seq = CommentedSeq(value)
            seq.fa.set_flow_style()  # `nodes: [p0, p3, p2]` stays on one line
            value = seq
    container[key] = value


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x))


def unified(before: str, after: str, name: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        f"{name} (now)", f"{name} (without the node)"))


def capacity(plan: Plan) -> str:
    parts = []
    for role in ROLES:
        insts = plan.instances_of(role)
        ranks = sum(len(i.ranks) for i in insts)
        parts.append(f"{role} {len(insts)} instance(s), {ranks} rank(s)")
    return "; ".join(parts)


@dataclass
class Replan:
    """One run of `ascend-pd replan`: propose (and with `write`, apply) the edit for a stack file."""

    stack: str
    stack_file: Path
    project_dir: Path
    node: str
    write: bool = False
    log: Callable[[str], None] = print
    compare_report: Optional[Callable[[Path, Path], str]] = None  # (old file, new file) -> `diff`'s report

    def run(self) -> int:
        raw = cli_config_map(self.stack, self.project_dir, stack_file=self.stack_file)
        before_plan = build_plan(load_config(raw), self.stack)
        outcome = choose(self.stack, raw, self.node)
        p = outcome.proposal
        text = self.stack_file.read_text(encoding="utf-8")
        new_text = edited_text(text, p.edits, _settings(raw))
        for summary, why in outcome.refused:
            self.log(f"not proposed: {summary}: {why}")
        self.log(f"proposed: {p.summary}")
        for n in p.notes:
            self.log(f"  - {n}")
        self.log(f"capacity: {capacity(before_plan)} -> {capacity(outcome.plan)}")
        self.log("")
        self.log(unified(text, new_text, self.stack_file.name))
        if self.compare_report is not None:
            scratch = self.stack_file.with_name(f".{self.stack_file.name}.replan-{self.node}")
            scratch.write_text(new_text, encoding="utf-8")
            try:
                self.log(self.compare_report(self.stack_file, scratch))
            finally:
                scratch.unlink(missing_ok=True)
        if not self.write:
            self.log(f"nothing written (add --write to apply it to {self.stack_file})")
            return 0
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = self.stack_file.with_name(f"{self.stack_file.name}.before-replan-{self.node}-{stamp}")
        backup.write_text(text, encoding="utf-8")
        self.stack_file.write_text(new_text, encoding="utf-8")
        self.log(f"written to {self.stack_file}; the file as it was: {backup}")
        self.log(f"next: `ascend-pd forget-node --stack {self.stack} {self.node}` while {self.node} is gone (a machine "
                 f"that still answers: `pulumi up`). {self.node} back once repaired: "
                 f"`cp {backup} {self.stack_file}`, then `pulumi up`.")
        return 0


__all__ = ["Replan", "ReplanError", "Proposal", "Edit", "Outcome", "candidates", "choose", "apply", "edited_text",
           "capacity"]
