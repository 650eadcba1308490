"""Compare two sides of a stack: validate the new one, capture both Pulumi graphs under the SDK's
mocks, run the engine model from the old graph (as the state of the last `up`) to the new one, and
collect what a reviewer needs: the steps in order, the script diffs per node, the service effect."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import forked
from ..engine.capture import COMMAND, Graph, capture, plain
from ..engine.model import CREATE, DELETE, DELETE_REPLACED, REPLACE, UPDATE, Step, plan_up
from ..engine.preview import EnginePreview, disagreements, model_verdicts, resource_key
from ..errors import ConfigError, Problem, Source
from ..loader import load_config
from ..plan import Plan, build_plan
from .effect import Effect, analyse, node_of
from .scriptdiff import collapse, drop_fingerprints, fold_repeats, library_changes, library_texts, unified
from .sources import Side

SHOWN_VALUE_CHARS = 160
FAILS, NOT_RUN = "fails", "does not run"
_GRAPHS: dict[str, Graph] = {}  # capture is deterministic: one run per (stack, config) per process


@dataclass(frozen=True)
class StepView:
    order: int  # 1-based, in the engine's start order (simulated)
    op: str
    name: str
    type: str
    node: str
    why: tuple[str, ...]
    phase: str
    start_s: float
    outcome: str = ""  # "" runs; FAILS: the model knows it fails; NOT_RUN: after a failure, never started


@dataclass(frozen=True)
class ScriptChange:
    node: str
    resource: str
    op: str
    diff: tuple[str, ...]  # unified diff of the create (libraries collapsed); empty: only other inputs
    inputs: tuple[str, ...]  # other changed inputs ("triggers", "delete", or "image: a -> b")


@dataclass
class Change:
    stack: str
    base: Side
    new: Side
    problems: Optional[ConfigError] = None  # the new config's: then nothing else is computed
    base_problem: Optional[ConfigError] = None  # an invalid base is compared as an empty state
    steps: list[StepView] = field(default_factory=list)
    scripts: list[ScriptChange] = field(default_factory=list)
    libraries: dict[str, list[str]] = field(default_factory=dict)
    effect: Optional[Effect] = None
    resources: int = 0  # in the new graph
    parallel: int = 0  # the `pulumi up --parallel` the new plan asks for (the timing uses it)
    engine: Optional[EnginePreview] = None  # the real `pulumi preview --json` the steps came from
    engine_notes: list[str] = field(default_factory=list)  # where the model alone would have said otherwise
    warnings: list[Problem] = field(default_factory=list)  # what the new side's release does not read (releases.py)

    @property
    def source(self) -> str:
        """Which steps the report shows: the engine's own, or the model's."""
        if self.engine is not None:
            return (f"the engine's (`pulumi preview --json`: {self.engine.label}); their order and times: "
                    "the engine model's")
        return "the engine model's (no `--preview-json`: ascend_pd/engine/, held to the real engine in CI)"

    @property
    def changed(self) -> bool:
        return bool(self.steps)


def graph_of(stack: str, config: dict[str, str], secrets: Optional[dict[str, str]] = None) -> Graph:
    """The graph of `config`; `secrets` (key -> a stand-in for the encrypted value, the same for the
    same ciphertext) are passed as the CLI passes secrets, so an added, removed or re-encrypted
    secret changes the inputs that carry it (every Command's connection for `sshPrivateKey`)."""
    return graphs_of(stack, [(config, secrets)])[0]


def graphs_of(stack: str, sides: list[tuple[dict[str, str], Optional[dict[str, str]]]]) -> list[Graph]:
    """graph_of of each (config, secrets). Those not captured yet are captured at once, each in a
    process forked for it, when there are two and a second core: the program under the mocks is
    single-threaded Python (asyncio), so two sides take the time of one; the SDK's per-run objects
    go with the child, and only the registrations come back."""
    keyed = []
    for config, secrets in sides:
        secrets = dict(secrets or {})
        keyed.append((json.dumps([stack, sorted(config.items()), sorted(secrets.items())]), config, secrets))
    todo = {key: (config, secrets) for key, config, secrets in keyed if key not in _GRAPHS}
    if len(todo) > 1 and (os.cpu_count() or 1) > 1 and hasattr(os, "fork"):
        _GRAPHS.update(forked.run_all({key: (_capture, (stack, config, secrets)) for key, (config, secrets) in todo.items()}))
    for key, (config, secrets) in todo.items():
        if key not in _GRAPHS:  # one side, one core, or a child that failed: here, where its error is raised
            _GRAPHS[key] = _capture(stack, config, secrets)
    return [_GRAPHS[key] for key, _, _ in keyed]


def _capture(stack: str, config: dict[str, str], secrets: dict[str, str]) -> Graph:
    return capture({**config, **secrets}, stack=stack, secret_keys=list(secrets))


def plan_of(stack: str, config: dict[str, str], source: Optional[Source] = None) -> Plan:
    """The plan of `config`; with its `source`, every problem names its file and line, as `render`'s do."""
    try:
        plan = build_plan(load_config({k.split(":", 1)[1]: v for k, v in config.items()}, source), stack)
    except ConfigError as exc:
        raise (source.locate(exc) if source is not None else exc) from None
    if source is None:
        return plan
    return dataclasses.replace(plan, warnings=tuple(source.locate(ConfigError(list(plan.warnings))).problems))


def _short(value: Any) -> str:
    text = json.dumps(plain(value), sort_keys=True) if not isinstance(plain(value), str) else plain(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 3] + "..."


def _inputs_changed(step: Step) -> tuple[str, ...]:
    old = step.old.inputs if step.old is not None else {}
    new = step.new.inputs if step.new is not None else {}
    out = []
    for key in sorted(set(old) | set(new)):
        if step.type == COMMAND and key == "create":
            continue
        if plain(old.get(key)) == plain(new.get(key)):
            if key in step.why:
                out.append(f"{key}: changes with a replaced dependency")
            continue
        if key in ("connection",):
            out.append(f"{key}: changed (secret: not shown)")
        elif step.type == COMMAND and key == "delete":
            out.append("delete: changed (the old delete runs only when the resource is replaced or removed)")
        else:
            out.append(f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}" if key in old and key in new
                       else f"{key}: {'added' if key in new else 'removed'}")
    if not out and step.op == REPLACE and step.why:
        # Forced out by a replaced dependency (its container): the old delete ran first, then this create.
        out.append(f"{', '.join(step.why)}: its old delete runs first, then its create again")
    return tuple(out)


def _secret_notes(base: Side, new: Side) -> list[str]:
    out = []
    for key in sorted(set(base.secrets) | set(new.secrets)):
        was, now = base.secrets.get(key), new.secrets.get(key)
        if was == now:
            continue
        what = "added" if was is None else "removed" if now is None else "encrypted anew (its ciphertext differs)"
        text = (f"the secret `{key}` is {what}: the SSH connection of every Command carries it, so every Command is "
                "updated and its create runs again on its node (the scripts are idempotent: processes whose command "
                "is the same run on)")
        if was is not None and now is not None:
            text += ("; `diff` cannot decrypt secrets: if the key itself is the same (only encrypted again), "
                     "`pulumi up` compares the plain values and changes nothing")
        out.append(text)
    return out


def _engine_steps(engine: EnginePreview, old_graph: Optional[Graph], new_graph: Graph,
                  change: Change) -> list[Step]:
    """plan_up with the engine's verdicts; what the engine sees that the base and the working tree do
    not explain (its state is not the base's deploy) goes into the notes."""
    model = plan_up(old_graph.regs if old_graph else [], new_graph)
    steps = plan_up(old_graph.regs if old_graph else [], new_graph, engine.verdicts(),
                    {s.key: s.reasons for s in engine.steps})
    known = {resource_key(r.urn) for g in (old_graph, new_graph) if g is not None for r in g.regs}
    unknown = sorted(s.key.rsplit("::", 1)[-1] for s in engine.steps if s.key not in known and s.op != "same")
    if unknown:
        change.engine_notes.append(
            f"the engine also changes {', '.join(unknown)}, which neither the base nor the working tree registers: "
            "the stack's state is not the base's deploy (an up of another commit, or a failed run); they are not "
            "in the steps below")
    differ = disagreements(model_verdicts(model), {k: v for k, v in engine.verdicts().items() if k in known})
    if differ:
        change.engine_notes.append("the engine model alone would have said otherwise for: " + "; ".join(differ))
    return steps


def compare(stack: str, base: Side, new: Side, progress: Callable[[str], None] = lambda _: None,
            engine: Optional[EnginePreview] = None) -> Change:
    """`engine`: a real `pulumi preview --json` of the new side; its verdicts replace the model's."""
    change = Change(stack, base, new, engine=engine)
    if new.problem is not None:
        change.problems = new.problem
        return change
    try:
        progress("validating the working tree's config")
        new_plan = plan_of(stack, new.config or {}, new.source)
    except ConfigError as exc:
        change.problems = exc
        return change
    change.warnings = list(new_plan.warnings)
    old_plan: Optional[Plan] = None
    old_graph: Optional[Graph] = None
    if base.problem is not None:
        change.base_problem = base.problem
    elif base.config is not None:
        try:
            old_plan = plan_of(stack, base.config)
        except ConfigError as exc:
            change.base_problem = exc
    if old_plan is not None:
        progress(f"rendering the base ({base.label}) and the working tree under Pulumi mocks")
        old_graph, new_graph = graphs_of(stack, [(base.config or {}, base.secrets), (new.config or {}, new.secrets)])
    else:
        progress("rendering the working tree under Pulumi mocks")
        new_graph = graph_of(stack, new.config or {}, new.secrets)
    change.resources = len(new_graph.regs)
    change.parallel = new_plan.up_parallelism
    if engine is not None:
        progress(f"taking the steps from the engine's preview ({engine.label})")
        steps = _engine_steps(engine, old_graph, new_graph, change)
    else:
        progress("planning `pulumi up` with the engine model")
        steps = plan_up(old_graph.regs if old_graph else [], new_graph)
    effect = analyse(steps, old_plan, new_plan, old_graph, new_graph)
    change.effect = effect
    if old_graph is not None:
        effect.notes[:0] = _secret_notes(base, new)
    old_scripts, new_scripts = effect.old_scripts, effect.new_scripts
    timing = effect.timing
    acting = [i for i, s in enumerate(steps) if s.acts]
    # Registration order varies from run to run (outputs resolve asynchronously): ties go by name,
    # so the same change gives the same report. A prerequisite that takes no time still sorts first
    # (it finishes at its start, before the dependent that starts then).
    acting.sort(key=lambda i: (timing.started_s[i], timing.finished_s[i], steps[i].name) if timing else (0, 0, i))
    fail_at = min((timing.started_s[i] for i in acting if steps[i].name in effect.failing_steps), default=None) \
        if timing else None
    for n, i in enumerate(acting, 1):
        s = steps[i]
        node = node_of(s, new_scripts if s.new is not None else old_scripts, new_plan if s.new is not None else old_plan)
        outcome = ""
        if s.name in effect.failing_steps and s.phase == "main":
            outcome = FAILS
        elif fail_at is not None and (s.phase != "main" or timing.started_s[i] > fail_at):
            outcome = NOT_RUN
        change.steps.append(StepView(n, s.op, s.name, s.type, node, s.why, s.phase,
                                     timing.started_s[i] if timing else 0.0, outcome))
    libs = library_texts()
    found_old, found_new = [], []
    for i in acting:
        s = steps[i]
        if s.op == DELETE_REPLACED:
            continue  # shown with its replacement
        node = node_of(s, new_scripts if s.new is not None else old_scripts, new_plan if s.new is not None else old_plan)
        diff: list[str] = []
        if s.type == COMMAND and s.op in (CREATE, UPDATE, REPLACE):
            before = collapse(str(plain(s.old.inputs.get("create", ""))), libs) if s.old is not None else None
            after = collapse(str(plain(s.new.inputs.get("create", ""))), libs)
            found_new.append(after.libraries)
            if before is not None:
                found_old.append(before.libraries)
            diff = unified(before.text if before else "", after.text, f"base/{node}/{s.name}", f"new/{node}/{s.name}")
        if s.op == DELETE:
            change.scripts.append(ScriptChange(node, s.name, s.op, (), ("removed from the program: its delete runs "
                                                                       "at the end of the run",)))
            continue
        diff, fingerprints = drop_fingerprints(diff)
        inputs = _inputs_changed(s) if s.op != CREATE else ()
        if fingerprints:
            inputs += (f"{fingerprints} process fingerprint line(s) change with the commands they cover (not shown)",)
        change.scripts.append(ScriptChange(node, s.name, s.op, tuple(fold_repeats(diff)), inputs))
    change.libraries = library_changes(found_old, found_new)
    return change


__all__ = ["Change", "StepView", "ScriptChange", "compare", "graph_of", "plan_of", "DELETE", "REPLACE", "FAILS",
           "NOT_RUN"]
