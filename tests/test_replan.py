"""`ascend-pd replan --without NODE`: the stack edit that keeps serving without a node when no spare
exists. Every proposal is held to the plan (legal, NODE nowhere in it, no surviving instance renamed
unless named), the stack file's edit to what was proposed (comments kept), and the command to its
exit codes and its backup."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_pd import replan
from ascend_pd.errors import ConfigError
from ascend_pd.loader import PROJECT_DIR, cli_config_map, load_config
from ascend_pd.plan import Plan, build_plan
from ascend_pd.replan import Edit, Proposal, ReplanError, apply, choose, edited_text
from status_support import clean_env

STACKS = ("a2-8node", "a3-4node")


def plan_of(stack: str, settings: dict) -> Plan:
    return build_plan(load_config({k: json.dumps(v) for k, v in settings.items()}), stack)


def settings_of(stack: str) -> dict:
    return replan._settings(cli_config_map(stack))


def layout(plan: Plan) -> dict[str, tuple[str, ...]]:
    return {i.name: i.nodes for i in plan.instances}


def nodes_named(plan: Plan) -> set[str]:
    used = {n.name for n in plan.nodes} | {plan.etcd.node, plan.proxy.node}
    return used | {n for i in plan.instances for n in i.nodes}


@pytest.mark.parametrize("stack", STACKS)
def test_every_node_of_both_stacks_has_a_legal_layout_without_it(stack):
    s = settings_of(stack)
    before = layout(plan_of(stack, s))
    for node in [n["name"] for n in s["nodes"]]:
        outcome = choose(stack, cli_config_map(stack), node)
        plan = outcome.plan
        assert node not in nodes_named(plan), (stack, node)
        assert node not in (plan.cfg.ssh.host_keys or {}), (stack, node)
        # The plan the command reports is the plan of the edited settings.
        assert layout(plan_of(stack, apply(s, outcome.proposal.edits))) == layout(plan)
        # Both roles still serve.
        assert plan.instances_of("prefill") and plan.instances_of("decode"), (stack, node)
        # An instance that keeps its name keeps its nodes, unless the proposal says it moves.
        for name, nodes in layout(plan).items():
            if name in before and before[name] != nodes and node not in before[name]:
                assert name in outcome.proposal.summary or any(n in outcome.proposal.summary for n in nodes), \
                    (stack, node, name, before[name], nodes, outcome.proposal.summary)


def test_a_lost_a2_decode_node_takes_a_prefill_node_and_keeps_decode_whole():
    outcome = choose("a2-8node", cli_config_map("a2-8node"), "d1")
    assert "p3 (prefill-3) joins the decode group in d1's place" in outcome.proposal.summary
    assert layout(outcome.plan) == {"prefill-0": ("p0",), "prefill-1": ("p1",), "prefill-2": ("p2",),
                                    "decode-0": ("d0", "p3", "d2", "d3")}
    decode = outcome.plan.instances_of("decode")[0]
    assert len(decode.ranks) == 32 and [r.name for r in decode.ranks_on("p3")][0] == "decode-0-r8"
    assert outcome.refused == ()


def test_a_lost_a2_prefill_node_is_replaced_by_the_last_instance():
    outcome = choose("a2-8node", cli_config_map("a2-8node"), "p1")
    assert layout(outcome.plan) == {"prefill-0": ("p0",), "prefill-1": ("p3",), "prefill-2": ("p2",),
                                    "decode-0": ("d0", "d1", "d2", "d3")}
    assert "prefill-1 goes, prefill-3 (p3) takes its place" in outcome.proposal.summary


def test_the_etcd_and_proxy_node_hands_them_to_the_first_remaining_node():
    s = settings_of("a2-8node")
    assert s["etcd"]["node"] == s["proxy"]["node"] == "p0"
    outcome = choose("a2-8node", cli_config_map("a2-8node"), "p0")
    assert outcome.plan.etcd.node == outcome.plan.proxy.node == "p1"
    assert any("etcd" in n and "moves from p0 to p1" in n for n in outcome.proposal.notes)
    assert any("proxy" in n and "moves from p0 to p1" in n for n in outcome.proposal.notes)


def test_a3_shrinks_its_one_instance_and_says_the_weights_must_still_fit():
    outcome = choose("a3-4node", cli_config_map("a3-4node"), "d1")
    assert layout(outcome.plan)["decode-0"] == ("d0",)
    assert outcome.plan.cfg.decode.dp == 1 and outcome.plan.cfg.decode.nodes_per_instance == 1
    assert any("check that the weights still fit" in n for n in outcome.proposal.notes)


def test_a_layout_the_plan_refuses_is_skipped_and_said(monkeypatch):
    real = replan.candidates

    def with_an_illegal_first(s, node):
        bad = Proposal("decode on 33 ranks", (Edit(("decode", "dp"), 33),))
        return [bad, *real(s, node)]

    monkeypatch.setattr(replan, "candidates", with_an_illegal_first)
    outcome = choose("a2-8node", cli_config_map("a2-8node"), "d1")
    assert outcome.refused[0][0] == "decode on 33 ranks" and "decode" in outcome.refused[0][1]
    assert "p3 (prefill-3)" in outcome.proposal.summary


def test_no_layout_without_the_node_is_an_error_that_asks_for_a_spare():
    raw = cli_config_map("a3-4node")
    decode = json.loads(raw["decode"])
    raw["decode"] = json.dumps({**decode, "nodes": ["d0"], "nodesPerInstance": 1, "dp": 1})
    nodes = [n for n in json.loads(raw["nodes"]) if n["name"] != "d1"]
    raw["nodes"] = json.dumps(nodes)
    ssh = json.loads(raw["ssh"])
    ssh["hostKeys"].pop("d1")
    raw["ssh"] = json.dumps(ssh)
    with pytest.raises(ReplanError, match="(?s)no layout without d0.*put a spare in its place"):
        choose("a3-4node", raw, "d0")
    with pytest.raises(ReplanError, match="ghost is not a node of the stack"):
        choose("a3-4node", raw, "ghost")


@pytest.mark.parametrize("stack,node", [("a2-8node", "d1"), ("a2-8node", "p0"), ("a3-4node", "p1")])
def test_the_stack_file_edit_is_the_proposal_and_keeps_every_comment(stack, node, tmp_path):
    src = PROJECT_DIR / f"Pulumi.{stack}.yaml"
    text = src.read_text()
    outcome = choose(stack, cli_config_map(stack), node)
    new = edited_text(text, outcome.proposal.edits, replan._settings(cli_config_map(stack)))
    comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
    assert comments and comments == [line.strip() for line in new.splitlines() if line.strip().startswith("#")]
    (tmp_path / "Pulumi.yaml").write_bytes((PROJECT_DIR / "Pulumi.yaml").read_bytes())
    (tmp_path / src.name).write_text(new)
    written = build_plan(load_config(cli_config_map(stack, tmp_path)), stack)
    assert layout(written) == layout(outcome.plan)
    assert written.etcd.node == outcome.plan.etcd.node and written.proxy.node == outcome.plan.proxy.node
    # Only what the proposal changes: every other line of the file is as it was.
    changed = [line for line in new.splitlines() if line not in text.splitlines()]
    assert len(changed) <= len(outcome.proposal.edits) + 2, changed


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ascend_pd", *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=300)


def test_the_command_prints_then_writes_with_a_backup(tmp_path):
    for name in ("Pulumi.yaml", "Pulumi.a2-8node.yaml"):
        shutil.copy(PROJECT_DIR / name, tmp_path / name)
    stack_file = tmp_path / "Pulumi.a2-8node.yaml"
    before = stack_file.read_text()
    shown = run("replan", "--stack-file", str(stack_file), "--without", "d1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert stack_file.read_text() == before  # nothing written without --write
    out = shown.stdout
    assert "proposed: p3 (prefill-3) joins the decode group in d1's place" in out
    assert "-    nodes: [d0, d1, d2, d3]\n+    nodes: [d0, p3, d2, d3]" in out
    assert "capacity: prefill 4 instance(s), 8 rank(s)" in out and "-> prefill 3 instance(s), 6 rank(s)" in out
    # `diff`'s verdict of the edit: the decode group restarts with p3, its outage estimated.
    assert "decode: outage" in out and "p3    start" in out
    assert "nothing written" in out
    written = run("replan", "--stack-file", str(stack_file), "--without", "d1", "--write", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    backups = list(tmp_path.glob("Pulumi.a2-8node.yaml.before-replan-d1-*"))
    assert len(backups) == 1 and backups[0].read_text() == before
    assert "nodes: [d0, p3, d2, d3]" in stack_file.read_text()
    assert f"ascend-pd forget-node --stack a2-8node d1" in written.stdout
    # The edited file is a valid stack without d1; asking again without d1 is refused by name.
    again = run("replan", "--stack-file", str(stack_file), "--without", "d1", cwd=tmp_path)
    assert again.returncode == 2 and "d1 is not a node of the stack" in again.stderr
    assert "Traceback" not in again.stderr


def with_spare(stack: str = "a2-8node") -> dict[str, str]:
    """The stack's CLI map with x0 in `nodes` and in no role: a warm spare."""
    raw = cli_config_map(stack)
    nodes = json.loads(raw["nodes"])
    raw["nodes"] = json.dumps([*nodes, {**nodes[-1], "name": "x0", "address": "192.0.2.99"}])
    ssh = json.loads(raw["ssh"])
    ssh["hostKeys"]["x0"] = next(iter(ssh["hostKeys"].values()))
    raw["ssh"] = json.dumps(ssh)
    return raw


def test_a_warm_spare_takes_the_lost_nodes_place_first():
    raw = with_spare()
    before = build_plan(load_config(raw), "a2-8node")
    assert before.spares == ("x0",)
    for lost, role in (("d1", "decode"), ("p2", "prefill")):
        outcome = choose("a2-8node", raw, lost)
        assert outcome.proposal.summary.startswith(f"x0 (a spare) takes {lost}'s place in {role}-"), \
            outcome.proposal.summary
        after = layout(outcome.plan)
        # Only the lost node's place changes: every instance keeps its name and its other nodes.
        assert {k: tuple("x0" if n == lost else n for n in v) for k, v in layout(before).items()} == after
        assert outcome.plan.spares == ()


def test_render_status_and_diff_name_the_spares(tmp_path):
    from types import SimpleNamespace

    from ascend_pd import term
    from ascend_pd.change import compare
    from ascend_pd.change.sources import from_file
    from ascend_pd.render import summary_blocks
    from ascend_pd.status.report import _spares_row

    raw = with_spare()
    plan = build_plan(load_config(raw), "a2-8node")
    text = term.plain(summary_blocks(plan))
    assert "spares  x0  (prepared, no ranks: `ascend-pd replan --stack a2-8node --without NODE`" in text
    assert "spares" not in term.plain(summary_blocks(build_plan(load_config(cli_config_map("a2-8node")), "a2-8node")))
    rep = SimpleNamespace(spares=["x0"], workers=[SimpleNamespace(node="x0", ok=True), SimpleNamespace(node="d0", ok=False)])
    assert _spares_row(rep) == ("spare nodes (no ranks)", "ok", "x0 (ready)")
    rep.workers[0].ok = False
    assert _spares_row(rep) == ("spare nodes (no ranks)", "FAIL", "x0 (worker not ready)")
    # `diff` of the spare taking d1's place says which nodes change roles.
    src = PROJECT_DIR / "Pulumi.a2-8node.yaml"
    s = replan._settings(cli_config_map("a2-8node"))
    spare_edit = (Edit(("nodes",), [*s["nodes"], {**s["nodes"][-1], "name": "x0", "address": "192.0.2.99"}]),
                  Edit(("ssh", "hostKeys", "x0"), next(iter(s["ssh"]["hostKeys"].values()))))
    old = tmp_path / "old.yaml"
    old.write_text(edited_text(src.read_text(), spare_edit, s))
    outcome = choose("a2-8node", with_spare(), "d1")
    new = tmp_path / "new.yaml"
    new.write_text(edited_text(old.read_text(), outcome.proposal.edits, replan._settings(with_spare())))
    change = compare("a2-8node", from_file("a2-8node", old, PROJECT_DIR), from_file("a2-8node", new, PROJECT_DIR))
    assert "nodes change roles: x0: spare -> decode" in change.effect.notes
