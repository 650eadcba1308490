"""The real engine's steps for each change scenario, kept as test data (tests/engine_steps/*.json).

tests/realengine/test_scenarios.py writes them (`bash tests/record_engine_steps`) from a real
`pulumi preview --json` and `pulumi up`; tests/test_engine_steps.py holds the engine model and
`diff --preview-json` to them on any clone, with no CLI and no cluster. One file per scenario:

- `before`, `after`: the stack's settings on each side (as the program reads them), and
  `sshKey`: which generation of the SSH key each side used (the key itself is not kept);
- `preview`: the engine's preview in `pulumi preview --json`'s own form (its `steps`: op, URN,
  diffReasons, replaceReasons; the full resource states left out), which `diff --preview-json` reads;
- `up`: each step of the real `up` with the sequence numbers of its start and end among the run's
  events: the order the engine really ran them in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ascend_pd.change.sources import Side
from ascend_pd.engine import preview as pv
from ascend_pd.engine.model import SAME, Step

STEPS_DIR = Path(__file__).resolve().parent / "engine_steps"
NOT_STEPS = ("same", "read", "refresh", "replace")  # `replace`: the engine's marker between two halves


def acting_key(step: Step) -> Optional[tuple[str, str]]:
    """A model step as (op, resource key), or None for what the engine does not report as a step
    (a same; the engine reports a component's create and delete like any other resource's)."""
    if step.op == SAME:
        return None
    return step.op, pv.resource_key(step.urn)


def is_program_step(op: str, urn: str, type_: str) -> bool:
    return op not in NOT_STEPS and type_ != pv.STACK_TYPE and not urn.rsplit("::", 1)[-1].startswith("default_")


def order_violations(model: list[Step], order: list[dict]) -> list[str]:
    """Steps the real run started in an order the model forbids: before a step that the model makes
    it wait for (directly, or through steps that do nothing) had finished. A component's step is
    done for its children once it has started: the engine ends it only when the component registers
    its outputs, after them."""
    at = {(e["op"], e["key"]): e for e in order}

    def acting_before(i: int, seen: set[int]) -> set[tuple[tuple[str, str], bool]]:
        found: set[tuple[tuple[str, str], bool]] = set()
        for j in model[i].after:
            if j not in seen:
                seen.add(j)
                k = acting_key(model[j])
                found |= {(k, model[j].reg.custom)} if k is not None else acting_before(j, seen)
        return found

    out = []
    for i, s in enumerate(model):
        k = acting_key(s)
        if k is None or k not in at:
            continue
        for before, custom in sorted(acting_before(i, set())):
            done = at[before]["end" if custom else "start"] if before in at else None
            if done is not None and done > at[k]["start"]:
                out.append(f"{k[0]} {k[1]} started before {before[0]} {before[1]} finished")
    return out


def config_of(settings: dict[str, Any], key_generation: int) -> tuple[dict[str, str], dict[str, str]]:
    """(config, secrets) as the CLI hands them to the program: the SSH key a stand-in per generation."""
    config = {f"ascend-pd:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in settings.items()}
    return config, {"ascend-pd:sshPrivateKey": f"-----BEGIN OPENSSH PRIVATE KEY-----\nkey-{key_generation}\n"}


def side(label: str, settings: dict[str, Any], key_generation: int) -> Side:
    """One side of `diff` (change.compare) with these settings."""
    config, secrets = config_of(settings, key_generation)
    return Side(label, config, secrets=secrets)


@dataclass(frozen=True)
class Record:
    name: str
    stack: str
    pins: dict[str, str]
    before: dict[str, Any]
    after: dict[str, Any]
    keys: tuple[int, int]
    preview_doc: dict[str, Any]
    up: list[dict]  # empty: previewed only

    @property
    def preview(self) -> pv.EnginePreview:
        return pv.parse(json.dumps(self.preview_doc), label=f"tests/engine_steps/{self.name}.json", stack=self.stack)


def write(name: str, stack: str, pins: dict[str, str], before: dict, after: dict, keys: tuple[int, int],
          preview_doc: dict, up: list[dict]) -> Path:
    STEPS_DIR.mkdir(exist_ok=True)
    steps = [{k: s[k] for k in ("op", "urn", "diffReasons", "replaceReasons") if k in s} for s in preview_doc["steps"]]
    data = {"stack": stack, "scenario": name, "pins": pins, "sshKey": {"before": keys[0], "after": keys[1]},
            "before": before, "after": after, "preview": {"steps": steps}, "up": up}
    path = STEPS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def load(path: Path) -> Record:
    d = json.loads(path.read_text())
    return Record(d["scenario"], d["stack"], d["pins"], d["before"], d["after"],
                  (d["sshKey"]["before"], d["sshKey"]["after"]), d["preview"], d["up"])


def records() -> list[Record]:
    return [load(p) for p in sorted(STEPS_DIR.glob("*.json"))]
