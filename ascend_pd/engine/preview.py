"""The steps of a real `pulumi preview --json`: what the engine itself decided for each resource.

`pulumi preview --json` prints one document whose `steps` hold, per resource, the engine's op and
URN (`same`, `create`, `update`, `replace`, `delete`, ...) and the properties behind it
(`diffReasons`, `replaceReasons`). A replacement is one `replace` step there; whether it deletes
the old resource first and in which order the halves run is the engine's schedule, which the
model (model.py) supplies. `verdicts` is what `plan_up` takes from the engine in place of its own
per-resource diff; `model_verdicts` puts the model's steps in the same terms, so the two compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .model import CREATE, DELETE, DELETE_REPLACED, REPLACE, SAME, UPDATE, Step

# The engine's per-resource verdicts, as `pulumi preview --json` spells them.
VERDICTS = frozenset({SAME, CREATE, UPDATE, "replace", DELETE})
# Ops of a preview that are not a change of the resource (reads of external state, a refresh).
NOT_CHANGES = frozenset({"read", "refresh", "import", "discard"})
STACK_TYPE = "pulumi:pulumi:Stack"


class PreviewError(ValueError):
    """The file is not the output of `pulumi preview --json` for this project and stack."""


def resource_key(urn: str) -> str:
    """`<type chain>::<name>` of a URN, without stack, project and the stack's own type: the same key
    for a resource in the engine's URNs and in the SDK mocks' (capture.py)."""
    parts = urn.split("::", 3)
    if len(parts) != 4 or not parts[0].startswith("urn:pulumi:"):
        raise PreviewError(f"not a Pulumi URN: {urn[:200]!r}")
    chain, name = parts[2], parts[3]
    prefix = STACK_TYPE + "$"
    return f"{chain[len(prefix):] if chain.startswith(prefix) else chain}::{name}"


def stack_of(urn: str) -> str:
    return urn.split("::", 1)[0][len("urn:pulumi:"):]


@dataclass(frozen=True)
class EngineStep:
    op: str
    key: str  # resource_key(urn)
    type: str
    reasons: tuple[str, ...]  # replaceReasons for a replace, diffReasons otherwise


@dataclass(frozen=True)
class EnginePreview:
    label: str  # where it came from (a file name), for the report
    stack: str
    steps: tuple[EngineStep, ...]

    def verdicts(self) -> dict[str, str]:
        """Resource key -> the engine's verdict, for every resource the program registers or the
        state holds (providers the engine made by itself, `default_*`, and the stack left out)."""
        return {s.key: s.op for s in self.steps}

    def changes(self) -> dict[str, str]:
        return {k: op for k, op in self.verdicts().items() if op != SAME}


def _is_own(urn: str, type_: str) -> bool:
    """Whether the program registered the resource (not the stack, not an engine default provider)."""
    return type_ != STACK_TYPE and not urn.rsplit("::", 1)[-1].startswith("default_")


def parse(text: str, *, label: str, stack: Optional[str] = None) -> EnginePreview:
    """The preview in `text` (stdout of `pulumi preview --json`). Raises PreviewError naming what is
    wrong and how to get a good file."""
    how = "run `pulumi preview --json --stack STACK > FILE` and pass FILE"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PreviewError(f"{label}: not JSON ({exc.msg} at line {exc.lineno}): {how}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        if isinstance(doc, dict) and doc.get("diagnostics"):
            first = next((d.get("message", "") for d in doc["diagnostics"] if isinstance(d, dict)), "")
            raise PreviewError(f"{label}: the preview failed, it has no steps; its first diagnostic: "
                               f"{str(first).strip()[:300]}")
        raise PreviewError(f"{label}: no `steps` list: not the output of `pulumi preview --json`; {how}")
    steps: list[EngineStep] = []
    stacks: set[str] = set()
    for i, raw in enumerate(doc["steps"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("op"), str) or not isinstance(raw.get("urn"), str):
            raise PreviewError(f"{label}: step {i + 1} has no `op` and `urn`: {json.dumps(raw)[:200]}")
        op, urn = raw["op"], raw["urn"]
        state = raw.get("newState") or raw.get("oldState") or {}
        type_ = state.get("type") if isinstance(state, dict) else None
        key = resource_key(urn)
        type_ = type_ or key.split("::", 1)[0].rsplit("$", 1)[-1]
        stacks.add(stack_of(urn))
        if op in NOT_CHANGES or not _is_own(urn, type_):
            continue
        if op in (REPLACE, DELETE_REPLACED):  # a display that splits replacements: one verdict
            op = "replace"
        if op not in VERDICTS:
            raise PreviewError(f"{label}: step {i + 1} ({key}) has the op {op!r}, which this version does not "
                               f"know (known: {', '.join(sorted(VERDICTS))})")
        reasons = raw.get("replaceReasons") if op == "replace" else raw.get("diffReasons")
        steps.append(EngineStep(op, key, type_, tuple(str(r) for r in reasons or ())))
    if len(stacks) > 1:
        raise PreviewError(f"{label}: steps of several stacks ({', '.join(sorted(stacks))}): one preview per stack")
    found = next(iter(stacks), stack or "")
    if stack is not None and stacks and found != stack:
        raise PreviewError(f"{label}: a preview of the stack {found!r}, not {stack!r}: run it with `--stack {stack}`")
    return EnginePreview(label, found, tuple(steps))


def read(path: Path, *, stack: Optional[str] = None) -> EnginePreview:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PreviewError(f"{path}: cannot read it ({exc.strerror})") from None
    return parse(text, label=str(path), stack=stack)


def model_verdicts(steps: Sequence[Step]) -> dict[str, str]:
    """The model's steps as per-resource verdicts in the preview's terms (a replacement's two halves
    are one `replace`). Components are listed too: the engine reports their creates and deletes
    (a component is never updated: it has no inputs of its own)."""
    out: dict[str, str] = {}
    for s in steps:
        op = "replace" if s.op in (REPLACE, DELETE_REPLACED) else s.op
        out[resource_key(s.urn)] = op
    return out


def disagreements(model: Mapping[str, str], engine: Mapping[str, str]) -> list[str]:
    """Each resource whose change the model and the engine see differently, as one line."""
    out = []
    for key in sorted(set(model) | set(engine)):
        m, e = model.get(key, SAME), engine.get(key, SAME)
        if m != e:
            out.append(f"{key.rsplit('::', 1)[-1]} ({key.split('::', 1)[0].rsplit('$', 1)[-1]}): "
                       f"engine {e}, model {m}")
    return out


__all__ = ["EnginePreview", "EngineStep", "PreviewError", "parse", "read", "resource_key", "model_verdicts",
           "disagreements", "VERDICTS"]
