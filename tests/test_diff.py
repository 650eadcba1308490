"""`python -m ascend_pd diff`: for each kind of change, the report says what the engine model runs
(the same steps, in an order the engine can run them), which processes restart (against the ranks
whose commands change in the plans), whether each role keeps serving; an invalid config is exit 2
and its problems only; and the contract .github/scripts/diff_report.py relies on, run for real."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pulumi_harness import with_host_keys

from ascend_pd import scripts
from ascend_pd.__main__ import main
from ascend_pd.change import CHANGES, INVALID, NO_CHANGE, compare, exit_code, run
from ascend_pd.change.compare import graph_of, plan_of
from ascend_pd.change.effect import REPLACED, RESTART, ROLLING, STOP, AT_END
from ascend_pd.change.compare import FAILS, NOT_RUN
from ascend_pd.change.report import MARKDOWN_BUDGET, as_json, markdown, service_lines, text, verdict
from ascend_pd.change.scriptdiff import collapse, library_changes, library_texts, marker
from ascend_pd.change.sources import Side, working_tree
from ascend_pd.engine.model import DELETE, DELETE_REPLACED, REPLACE, UPDATE, execute, plan_up
from ascend_pd.engine.timing import MODEL_LOAD_S
from ascend_pd.loader import PROJECT_DIR

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".github" / "scripts"))
import diff_report  # noqa: E402


def base(stack: str) -> Side:
    return working_tree(stack, PROJECT_DIR)


def edited(stack: str, key: str, edit) -> Side:
    cfg = dict(base(stack).config)
    name = f"ascend-pd:{key}"
    value = json.loads(cfg[name]) if name in cfg and cfg[name][:1] in "[{" else cfg.get(name, {})
    value = edit(value) if edit(value) is not None else value
    cfg[name] = value if isinstance(value, str) else json.dumps(value)
    return Side("edited", cfg)


def engine_run(stack: str, old: Side, new: Side) -> list[tuple[str, str]]:
    """The acting steps in the order the engine model's scheduler runs them (one at a time)."""
    steps = plan_up(graph_of(stack, old.config).regs, graph_of(stack, new.config))
    ran: list[tuple[str, str]] = []
    outcome = execute([], steps, lambda s: ran.append((s.op, s.name)), parallel=1)
    assert outcome.ok
    return ran


def assert_matches_engine(change, stack: str, old: Side, new: Side) -> None:
    reported = [(s.op, s.name) for s in change.steps]
    ran = engine_run(stack, old, new)
    assert sorted(reported) == sorted(ran)
    # The report's order is one the engine can run: every step after the steps it waits for.
    steps = plan_up(graph_of(stack, old.config).regs, graph_of(stack, new.config))
    position = {(s.op, s.name): i for i, s in enumerate(change.steps)}
    for s in steps:
        for j in s.after:
            if (s.op, s.name) in position and (steps[j].op, steps[j].name) in position:
                assert position[(steps[j].op, steps[j].name)] < position[(s.op, s.name)], (steps[j].name, s.name)


def restarted(change, action=RESTART) -> set[str]:
    return {p.name for p in change.effect.processes if p.action == action}


def role(change, name):
    return next(r for r in change.effect.roles if r.role == name)


def changed_ranks(stack: str, old: Side, new: Side) -> set[str]:
    """Ranks whose command or environment differs, a DP group counted whole (its ranks restart together)."""
    before, after = plan_of(stack, old.config), plan_of(stack, new.config)
    was = {r.name: (r.argv, r.env) for r in before.ranks}
    out = set()
    for inst in after.instances:
        if any(was.get(r.name) != (r.argv, r.env) for r in inst.ranks):
            out |= {r.name for r in inst.ranks}
    return out


def test_a_tuning_flag_on_decode_restarts_its_group_and_is_an_outage_of_decode_only():
    old = base("a2-8node")
    new = edited("a2-8node", "decode", lambda d: d["flags"].update({"max-num-seqs": 99}))
    change = compare("a2-8node", old, new)
    assert exit_code(change) == CHANGES
    assert_matches_engine(change, "a2-8node", old, new)
    assert {(s.op, s.name) for s in change.steps} == {(UPDATE, f"d{i}-launch") for i in range(4)}
    assert restarted(change) == changed_ranks("a2-8node", old, new) == {f"decode-0-r{i}" for i in range(32)}
    assert {p.how for p in change.effect.processes} == {ROLLING}
    decode = role(change, "decode")
    assert decode.verdict == "outage" and decode.duration_s == MODEL_LOAD_S  # 1 instance, maxUnavailable 1
    assert role(change, "prefill").verdict == "unaffected"
    md = markdown(change)
    assert md.count("<details><summary><b>") == 1  # the four nodes' identical changes, merged
    assert "+      --max-num-seqs 99 \\" in md and "-      --max-num-seqs 30 \\" in md
    assert "no decode instance serves" in md


def test_a_tuning_flag_on_prefill_rolls_one_instance_at_a_time():
    old = base("a2-8node")
    new = edited("a2-8node", "prefill", lambda p: p["flags"].update({"max-num-seqs": 8}))
    change = compare("a2-8node", old, new)
    assert_matches_engine(change, "a2-8node", old, new)
    assert restarted(change) == changed_ranks("a2-8node", old, new)
    prefill = role(change, "prefill")
    assert prefill.verdict == "keeps serving (rolling)" and len(prefill.restarting) == 4
    assert prefill.duration_s == 4 * MODEL_LOAD_S  # 4 waves of maxUnavailable 1
    assert change.effect.up_s >= 4 * MODEL_LOAD_S
    # With as many slots as instances the whole role restarts at once: an outage.
    wide = dict(new.config, **{"ascend-pd:rollout": json.dumps({"maxUnavailable": 4})})
    assert role(compare("a2-8node", old, Side("wide", wide)), "prefill").verdict == "outage"


def test_max_unavailable_as_a_percentage_rolls_a_large_role_in_waves_of_a_quarter():
    """16 prefill instances (a2-8node with 12 more prefill nodes): the default `rollout.maxUnavailable`
    ("25%") gives 4 restart slots, so a prefill flag rolls in 4 waves, not 16; the launches take the
    same number (their `slots`), and a count still means a count. The committed 4 instances keep 1."""
    def grown(side: Side, rollout=None) -> Side:
        cfg = dict(side.config)
        nodes = json.loads(cfg["ascend-pd:nodes"])
        extra = [{"name": f"p{i}", "address": f"192.0.2.{100 + i}", "nic": nodes[0]["nic"]} for i in range(4, 16)]
        cfg["ascend-pd:nodes"] = json.dumps(nodes + extra)
        prefill = json.loads(cfg["ascend-pd:prefill"])
        prefill["nodes"] = prefill["nodes"] + [n["name"] for n in extra]
        cfg["ascend-pd:prefill"] = json.dumps(prefill)
        if rollout is not None:
            cfg["ascend-pd:rollout"] = json.dumps({"maxUnavailable": rollout})
        return Side(side.label, with_host_keys(cfg))

    assert plan_of("a2-8node", base("a2-8node").config).max_unavailable("prefill") == 1
    old = grown(base("a2-8node"))
    new = grown(edited("a2-8node", "prefill", lambda p: p["flags"].update({"max-num-seqs": 8})))
    plan = plan_of("a2-8node", new.config)
    assert (len(plan.instances_of("prefill")), plan.max_unavailable("prefill"), plan.max_unavailable("decode")) == (16, 4, 1)
    launch = next(s for s in scripts.node_scripts(plan, "p9") if s.name == "launch")
    assert "\nslots=4\n" in launch.create
    prefill = role(compare("a2-8node", old, new), "prefill")
    assert (len(prefill.restarting), prefill.max_unavailable) == (16, 4)
    assert prefill.verdict == "keeps serving (rolling)" and prefill.duration_s == 4 * MODEL_LOAD_S
    for rollout, slots in (("1%", 1), (6, 6)):  # resolved by the plan alone
        assert plan_of("a2-8node", grown(base("a2-8node"), rollout).config).max_unavailable("prefill") == slots
    for rollout, slots in ((1, 1), ("50%", 8)):
        o, n = grown(base("a2-8node"), rollout), grown(edited("a2-8node", "prefill",
                                                              lambda p: p["flags"].update({"max-num-seqs": 8})), rollout)
        r = role(compare("a2-8node", o, n), "prefill")
        assert (r.max_unavailable, r.duration_s) == (slots, -(-16 // slots) * MODEL_LOAD_S), rollout


def test_the_image_replaces_every_container_pulling_first_and_is_a_full_outage():
    old = base("a3-4node")
    new = edited("a3-4node", "container", lambda c: c.update(image=c["image"] + "-next"))
    change = compare("a3-4node", old, new)
    assert_matches_engine(change, "a3-4node", old, new)
    ops = [(s.op, s.name) for s in change.steps]
    nodes = [n.name for n in plan_of("a3-4node", new.config).nodes]
    for n in nodes:
        assert ops.index((REPLACE, f"{n}-image")) < ops.index((DELETE_REPLACED, f"{n}-container"))
        assert ops.index((DELETE_REPLACED, f"{n}-launch")) < ops.index((REPLACE, f"{n}-container"))
    assert restarted(change) >= {r.name for r in plan_of("a3-4node", new.config).ranks} | {"worker", "etcd", "proxy"}
    assert all(p.how == REPLACED for p in change.effect.processes)
    assert [r.verdict for r in change.effect.roles] == ["outage", "outage"]
    assert any("NPU container is replaced" in n for n in change.effect.notes)
    assert "image: " in text(change) and "-next" in text(change)


def on_decode_node(side: Side) -> Side:
    """The a2 stack with etcd and the proxy on d0 (the seed puts them on p0, a prefill node)."""
    cfg = dict(side.config)
    for key in ("etcd", "proxy"):
        value = json.loads(cfg[f"ascend-pd:{key}"])
        cfg[f"ascend-pd:{key}"] = json.dumps({**value, "node": "d0"})
    return Side(side.label, cfg)


def test_a_prefill_image_replaces_the_prefill_containers_only_rolling():
    old = on_decode_node(base("a2-8node"))
    new = on_decode_node(edited("a2-8node", "prefill", lambda p: p.update(image="quay.io/ascend/vllm-ascend:v0.20.2rc1-rebuild")))
    change = compare("a2-8node", old, new)
    assert_matches_engine(change, "a2-8node", old, new)
    prefill = [f"p{i}" for i in range(4)]
    assert {s.name for s in change.steps if s.op == REPLACE and s.name.endswith("-container")} == \
        {f"{n}-container" for n in prefill}
    assert not [s for s in change.steps if s.name.startswith("d")]  # decode's nodes untouched
    assert restarted(change) >= {r.name for r in plan_of("a2-8node", new.config).ranks_of("prefill")}
    assert {p.how for p in change.effect.processes if p.kind == "rank"} == {ROLLING}
    assert role(change, "prefill").verdict == "keeps serving (rolling)"
    assert role(change, "decode").verdict == "unaffected"
    assert {n.name: n.image for n in plan_of("a2-8node", new.config).nodes} == {
        **{n: "quay.io/ascend/vllm-ascend:v0.20.2rc1-rebuild" for n in prefill},
        **{f"d{i}": "quay.io/ascend/vllm-ascend:v0.20.2rc1" for i in range(4)}}


def test_max_unavailable_changed_beside_a_role_image_counts_from_the_next_up():
    """The old launch's delete drains its instance and takes the restart slot with the old script's
    `rollout.maxUnavailable`: lowered from 4 to 1 in the same up as a prefill image, all four
    instances go out at once (measured on the real engine: 575 of 822 requests failed). The report
    counts the old value and says to change it in an up of its own first; on its own it rolls."""
    def slots(n):
        return lambda r: r.update(maxUnavailable=n)

    old = on_decode_node(edited("a2-8node", "rollout", slots(4)))
    both = on_decode_node(Side("both", {**edited("a2-8node", "rollout", slots(1)).config,
                                        **{k: v for k, v in edited("a2-8node", "prefill", lambda p: p.update(
                                            image="quay.io/ascend/vllm-ascend:v0.20.2rc1-rebuild")).config.items()
                                           if k == "ascend-pd:prefill"}}))
    change = compare("a2-8node", old, both)
    assert (role(change, "prefill").max_unavailable, role(change, "prefill").verdict) == (4, "outage")
    assert any("change `rollout.maxUnavailable` in an `up` of its own first" in n for n in change.effect.notes)
    first = on_decode_node(edited("a2-8node", "rollout", slots(1)))
    alone = compare("a2-8node", first, both)
    assert (role(alone, "prefill").max_unavailable, role(alone, "prefill").verdict) == (1, "keeps serving (rolling)")
    assert not any("maxUnavailable" in n for n in alone.effect.notes)


def test_a_prefill_image_on_the_etcd_and_proxy_node_is_an_outage():
    """The seed's a2 layout: p0's container also runs etcd and the proxy, which its replacement stops:
    nothing drains through a proxy that is gone, the restart slots go with etcd."""
    old = base("a2-8node")
    new = edited("a2-8node", "prefill", lambda p: p.update(image="quay.io/ascend/vllm-ascend:v0.20.2rc1-rebuild"))
    change = compare("a2-8node", old, new)
    assert role(change, "prefill").verdict == "outage"
    assert {"etcd", "proxy"} <= restarted(change)
    assert any("the proxy restarts" in n for n in change.effect.notes)


def test_a_node_removed_from_prefill_is_stopped_at_the_end_and_prefill_keeps_serving():
    old = base("a2-8node")
    new = edited("a2-8node", "prefill", lambda p: p.update(nodes=["p0", "p2", "p3"]))
    change = compare("a2-8node", old, new)
    assert_matches_engine(change, "a2-8node", old, new)
    assert (change.steps[-1].op, change.steps[-1].name, change.steps[-1].phase) == (DELETE, "p1-launch", "final")
    at_end = {(p.node, p.name) for p in change.effect.processes if p.how == AT_END}
    assert at_end == {("p1", "prefill-1-r0"), ("p1", "prefill-1-r1")}
    # p2 and p3 run renumbered instances: the old ranks stop, the new names start.
    assert ("p3", "prefill-3-r0") in {(p.node, p.name) for p in change.effect.processes if p.action == STOP}
    prefill = role(change, "prefill")
    assert prefill.serving and prefill.removed == ("prefill-1",)
    assert role(change, "decode").verdict == "unaffected"
    assert "proxy" in restarted(change)  # its backend lists changed


def test_an_identity_setting_replaces_old_delete_first_and_restarts_what_uses_it():
    old = base("a2-8node")
    new = edited("a2-8node", "etcd", lambda e: e.update(dataDir="/workspace/etcd-2"))
    change = compare("a2-8node", old, new)
    assert_matches_engine(change, "a2-8node", old, new)
    ops = [(s.op, s.name) for s in change.steps]
    assert ops.index((DELETE_REPLACED, "p0-etcd")) < ops.index((REPLACE, "p0-etcd"))
    assert restarted(change) == {"etcd", "worker"}
    assert {p.node for p in change.effect.processes if p.name == "worker"} == {n.name for n in plan_of(
        "a2-8node", new.config).nodes}
    assert [r.verdict for r in change.effect.roles] == ["unaffected", "unaffected"]
    # stateDir: every service script keeps files there: everything is replaced, both roles down.
    moved = compare("a3-4node", base("a3-4node"), edited("a3-4node", "stateDir", lambda _: "/workspace/apd-2"))
    assert [r.verdict for r in moved.effect.roles] == ["outage", "outage"]
    assert {p.how for p in moved.effect.processes} == {REPLACED}


def test_etcd_into_its_own_container_restarts_etcd_and_every_worker_not_a_rank():
    old = base("a2-8node")
    new = edited("a2-8node", "etcd", lambda e: e.update(image="quay.io/coreos/etcd:v3.5.12"))
    change = compare("a2-8node", old, new)
    assert_matches_engine(change, "a2-8node", old, new)
    etcd = [p for p in change.effect.processes if p.name == "etcd"]
    assert [(p.action, p.how) for p in etcd] == [(RESTART, REPLACED)]  # the binary stops, the container starts
    assert {p.name for p in change.effect.processes} == {"etcd", "worker"}
    assert [r.verdict for r in change.effect.roles] == ["unaffected", "unaffected"]


def test_no_change_is_one_line_and_exit_0():
    change = compare("a3-4node", base("a3-4node"), base("a3-4node"))
    assert exit_code(change) == NO_CHANGE and not change.steps
    for form in (text, markdown):
        assert len(form(change).strip().splitlines()) == 1 and "no change" in form(change)
    assert json.loads(as_json(change))["changed"] is False


def test_an_invalid_config_is_exit_2_with_its_problems_only(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", project)
    good = PROJECT_DIR / "Pulumi.a3-4node.yaml"
    (project / "Pulumi.a3-4node.yaml").write_text(good.read_text().replace("ascend-pd:decode:", "ascend-pd:decode:\n    tpp: 3", 1))
    out, err = io.StringIO(), io.StringIO()
    assert run("a3-4node", project_dir=project, base_file=good, fmt="markdown", out=out, err=err) == INVALID
    assert "ascend-pd:decode.tpp" in out.getvalue() and "invalid configuration" in out.getvalue()
    assert "<details>" not in out.getvalue() and "Service" not in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert run("a3-4node", project_dir=project, base_file=good, fmt="text", out=out, err=err) == INVALID
    assert "ascend-pd:decode.tpp" in err.getvalue() and out.getvalue() == ""
    assert run("a3-4node", project_dir=project, base_file=tmp_path / "missing.yaml", out=out, err=err) == INVALID
    assert "--base-file" in err.getvalue()


def test_libraries_are_collapsed_and_a_changed_one_is_shown_once():
    libs = library_texts()
    body = libs["lib.sh"]
    assert "pid_of() {" in body
    script = "#!/bin/bash\nx=1\n" + body + "echo one\n"
    folded = collapse(script, libs)
    assert "pid_of() {" not in folded.text and marker("lib.sh", body) in folded.text
    assert folded.libraries == {"lib.sh": body}
    changed = body.replace("pid_of() {", "pid_of() {  # changed")
    a, b = collapse(script, libs), collapse(script.replace(body, changed), {"lib.sh": changed})
    shown = library_changes([a.libraries, a.libraries], [b.libraries, b.libraries])
    assert list(shown) == ["lib.sh"] and sum(line.startswith("+pid_of") for line in shown["lib.sh"]) == 1
    # In a real report no script diff repeats a library line.
    change = compare("a2-8node", base("a2-8node"),
                     edited("a2-8node", "decode", lambda d: d["flags"].update({"max-num-seqs": 99})))
    assert change.scripts and not any("pid_of() {" in line for sc in change.scripts for line in sc.diff)


# ---------------------------------------------------------------------------------------------
# The contract of .github/scripts/diff_report.py, with the real command in a git repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy of the program in a git repository: the base commit, then a decode flag changed in a3-4node."""
    root = tmp_path_factory.mktemp("diff-repo")
    for name in ("ascend_pd", "components"):  # `components` only while the program still has it there
        if (PROJECT_DIR / name).is_dir():
            shutil.copytree(PROJECT_DIR / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [PROJECT_DIR / "__main__.py", *PROJECT_DIR.glob("Pulumi*.yaml")]:
        shutil.copy(path, root)

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "base")
    stack = root / "Pulumi.a3-4node.yaml"
    text_ = stack.read_text()
    assert text_.count("max-num-seqs:") >= 1
    stack.write_text(text_.replace("max-num-seqs:", "max-num-seqs: 3 #", 1))
    return root, git("rev-parse", "HEAD")


def test_diff_report_runs_the_real_command_on_every_stack(repo, tmp_path, monkeypatch):
    root, sha = repo
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "out"
    code = diff_report.main(["--base", sha, "--out", str(out), "--python", sys.executable, "--project-dir", str(root)])
    assert code == 0
    comment = (out / "report.md").read_text()
    assert "| `a2-8node` | no change |" in comment
    # The table leads with each changed stack's verdict (the first line of its section).
    assert "| `a3-4node` | changes: service: outage, about 20 min" in comment and "decode: unaffected" in comment
    assert "<details><summary><b>" in comment and "max-num-seqs 3" in comment


def test_the_command_line_exit_codes(repo, capsys):
    """In process (the subprocess path is the test above): graphs come from this process's cache."""
    root, sha = repo
    common = ["--base", sha, "--project-dir", str(root)]
    assert main(["diff", "--stack", "a2-8node", *common, "--format", "markdown"]) == NO_CHANGE
    assert len(capsys.readouterr().out.strip().splitlines()) == 1
    assert main(["diff", "--stack", "a3-4node", *common, "--format", "json"]) == CHANGES
    doc = json.loads(capsys.readouterr().out)
    assert {(s["op"], s["resource"]) for s in doc["steps"]} == {(UPDATE, "p0-launch"), (UPDATE, "p1-launch")}
    assert [r["verdict"] for r in doc["roles"]] == ["outage", "unaffected"]  # one prefill instance
    # A stack file the base does not have: everything is created, nothing served before.
    shutil.copy(root / "Pulumi.a2-8node.yaml", root / "Pulumi.a2-new.yaml")
    out = io.StringIO()
    assert run("a2-new", project_dir=root, base=sha, fmt="json", out=out, err=io.StringIO()) == CHANGES
    doc = json.loads(out.getvalue())
    assert {s["op"] for s in doc["steps"]} == {"create"}
    assert [r["verdict"] for r in doc["roles"]] == ["starts (nothing served before)"] * 2
    # A change of the program itself is named, not hidden behind "no change".
    lib = root / "ascend_pd" / "shell" / "lib.sh"
    original = lib.read_text()
    try:
        lib.write_text(original + "# changed\n")
        out = io.StringIO()
        assert run("a2-8node", project_dir=root, base=sha, fmt="markdown", out=out, err=io.StringIO()) == NO_CHANGE
        assert len(out.getvalue().strip().splitlines()) == 1 and "`ascend_pd/shell/lib.sh`" in out.getvalue()
    finally:
        lib.write_text(original)
    err = io.StringIO()
    assert run("a3-4node", project_dir=root, base="no-such-ref", out=io.StringIO(), err=err) == INVALID
    assert "no-such-ref" in err.getvalue()


# ---------------------------------------------------------------------------------------------
# Issue 22, item 6: where the report was wrong


def strict_json(doc: str):
    """JSON as the standard has it: no Infinity or NaN (Python's json accepts them by default)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(doc, parse_constant=refuse)


def test_a_decode_flag_as_a_pr_comment_is_short_and_leads_with_the_verdict():
    """Was 69 KB (850 lines): four nodes' identical diffs, each with 24 fingerprint-only lines and the
    same flag hunk 8 times. Now: merged, fingerprints dropped, repeats folded, verdict first."""
    change = compare("a2-8node", base("a2-8node"),
                     edited("a2-8node", "decode", lambda d: d["flags"].update({"max-num-seqs": 99})))
    md = markdown(change)
    assert len(md) < 10_000
    first = md.splitlines()[0]
    assert first.startswith("**service: outage") and "prefill: unaffected" in first and "decode: outage" in first
    assert "endpoint unchanged" in first
    assert "d0, d1, d2, d3: the same change on each (shown for d0)" in md
    assert md.count("+      --max-num-seqs 99 \\") == 1 and "the same change 7 more time(s)" in md
    assert not [line for line in md.splitlines() if line[:1] in "+-" and "running_with" in line]
    assert "24 process fingerprint line(s) change" in md
    assert "service (P/D as a whole): outage" in text(change)
    # The restart goes through the slots, but decode has no spare instance: not "rolling".
    assert "| d0 | restart | outage (no spare instance) | decode-0 ranks 0,1,2,3,4,5,6,7 |" in md
    assert "| rolling |" not in md


def test_a_markdown_report_always_fits_a_comment_and_points_to_the_full_report():
    """A first deploy shows every script whole: capped, cut at whole sections, pointing elsewhere."""
    change = compare("a2-8node", Side("empty", None), base("a2-8node"))
    full = markdown(change, budget=None)
    assert len(full) > MARKDOWN_BUDGET
    for budget in (MARKDOWN_BUDGET, 8_000):
        md = markdown(change, budget=budget)
        assert len(md) <= budget
        assert md.startswith("**service: starts")
        assert "full-report.md" in md and "not shown here" in md
        assert md.count("<details") == md.count("</details>") and md.count("```") % 2 == 0


def test_a_node_renamed_without_former_names_will_fail_on_the_container_name():
    """README and tests/integration/test_scenarios.py: docker refuses the second container of the
    same name on the host; the run stops there, nothing stopped. Was: a completed run, decode outage."""
    def rename(nodes):
        nodes[7].update(name="d3x")

    new = edited("a2-8node", "nodes", rename)
    new.config["ascend-pd:decode"] = json.dumps({**json.loads(new.config["ascend-pd:decode"]),
                                                 "nodes": ["d0", "d1", "d2", "d3x"]})
    new = Side("edited", with_host_keys(new.config))
    change = compare("a2-8node", base("a2-8node"), new)
    first = verdict(change)
    assert first.startswith("this run will fail: `d3x-container`") and "formerNames: [d3]" in first
    assert [r.verdict for r in change.effect.roles] == ["unaffected", "unaffected"]
    assert not [p for p in change.effect.processes if p.action in (STOP, RESTART)]
    outcome = {s.name: s.outcome for s in change.steps}
    assert outcome["d3x-container"] == FAILS
    assert outcome["d3x-launch"] == outcome["d3-container"] == NOT_RUN
    assert markdown(change).startswith("**this run will fail")
    assert strict_json(as_json(change))["fails"]


def test_a_rename_with_former_names_in_a_multi_node_group_has_a_finite_time_and_strict_json():
    """Only d3's launch of the 4-node decode group updates: the unchanged launches are no gang members
    (was: the gang waited for them forever, "about never", and the JSON held Infinity)."""
    def rename(nodes):
        nodes[7].update(name="d3x", formerNames=["d3"])

    new = edited("a2-8node", "nodes", rename)
    new.config["ascend-pd:decode"] = json.dumps({**json.loads(new.config["ascend-pd:decode"]),
                                                 "nodes": ["d0", "d1", "d2", "d3x"]})
    new = Side("edited", with_host_keys(new.config))
    change = compare("a2-8node", base("a2-8node"), new)
    assert not change.effect.timing.stalled and change.effect.up_s < MODEL_LOAD_S
    assert "never" not in text(change)
    doc = strict_json(as_json(change))
    assert all(s["startS"] is not None for s in doc["steps"])
    # A time the model cannot give is null, never Infinity.
    import dataclasses
    change.steps[0] = dataclasses.replace(change.steps[0], start_s=float("inf"))
    change.effect.up_s = float("inf")
    doc = strict_json(as_json(change))
    assert doc["steps"][0]["startS"] is None and doc["upS"] is None


def test_the_order_of_keys_in_flags_and_env_maps_changes_nothing():
    def swap(section):
        def edit(value):
            items = list(value[section].items())
            items[0], items[1] = items[1], items[0]
            value[section] = dict(items)
        return edit

    for key, section in (("prefill", "flags"), ("decode", "flags"), ("vllm", "flags"), ("vllm", "env")):
        new = edited("a2-8node", key, swap(section))
        assert new.config != base("a2-8node").config
        change = compare("a2-8node", base("a2-8node"), new)
        assert exit_code(change) == NO_CHANGE, (key, section, [s.name for s in change.steps])


def test_adding_the_ssh_key_secret_updates_every_command(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", project)
    good = PROJECT_DIR / "Pulumi.a3-4node.yaml"
    (project / "Pulumi.a3-4node.yaml").write_text(
        good.read_text() + "  ascend-pd:sshPrivateKey:\n    secure: AAABAKx1c2VjcmV0a2V5\n")
    out = io.StringIO()
    assert run("a3-4node", project_dir=project, base_file=good, fmt="json", out=out, err=io.StringIO()) == CHANGES
    doc = strict_json(out.getvalue())
    commands = {r.name for r in graph_of("a3-4node", base("a3-4node").config).regs
                if r.type == "command:remote:Command"}
    assert {s["resource"] for s in doc["steps"]} == commands
    assert {s["op"] for s in doc["steps"]} == {UPDATE} and all(s["why"] == ["connection"] for s in doc["steps"])
    assert any("`ascend-pd:sshPrivateKey` is added" in n for n in doc["notes"])
    assert doc["service"] == "keeps serving"


def test_the_wording_of_model_path_flags_container_proxy_and_kv_pool_changes():
    s = "a2-8node"
    model = compare(s, base(s), edited(s, "model", lambda m: m.update(path="/weights/other/")))
    assert "old and new model mixed meanwhile" in verdict(model)
    assert any("prefill instances of one model hand their KV cache to decode instances of the other" in n
               for n in model.effect.notes)

    flags = compare(s, base(s), edited(s, "vllm", lambda v: v["flags"].update({"seed": 7})))
    assert verdict(flags).startswith("service: outage")
    assert "service (P/D as a whole): outage" in service_lines(flags)[0]

    shm = compare(s, base(s), edited(s, "container", lambda c: c.update(shmSize="700g")))
    container_note = next(n for n in shm.effect.notes if "NPU container is replaced" in n)
    assert "pulled" not in container_note and "the image stays (no pull)" in container_note

    moved = compare(s, base(s), edited(s, "proxy", lambda p: p.update(node="d0")))
    assert not any("the proxy restarts" in n for n in moved.effect.notes)
    assert "endpoint moves: `proxyUrl` http://192.0.2.10:" in verdict(moved)
    assert any("`proxyUrl` (the clients' endpoint) changes" in n for n in moved.effect.notes)
    assert verdict(moved).startswith("service: keeps serving")

    for key, edit in (("etcd", lambda e: e.update(node="p1")), ("yuanrong", lambda y: y.update(sharedMemoryMb=1000))):
        change = compare(s, base(s), edited(s, key, edit))
        assert any("the KV cache pool is formed again" in n for n in change.effect.notes), key

    # An outage of decode by updates (no replacement) never reads "replaced".
    decode = compare(s, base(s), edited(s, "decode", lambda d: d["flags"].update({"max-num-seqs": 99})))
    assert "replaced" not in next(line for line in service_lines(decode) if line.startswith("decode:"))
