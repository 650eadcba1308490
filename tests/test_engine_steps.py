"""The engine model and `diff --preview-json` held to the real engine's steps on every change scenario,
with no CLI and no cluster: tests/engine_steps/ keeps what the real `pulumi preview --json` and
`pulumi up` did (tests/realengine/test_scenarios.py records it; tests/engine_record.py says how).

- the model's verdict for every resource is the engine's;
- the model's steps are the ones the real `up` took, and the real `up` ran none of them before a
  step the model makes it wait for had finished;
- `diff --preview-json` with the kept preview reports the engine's steps, says so, and finds
  nothing where the model would have said otherwise; a preview that disagrees is followed and
  named; a file that is not a preview of this stack is a usage error naming the file.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

import engine_record as er

from ascend_pd.__main__ import main
from ascend_pd.change import CHANGES, INVALID, compare
from ascend_pd.change.compare import graph_of
from ascend_pd.engine import preview as pv
from ascend_pd.engine.model import plan_up

RECORDS = er.records()
# The scenarios the issue names, each run by the real engine (tests/realengine/test_scenarios.py).
EXPECTED = {"decode-flag", "prefill-env", "prefill-image", "decode-image", "vllm-flags", "model-path", "container-shm",
            "yuanrong-shm", "etcd-moved", "proxy-moved", "node-added", "node-removed", "node-renamed-bare", "node-renamed-alias", "state-dir",
            "ssh-key-rotated", "converge", "monitoring-threshold", "rollout-slots"}


def graphs(r: er.Record):
    old = graph_of(r.stack, *er.config_of(r.before, r.keys[0]))
    new = graph_of(r.stack, *er.config_of(r.after, r.keys[1]))
    return old, new


def side(r: er.Record, which: str):
    return er.side(which, getattr(r, which), r.keys[0 if which == "before" else 1])


def test_every_scenario_has_the_engines_steps():
    assert {r.name for r in RECORDS} == EXPECTED
    pins = {json.dumps(r.pins, sort_keys=True) for r in RECORDS}
    assert len(pins) == 1, "recorded with different pins: regenerate all (tests/engine_record.py)"


@pytest.mark.parametrize("r", RECORDS, ids=lambda r: r.name)
def test_the_model_takes_the_engines_steps(r: er.Record):
    old, new = graphs(r)
    model = plan_up(old.regs, new)
    assert pv.disagreements(pv.model_verdicts(model), r.preview.verdicts()) == []
    if not r.up:
        return  # previewed only
    assert sorted((e["op"], e["key"]) for e in r.up) == sorted(k for k in map(er.acting_key, model) if k)
    assert er.order_violations(model, r.up) == []


def test_a_model_that_orders_wrongly_is_caught():
    """The order check can fail: the image replacement's recorded run, with the container's create
    moved before the delete of the launch it replaces, breaks the model's rule."""
    r = next(r for r in RECORDS if r.name == "container-shm")
    old, new = graphs(r)
    model = plan_up(old.regs, new)
    up = [dict(e) for e in r.up]
    create = next(e for e in up if e["op"] == "create-replacement" and e["key"].endswith("::p0-container"))
    create["start"] = -1
    assert any("p0-container started before" in v for v in er.order_violations(model, up))


@pytest.mark.parametrize("r", [r for r in RECORDS if r.preview.changes()], ids=lambda r: r.name)
def test_diff_with_the_preview_reports_the_engines_steps(r: er.Record):
    change = compare(r.stack, side(r, "before"), side(r, "after"), engine=r.preview)
    assert change.engine_notes == []
    assert "the engine's" in change.source and r.preview.label in change.source
    shown = {(s.op, s.name) for s in change.steps}
    for step in r.preview.steps:
        if step.op == "same" or step.type.startswith(("pulumi:providers:", "ascend-pd:index:")):
            continue  # providers and components do nothing on a node: not among the steps shown
        want = {"replace": "create-replacement"}.get(step.op, step.op)
        assert (want, step.key.rsplit("::", 1)[-1]) in shown, step


def test_diff_follows_the_engine_where_the_model_would_not():
    """A preview in which the engine replaces what the model only updates (as after a provider
    change the model does not know): the report shows the replacement and names the disagreement."""
    r = next(r for r in RECORDS if r.name == "decode-flag")
    doc = json.loads(json.dumps(r.preview_doc))
    target = next(s for s in doc["steps"] if s["op"] == "update" and s["urn"].endswith("::d0-launch"))
    target["op"], target["replaceReasons"] = "replace", ["triggers"]
    engine = pv.parse(json.dumps(doc), label="tampered.json", stack=r.stack)
    change = compare(r.stack, side(r, "before"), side(r, "after"), engine=engine)
    assert ("create-replacement", "d0-launch") in {(s.op, s.name) for s in change.steps}
    assert any("d0-launch (command:remote:Command): engine replace, model update" in n for n in change.engine_notes)
    fresh = compare(r.stack, side(r, "before"), side(r, "after"))
    assert ("update", "d0-launch") in {(s.op, s.name) for s in fresh.steps} and fresh.engine is None


def _stack_file(path: Path, settings: dict, key_generation: int) -> Path:
    config = {f"ascend-pd:{k}": v for k, v in settings.items()}
    config["ascend-pd:sshPrivateKey"] = {"secure": f"v1:ciphertext-{key_generation}"}
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False, width=200))
    return path


def test_the_cli_reads_a_preview_file(tmp_path: Path):
    r = next(r for r in RECORDS if r.name == "decode-flag")
    project = tmp_path / "project"
    project.mkdir()
    stack = _stack_file(project / f"Pulumi.{r.stack}.yaml", r.after, 1)
    base = _stack_file(tmp_path / "old.yaml", r.before, 1)
    pj = tmp_path / "preview.json"
    pj.write_text(json.dumps(r.preview_doc))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["diff", "--stack-file", str(stack), "--base-file", str(base), "--preview-json", str(pj),
                     "--format", "json"])
    assert code == CHANGES, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["source"]["steps"] == "engine" and doc["source"]["preview"] == str(pj)
    assert doc["source"]["engineNotes"] == []
    assert {s["resource"] for s in doc["steps"]} == {s.key.rsplit("::", 1)[-1] for s in r.preview.steps
                                                     if s.op != "same" and not s.type.startswith("ascend-pd:index:")}
    text = io.StringIO()
    with redirect_stdout(text), redirect_stderr(io.StringIO()):
        main(["diff", "--stack-file", str(stack), "--base-file", str(base), "--preview-json", str(pj)])
    assert f"steps: the engine's (`pulumi preview --json`: {pj})" in text.getvalue()
    model = io.StringIO()
    with redirect_stdout(model), redirect_stderr(io.StringIO()):
        main(["diff", "--stack-file", str(stack), "--base-file", str(base)])
    assert "steps: the engine model's" in model.getvalue()


@pytest.mark.parametrize("content, says", [
    ("not json", "not JSON"),
    ('{"config": {}}', "no `steps` list"),
    ('{"diagnostics": [{"message": "error: could not connect to the backend"}]}', "could not connect to the backend"),
    ('{"steps": [{"op": "create", "urn": "urn:pulumi:other::ascend-pd::command:remote:Command::x"}]}',
     "a preview of the stack 'other', not 'a2-8node'"),
    ('{"steps": [{"op": "teleport", "urn": "urn:pulumi:a2-8node::ascend-pd::command:remote:Command::x"}]}',
     "the op 'teleport'"),
    ('{"steps": [{"op": "create"}]}', "step 1 has no `op` and `urn`"),
])
def test_a_file_that_is_not_a_preview_of_the_stack_is_refused(tmp_path: Path, content: str, says: str):
    pj = tmp_path / "preview.json"
    pj.write_text(content)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["diff", "--stack", "a2-8node", "--preview-json", str(pj)])
    assert code == INVALID
    assert str(pj) in err.getvalue() and says in err.getvalue(), err.getvalue()
