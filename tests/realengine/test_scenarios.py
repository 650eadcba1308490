"""Every kind of change to a running a2-8node deployment, made as an operator makes it, by the real
engine: edit the stack, `pulumi preview --json`, `pulumi up --yes`, the cluster serves again
(`ascend-pd status` exits 0: every rank, worker, etcd and the proxy healthy, a P/D request through
the proxy answered), and `pulumi preview --expect-no-changes` is clean.

And the engine model (ascend_pd/engine/, what `diff` reports without a state) is held to it: for
every change, the engine's verdict per resource (the preview) equals the model's, the steps the real
`up` took are the model's steps, and the real `up` started no step before a step the model makes it
wait for had finished. The engine's steps are kept as test data in tests/engine_steps/ (regenerate:
`bash tests/record_engine_steps` after a pin changes), which the fast
tier (tests/test_engine_steps.py) checks the model against on any clone.

The scenarios run in order on one deployment, each from where the previous one left it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import cluster as rc
from load import RATE_PER_S, Load
import engine as eng
import engine_record as er

from ascend_pd.engine import preview as pv
from ascend_pd.change import compare
from ascend_pd.change.compare import plan_of
from ascend_pd.engine.model import Step, plan_up, simulate
from ascend_pd.engine.timing import launch_gangs

pytestmark = pytest.mark.integration

STACK = "a2-8node"
RECORD = os.environ.get("ASCEND_PD_RECORD_ENGINE_STEPS") == "1"
FIGURES: dict[str, dict] = {}
UNSET = object()  # in an edit: back to the stack file's own value (the override, or a key of it, removed)


def merge(overrides: dict[str, Any], edit: dict[str, Any]) -> None:
    """Apply a scenario's edit to the cluster's overrides: a dict merges into the override of the
    same setting (keys set to UNSET dropped from it), UNSET drops the whole override."""
    for k, v in edit.items():
        if v is UNSET:
            overrides.pop(k, None)
        elif isinstance(v, dict):
            merged = {**overrides.get(k, {}), **v}
            merged = {kk: vv for kk, vv in merged.items() if vv is not UNSET}
            if merged:
                overrides[k] = merged
            else:
                overrides.pop(k, None)
        else:
            overrides[k] = v


@pytest.fixture(scope="module")
def dep(realdir):
    rc.require_real_engine()
    # Every instance of a role restarts at once (one wave instead of four): the scenarios check the
    # engine's steps and convergence; the one rollout under load sets maxUnavailable 1 itself.
    # openYuanrong's heartbeats at the seeds' ratio but with slack for this loaded 2-core machine: at
    # 5/10 s (the lifecycle's) three untouched decode workers lost their registration while 20
    # requests/s rolled the prefill image beside them, and stayed unregistered.
    c = rc.RealCluster(STACK, realdir / "scenarios", spare=1, rollout={"maxUnavailable": 4},
                       yuanrong={"nodeTimeoutS": 30, "nodeDeadTimeoutS": 60})
    c.key_generation = 1
    try:
        first = c.project.up()
        assert first.ok, (first.error or "")[-6000:]
        c.wait_serving()
        yield c
    finally:
        # No `pulumi destroy` (half a minute): the lifecycle destroys both stacks and checks what is
        # left; here the fleet goes with its nodes' PID namespaces.
        c.close()
        print(f"\nreal-engine scenarios: {json.dumps(FIGURES)}")


# Scenarios CI leaves to `bash tests/record_engine_steps` (which runs and records every one): what
# their engine steps show, another scenario CI runs shows too (a launch input changed on every
# launch: decode-flag, prefill-env, rollout-slots; a change that reaches no resource: the renamed-bare
# preview; containers replaced with what runs in them: the two role images; every worker restarted:
# etcd moved; launches replaced with their old delete first: the decode image), and the fast tier
# holds the model to their recorded steps all the same. Each leaves the deployment as the next
# scenario needs it either way. CI time is a budget: about 5 minutes.
recorded_only = pytest.mark.skipif(not RECORD, reason="run and recorded by tests/record_engine_steps, not by CI")


def engine_ops(run: eng.Run) -> list[tuple[str, str]]:
    """The real run's steps in the model's terms (engine_record.is_program_step)."""
    return [(s.op, pv.resource_key(s.urn)) for s in run.steps if er.is_program_step(s.op, s.urn, s.type)]


def event_order(run: eng.Run) -> list[dict]:
    """Each step of the real run with the sequence numbers of its start and its end among all the
    run's events: the order the engine really ran them in, without wall times."""
    ticks = sorted({t for s in run.steps for t in (s.started, s.finished) if t is not None})
    seq = {t: i for i, t in enumerate(ticks)}
    return [{"op": s.op, "key": pv.resource_key(s.urn), "start": seq[s.started],
             "end": seq[s.finished if s.finished is not None else s.started]}
            for s in run.steps if er.is_program_step(s.op, s.urn, s.type)]


@dataclass
class Outcome:
    preview: pv.EnginePreview
    up: eng.Run
    model: list[Step]


def change(dep: rc.RealCluster, name: str, *, apply: bool = True, key: Optional[str] = None,
           during: Optional[Callable[[], Any]] = None, **edit: Any) -> Outcome:
    """Edit the stack by `edit` (top-level settings, merged one level deep; None removes one), then run
    it as an operator does; the model is held to every step the engine takes."""
    before, key_before = dep.as_diff_sees(dep.settings()), dep.key_generation
    old = dep.model_graph()
    merge(dep.overrides, edit)
    if key is not None:
        dep.private_key, dep.key_generation = key, dep.key_generation + 1
    dep.configure()
    after = dep.as_diff_sees(dep.settings())
    model = plan_up(old.regs, dep.model_graph())
    doc = dep.project.preview_json()
    engine = pv.parse(json.dumps(doc), label=name, stack=STACK)
    # The engine's verdict for every resource is the model's.
    assert pv.disagreements(pv.model_verdicts(model), engine.verdicts()) == [], name
    figures = FIGURES.setdefault(name, {})
    figures["changes"] = len(engine.changes())
    if not apply:
        if RECORD:
            er.write(name, STACK, eng.sdk_versions(), before, after, (key_before, dep.key_generation), doc, [])
        return Outcome(engine, eng.Run("up"), model)
    work = during() if during else None
    up = dep.project.up()
    if work is not None:
        work.stop()
    assert up.ok, (up.error or "")[-6000:]
    # The real run took exactly the model's steps, in an order the model allows.
    modelled = [k for k in map(er.acting_key, model) if k is not None]
    ran = engine_ops(up)
    assert sorted(ran) == sorted(modelled), (name, sorted(set(ran) - set(modelled)), sorted(set(modelled) - set(ran)))
    order = event_order(up)
    assert er.order_violations(model, order) == [], name
    figures["up_s"] = round(up.seconds, 1)
    # Against the real run: `diff`'s estimate for real hardware (model loads of minutes), and the
    # model's schedule of these very steps given each one's measured duration (its makespan above the
    # real wall time would mean the model serialises what the engine runs at once).
    estimate = compare(STACK, er.side("before", before, key_before), er.side("after", after, dep.key_generation),
                       engine=engine)
    assert estimate.engine_notes == [], estimate.engine_notes
    figures["diff_estimate_s"] = round(estimate.effect.up_s)
    measured = {(s.op, pv.resource_key(s.urn)): s.seconds for s in up.steps}
    timing = simulate(model, lambda st: measured.get(er.acting_key(st), 0.0), parallel=dep.project.parallel,
                      gangs=launch_gangs(model, dep.model_graph()))
    figures["model_makespan_s"] = round(timing.makespan_s, 1)
    assert timing.makespan_s <= up.seconds + 1.0, (timing.makespan_s, up.seconds)
    if RECORD:
        er.write(name, STACK, eng.sdk_versions(), before, after, (key_before, dep.key_generation), doc, order)
    elif (er.STEPS_DIR / f"{name}.json").exists():
        # The kept steps are still the engine's (else: regenerate them, see the module's docstring).
        kept = er.load(er.STEPS_DIR / f"{name}.json")
        assert kept.preview.verdicts() == engine.verdicts(), f"tests/engine_steps/{name}.json is stale"
    dep.wait_serving()
    after_up = dep.project.preview(expect_no_changes=True)
    assert after_up.ok, after_up.stdout[-6000:]
    return Outcome(engine, up, model)


def changed(o: Outcome) -> dict[str, str]:
    """Resource name -> the engine's verdict, for what changes."""
    return {k.rsplit("::", 1)[-1]: op for k, op in o.preview.changes().items()}


def launches(dep: rc.RealCluster, role: str) -> set[str]:
    return {f"{n}-launch" for n in dep.settings()[role]["nodes"]}


def test_a_decode_flag_updates_the_decode_launches_only(dep):
    flags = dep.settings()["decode"].get("flags", {})
    o = change(dep, "decode-flag", decode={"flags": {**flags, "max-num-seqs": 24}})
    assert changed(o) == {n: "update" for n in launches(dep, "decode")}


def test_a_prefill_env_updates_the_prefill_launches_only(dep):
    env = dep.settings()["prefill"].get("env", {})
    # The fake ranks hold each prefill request 0.1 s from here on: there is something to drain when
    # the role image rolls under load below.
    o = change(dep, "prefill-env", prefill={"env": {**env, "FAKE_VLLM_REQUEST_DELAY": "0.1"}})
    assert changed(o) == {n: "update" for n in launches(dep, "prefill")}


def rank_processes(dep: rc.RealCluster) -> dict[str, list[str]]:
    """Node -> the --port of every fake vLLM process on it (in its containers), one entry per process."""
    out = {}
    for name, node in dep.fleet.nodes.items():
        if not node.alive():
            continue
        ps = node.sh("ps -eo args=").stdout.splitlines()
        out[name] = sorted(line.split("--port ", 1)[1].split()[0] for line in ps
                           if "fake_vllm.py" in line and "--port " in line)
    return out


def up_in_background(dep: rc.RealCluster, log_name: str) -> tuple[subprocess.Popen, Path]:
    """`pulumi up` as an operator starts it, in the background, its output in the workdir's LOG_NAME."""
    project = dep.project
    log = dep.workdir / log_name
    with open(log, "w") as out:
        up = subprocess.Popen([str(eng.find_cli()), "up", "--yes", "--skip-preview", "--non-interactive", "--stack",
                               STACK, "--parallel", str(project.parallel)], cwd=str(project.dir),
                              env={**os.environ, **project.env}, stdout=out, stderr=subprocess.STDOUT)
    return up, log


def wait_for_launch(up: subprocess.Popen, log: Path, nodes: list[str], dep: rc.RealCluster) -> list[str]:
    """The nodes of `nodes` where a launch script runs (holds its lock), once there is one."""
    deadline = time.monotonic() + 300
    while True:
        running = [n for n in nodes if "launch.lock bash -s" in dep.fleet.nodes[n].sh("ps -eo args=").stdout]
        if running:
            return running
        assert up.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)


def test_an_up_killed_mid_run_is_cancelled_and_converges_with_every_rank_once(dep):
    """The CLI of an `up` is SIGKILLed while the prefill launches restart (a laptop asleep, a jump host
    gone): the stack stays locked, the provider plugins and the launches on the nodes run on. What the
    docs tell the operator (docs/operations.md, "An interrupted pulumi up") gets back to converged:
    `pulumi cancel`, then `pulumi up`; no rank runs twice on any node (the launches' locks), and
    `preview --expect-no-changes` is clean."""
    planned = rank_processes(dep)
    env = dep.settings()["prefill"].get("env", {})
    merge(dep.overrides, {"prefill": {"env": {**env, "APD_INTERRUPTED_RUN": "1"}}})
    dep.configure()
    project, cli = dep.project, eng.find_cli()
    env_ = {**os.environ, **project.env}
    prefill = dep.settings()["prefill"]["nodes"]
    up, log = up_in_background(dep, "killed-up.log")
    try:
        orphans = wait_for_launch(up, log, prefill, dep)
    finally:
        up.kill()  # the CLI alone: its plugins and the scripts on the nodes go on
        up.wait()
    t0 = time.monotonic()
    locked = project.up()
    assert not locked.ok and "pulumi cancel" in (locked.error or ""), (locked.error or "")[-3000:]
    cancel = subprocess.run([str(cli), "cancel", "--yes", "--stack", STACK], cwd=str(project.dir), env=env_,
                            capture_output=True, text=True, timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    again = project.up()
    assert again.ok, (again.error or "")[-6000:]
    dep.wait_serving(timeout=300)
    converged_s = time.monotonic() - t0
    after = rank_processes(dep)
    assert after == planned, (planned, after)  # every planned rank, each once
    assert all(len(ports) == len(set(ports)) for ports in after.values()), after
    clean = project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    FIGURES["killed-up"] = {"launches_running_at_kill": len(orphans), "kill_to_serving_s": round(converged_s, 1),
                            "second_up_s": round(again.seconds, 1),
                            "pending_warning": "pending operations" in again.stdout}


# A node's SSH silenced: an nftables table of the test's own drops what reaches its port 22 (the
# operator's SSH packets lost on the way in), while its answers still leave: the node keeps
# retransmitting the step's output, which is what held an `up` for more than 15 minutes.
SILENCE = ("table inet apd_test_silence {\n  chain input {\n    type filter hook input priority filter - 10;\n"
           "    tcp dport 22 drop\n  }\n}\n")
# The bound docs/operations.md gives: the node gives up retransmitting (firewall.tcpRetries2 8: about
# 100 s at most), then the session's TCP keepalive ends it (150 s); the rest is a loaded CI machine.
SILENT_STEP_BOUND_S = 400


# Three and a half minutes of waiting for the bound itself: run by the recording, not by CI.
@recorded_only
def test_a_node_silenced_mid_up_fails_its_step_within_the_bound_and_the_next_up_converges(dep):
    """p1 stops receiving SSH packets while its prefill launch runs (a firewall on the way, a link
    that only sends). The `up` ends on its own within the documented bound, its error names p1's launch,
    no traceback; p1's launch finishes on the node meanwhile. Once p1 answers again one `up` converges:
    every planned rank once, `preview --expect-no-changes` clean, serving."""
    victim = "p1"
    plan_tcp = dep.fleet.nodes[victim].sh("cat /proc/sys/net/ipv4/tcp_retries2").stdout.strip()
    assert plan_tcp == "8", plan_tcp  # what the firewall script set (the kernel's default is 15)
    planned = rank_processes(dep)
    env = dep.settings()["prefill"].get("env", {})
    merge(dep.overrides, {"prefill": {"env": {**env, "APD_SILENCED_RUN": "1"}}})
    dep.configure()
    project = dep.project
    node = dep.fleet.nodes[victim]
    up, log = up_in_background(dep, "silenced-up.log")
    try:
        wait_for_launch(up, log, [victim], dep)
        node.nsenter("nft", "-f", "-", input=SILENCE)
        t0 = time.monotonic()
        try:
            rc_ = up.wait(timeout=SILENT_STEP_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pulumi up still runs {SILENT_STEP_BOUND_S} s after {victim} went silent: "
                                 + log.read_text()[-3000:]) from None
        failed_s = time.monotonic() - t0
    finally:
        node.sh("nft delete table inet apd_test_silence", check=False)
        # A failure here must not leave the next scenarios a locked stack: the run ends (its node
        # answers again), or is killed and its lock cancelled.
        try:
            up.wait(timeout=SILENT_STEP_BOUND_S)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
            subprocess.run([str(eng.find_cli()), "cancel", "--yes", "--stack", STACK], cwd=str(project.dir),
                           env={**os.environ, **project.env}, capture_output=True, timeout=120)
    text = log.read_text()
    assert rc_ != 0, text[-4000:]
    assert f"{victim}-launch" in text and "Traceback" not in text and "KeyboardInterrupt" not in text, text[-4000:]
    t1 = time.monotonic()
    again = project.up()
    assert again.ok, (again.error or "")[-6000:]
    dep.wait_serving(timeout=300)
    converged_s = time.monotonic() - t1
    after = rank_processes(dep)
    assert after == planned, (planned, after)
    clean = project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    FIGURES["silenced-up"] = {"silence_to_failed_up_s": round(failed_s, 1), "next_up_to_serving_s": round(converged_s, 1),
                              "next_up_s": round(again.seconds, 1)}


@recorded_only
def test_a_shared_vllm_flag_updates_every_launch(dep):
    flags = dep.settings()["vllm"].get("flags", {})
    o = change(dep, "vllm-flags", vllm={"flags": {**flags, "seed": 2048}})
    assert changed(o) == {n: "update" for n in launches(dep, "prefill") | launches(dep, "decode")}


@recorded_only
def test_the_model_path_updates_every_launch_and_keeps_the_containers(dep):
    """The container mounts the seeds' fixed set (`/home`, `/mnt`, `/data`, ...), not `model.path`
    itself: a new path restarts the ranks and replaces no container."""
    o = change(dep, "model-path", model={"path": "/data/model-2"})
    assert changed(o) == {n: "update" for n in launches(dep, "prefill") | launches(dep, "decode")}


@recorded_only
def test_the_container_shm_size_replaces_every_container(dep):
    o = change(dep, "container-shm", container={"shmSize": "2g"})
    assert {n for n, op in changed(o).items() if n.endswith("-container")} == \
        {f"{n}-container" for n in dep.fleet.nodes if not n.startswith("x")}


@recorded_only
def test_the_openyuanrong_shared_memory_restarts_the_workers(dep):
    o = change(dep, "yuanrong-shm", yuanrong={"sharedMemoryMb": 96})
    workers = {f"{n}-worker" for n in dep.fleet.nodes if not n.startswith("x")}
    assert workers <= set(changed(o))


def test_etcd_moves_to_another_node(dep):
    """To a decode node, where a prefill image roll (below) leaves it running (docs/changes.md)."""
    o = change(dep, "etcd-moved", etcd={"node": "d0"})
    assert changed(o).get("d0-etcd") == "create" and changed(o).get("p0-etcd") == "delete"


def test_the_proxy_moves_to_another_node(dep):
    o = change(dep, "proxy-moved", proxy={"node": "d0"})
    assert changed(o).get("d0-proxy") == "create" and changed(o).get("p0-proxy") == "delete"


def _nodes_with(dep: rc.RealCluster, extra: Optional[dict] = None, rename: Optional[tuple[str, str, bool]] = None
                ) -> dict[str, Any]:
    """Overrides for `nodes`, `ssh.hostKeys` and `prefill.nodes` with a node added or renamed."""
    nodes = [dict(n) for n in dep.settings()["nodes"]]
    keys = dict(dep.settings()["ssh"]["hostKeys"])
    prefill = list(dep.settings()["prefill"]["nodes"])
    if extra:
        nodes.append(extra)
        keys[extra["name"]] = dep.fleet.nodes["x0"].host_key
        prefill.append(extra["name"])
    if rename:
        old, new, alias = rename
        for n in nodes:
            if n["name"] == old:
                n["name"] = new
                n.pop("formerNames", None)
                if alias:
                    n["formerNames"] = [old]
        keys[new] = keys.pop(old)
        prefill = [new if p == old else p for p in prefill]
    return {"nodes": nodes, "ssh": {"hostKeys": keys}, "prefill": {"nodes": prefill}}


@recorded_only
def test_a_node_added_to_prefill(dep):
    template = next(n for n in dep.settings()["nodes"] if n["name"] == "p3")
    extra = {**template, "name": "p4", "address": dep.fleet.nodes["x0"].address}
    extra.pop("formerNames", None)
    o = change(dep, "node-added", **_nodes_with(dep, extra=extra))
    assert {n for n, op in changed(o).items() if op == "create"} >= {"p4-container", "p4-launch", "p4-worker"}


@recorded_only
def test_a_node_removed_from_prefill(dep):
    o = change(dep, "node-removed", nodes=UNSET, ssh=UNSET, prefill={"nodes": UNSET})
    assert {n for n, op in changed(o).items() if op == "delete"} >= {"p4-container", "p4-launch", "p4-worker"}


@recorded_only
def test_a_renamed_node_without_its_former_name_is_a_new_node(dep):
    """Previewed, not applied: the engine would create p3x's resources beside p3's (whose container
    holds the fixed name, so the up fails), which `diff` says; the operator reverts."""
    o = change(dep, "node-renamed-bare", apply=False, **_nodes_with(dep, rename=("p3", "p3x", False)))
    ops = changed(o)
    assert ops.get("p3x-container") == "create" and ops.get("p3-container") == "delete"
    merge(dep.overrides, {"nodes": UNSET, "ssh": UNSET, "prefill": {"nodes": UNSET}})
    dep.configure()
    assert dep.project.preview(expect_no_changes=True).ok


def test_a_renamed_node_with_its_former_name_restarts_nothing(dep):
    o = change(dep, "node-renamed-alias", **_nodes_with(dep, rename=("p3", "p3x", True)))
    assert not {n for n, op in changed(o).items() if op in ("replace", "create", "delete")}, changed(o)


@recorded_only
def test_the_state_dir_replaces_what_it_holds(dep):
    o = change(dep, "state-dir", stateDir="/var/lib/ascend-pd-2")
    assert {n for n, op in changed(o).items() if op == "replace"} >= launches(dep, "decode")


def test_a_rotated_ssh_key_updates_every_command(dep):
    new = dep.workdir / "id_ed25519_2"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rotated", "-f", str(new)], check=True)
    pub = (new.with_suffix(".pub")).read_text().strip()
    for node in dep.fleet.nodes.values():
        node.sh(f"echo '{pub}' >> /root/.ssh/authorized_keys")
    o = change(dep, "ssh-key-rotated", key=new.read_text())
    commands = {r.name for r in dep.model_graph().regs if r.type == "command:remote:Command"}
    assert changed(o) == {c: "update" for c in commands}


@recorded_only
def test_converge_runs_every_service_script_again(dep):
    o = change(dep, "converge", converge=1)
    assert changed(o) and set(changed(o).values()) == {"update"}


@recorded_only
def test_a_monitoring_threshold_without_a_monitoring_node_changes_nothing(dep):
    """Alert thresholds go into the files `render --out` writes; with no `monitoring.node` nothing
    of them is deployed, and the engine agrees."""
    o = change(dep, "monitoring-threshold", monitoring={"errorPercent": 9})
    assert changed(o) == {}


class LoadDuringUp:
    """The request stream around the `up` only (started 2 s before it, stopped 2 s after)."""

    def __init__(self, load: Load) -> None:
        self.load = load
        load.__enter__()
        time.sleep(2)

    def stop(self) -> None:
        time.sleep(2)
        self.load.__exit__(None, None, None)


def test_the_restart_slots_alone_update_every_launch_and_restart_nothing(dep):
    """`rollout.maxUnavailable` 4 -> 1 in an `up` of its own, before the image below: a replaced
    launch's old delete takes its slot with the old value (measured here, in one `up` with the image:
    all four prefill instances drained at once, 575 of 822 requests failed; `diff` now says so)."""
    o = change(dep, "rollout-slots", rollout={"maxUnavailable": 1})
    assert changed(o) == {n: "update" for n in launches(dep, "prefill") | launches(dep, "decode")}


def test_a_prefill_image_rolls_under_load_without_a_failed_request(dep):
    """`prefill.image` (a rebuild of the image: a new image ID), by the real `pulumi up` with 20
    requests/s through the release proxy: the four prefill containers are replaced, each old launch's
    delete drains its instance through the rollout slots (one instance at a time), and no request
    fails. etcd and the proxy run on d0 (moved there above), which the roll does not touch: nothing
    of decode changes. The roll's wall time is set against `diff`'s estimate for real hardware."""
    plan = plan_of(STACK, er.config_of(dep.settings(), dep.key_generation)[0])
    assert (plan.etcd.node, plan.proxy.node) == ("d0", "d0")
    image = dep.rebuild("prefill-2")
    load = Load(plan.proxy.url, plan.cfg.model.served_name)
    o = change(dep, "prefill-image", during=lambda: LoadDuringUp(load), prefill={"image": image})
    line = load.report("prefill image on the real engine")
    failed = [x for x in load.outcomes if not x.ok]
    assert not failed, (line, [(round(x.start - load.outcomes[0].start, 1), round(x.latency, 2), x.detail)
                               for x in failed[:5]], o.up.stdout[-4000:])
    prefill = {n: "replace" for n in (f"{p}-container" for p in dep.settings()["prefill"]["nodes"])}
    assert {n: op for n, op in changed(o).items() if n.endswith("-container")} == prefill
    assert not [n for n in changed(o) if n.startswith("d")], changed(o)
    assert len(load.outcomes) >= RATE_PER_S * o.up.seconds * 0.8, line
    FIGURES["prefill-image"].update(requests=len(load.outcomes), failed=len(failed),
                                    p50_ms=round(load.percentile(0.5) * 1000), p99_ms=round(load.percentile(0.99) * 1000))


def test_a_decode_image_restarts_the_prefill_workers_into_the_new_etcd(dep):
    """`decode.image` replaces d0's container and with it etcd (empty again, same address) and the
    proxy. Nothing of prefill's scripts changes, but every prefill worker's create follows etcd's id
    and runs again: each restarts into the new etcd (it had joined the old one), and the cluster
    serves with every worker registered, with no `heal`. Before the worker compared the etcd it
    joined, the re-runs found the workers registered (they re-register on their own) and kept them,
    and three of four were unregistered afterwards."""
    image = dep.rebuild("decode-2")
    prefill = dep.settings()["prefill"]["nodes"]
    before = {n: worker_pids(dep, n) for n in prefill}
    assert all(before.values()), before
    o = change(dep, "decode-image", decode={"image": image})
    assert {n for n, op in changed(o).items() if n.endswith("-container")} == \
        {f"{d}-container" for d in dep.settings()["decode"]["nodes"]}
    assert changed(o).get("d0-etcd") == "replace" and changed(o).get("d0-proxy") == "replace"
    workers = {f"{p}-worker" for p in dep.settings()["prefill"]["nodes"]}
    assert {n: changed(o).get(n) for n in workers} == {n: "update" for n in workers}
    after = {n: worker_pids(dep, n) for n in prefill}
    assert all(after[n] and not after[n] & before[n] for n in prefill), (before, after)


def test_a_decode_node_lost_for_good_is_taken_over_by_a_warm_spare(dep):
    """x0 joins the stack as a warm spare (a node of no role: prepared, its worker in the KV pool, no
    ranks). Then d1's machine is gone (powered off: no SSH, no docker, no route): `replan --without d1
    --write` puts x0 in its place and one `ascend-pd forget-node d1` converges the rest (x0's launch,
    the decode group restarted with it, the proxy updated) without dialling d1; exactly d1's resources
    leave the state, and the cluster serves with `preview --expect-no-changes` clean. d1 stays gone.
    Each phase is timed (the model loads are the fake's, seconds)."""
    lost, spare = "d1", "x0"
    settings = dep.settings()
    assert lost in settings["decode"]["nodes"] and spare not in {n["name"] for n in settings["nodes"]}
    node = {**settings["nodes"][-1], "name": spare, "address": dep.fleet.nodes[spare].address}
    node.pop("formerNames", None)
    t_prep = time.monotonic()
    o = change(dep, "spare-added", nodes=[*settings["nodes"], node],
               ssh={"hostKeys": {**settings["ssh"]["hostKeys"], spare: dep.fleet.nodes[spare].host_key}})
    prepare_s = time.monotonic() - t_prep
    assert f"{spare}-container" in changed(o) and not any(n.endswith("-launch") for n in changed(o)), changed(o)
    rc_, report = dep.status()
    assert rc_ == 0 and report.get("spares") == [spare], json.dumps(report)[:3000]
    before = {r["urn"] for r in dep.project.export()["resources"]}
    t0 = time.monotonic()
    dep.fleet.power_off(lost)
    rc_, report = dep.status("--no-smoke")
    noticed_s = time.monotonic() - t0
    assert rc_ == 1 and lost in json.dumps(report.get("problems", report)), json.dumps(report)[:3000]
    proposed = dep.cli("replan", "--without", lost, "--write", timeout=600)
    assert proposed.returncode == 0, (proposed.stdout[-4000:], proposed.stderr[-3000:])
    assert f"proposed: {spare} (a spare) takes {lost}'s place in decode-0" in proposed.stdout, proposed.stdout[-3000:]
    t1 = time.monotonic()
    done = dep.cli("forget-node", lost, "--backup-dir", str(dep.workdir / "backups"), timeout=1200)
    forget_s = time.monotonic() - t1
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    assert f"forgot " in done.stdout and f"resources of {lost}" in done.stdout, done.stdout[-3000:]
    after = {r["urn"] for r in dep.project.export()["resources"]}
    gone = before - after
    assert gone and all(u.rsplit("::", 1)[-1].startswith(f"{lost}-") for u in gone), sorted(gone)
    assert not any(u.rsplit("::", 1)[-1].startswith(f"{lost}-") for u in after)
    assert any(u.endswith(f"::{spare}-launch") for u in after)
    dep.wait_serving(timeout=300)
    serving_s = time.monotonic() - t0
    clean = dep.project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    cleanup = next((dep.workdir / "backups").glob(f"*-cleanup-{lost}-*.sh")).read_text()
    assert "docker rm -f" in cleanup and f"--- {lost}-launch" in cleanup
    FIGURES["node-lost"] = {"spare_prepared_s": round(prepare_s, 1), "noticed_s": round(noticed_s, 1),
                            "forget_node_s": round(forget_s, 1), "serving_again_s": round(serving_s, 1),
                            "forgotten": len(gone)}


def test_a_decode_node_lost_with_no_spare_left_is_replanned_and_forgotten(dep):
    """After the spare went to d1, d2's machine is gone too and there is no spare left: `replan --without
    d2 --write` puts the last prefill node in its place (prefill one instance fewer) and `forget-node d2`
    converges to it; the cluster serves, `preview --expect-no-changes` clean."""
    lost = "d2"
    settings = dep.settings()
    donor = settings["prefill"]["nodes"][-1]
    dep.fleet.power_off(lost)
    t0 = time.monotonic()
    proposed = dep.cli("replan", "--without", lost, "--write", timeout=600)
    replan_s = time.monotonic() - t0
    assert proposed.returncode == 0, (proposed.stdout[-4000:], proposed.stderr[-3000:])
    assert f"{donor} (prefill-" in proposed.stdout and f"joins the decode group in {lost}'s place" in proposed.stdout
    t1 = time.monotonic()
    done = dep.cli("forget-node", lost, "--backup-dir", str(dep.workdir / "backups"), timeout=1200)
    forget_s = time.monotonic() - t1
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    report = dep.wait_serving(timeout=300)
    serving_s = time.monotonic() - t0
    decode = [r for r in report["ranks"] if r["role"] == "decode"]
    assert decode and all(r["ok"] for r in decode) and any(r["node"] == donor for r in decode), decode
    assert not any(r["node"] == donor for r in report["ranks"] if r["role"] == "prefill")
    clean = dep.project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    FIGURES["node-lost-no-spare"] = {"replan_s": round(replan_s, 1), "forget_node_s": round(forget_s, 1),
                                     "serving_again_s": round(serving_s, 1)}


def worker_pids(dep: rc.RealCluster, node: str) -> set[str]:
    """The datasystem_worker processes in the node's container (pids of its PID namespace)."""
    # `worke[r]`: the glob does not match this very shell's command line.
    scan = 'for d in /proc/[0-9]*; do case "$(tr "\\0" " " < "$d/cmdline" 2>/dev/null)" in ' \
           '*datasystem_worke[r]" "*) echo "${d#/proc/}" ;; esac; done'
    settings = dep.settings()
    address = next(n["address"] for n in settings["nodes"] if n["name"] == node)  # p3 is p3x by now
    fleet_node = next(n for n in dep.fleet.nodes.values() if n.address == address)
    return set(fleet_node.docker("exec", settings["container"]["name"], "bash", "-c", scan).stdout.split())


def current_plan(dep: rc.RealCluster):
    """The plan of the stack file as it is now (after `replan --write`; secure values as placeholders)."""
    from ascend_pd.loader import open_stack

    return open_stack(stack_file=dep.stack_file).build_plan()


def role_nodes(plan, role: str) -> list[str]:
    return [n for i in plan.instances_of(role) for n in i.nodes]


def test_the_node_of_etcd_and_the_proxy_lost_moves_both_and_serves_again(dep):
    """d0 runs decode, etcd and the proxy (since the etcd-moved and proxy-moved scenarios) and its machine
    is gone. `replan --without d0 --write` gives etcd and the proxy to the first node left and the last
    prefill node to decode; `forget-node d0` converges: etcd starts empty on its new node, every worker
    registers in it again, the proxy answers at its new address; serving, `preview --expect-no-changes`
    clean."""
    before = current_plan(dep)
    lost = before.etcd.node
    assert before.proxy.node == lost and lost in role_nodes(before, "decode"), (lost, before.proxy.node)
    donor = role_nodes(before, "prefill")[-1]
    dep.fleet.power_off(lost)
    t0 = time.monotonic()
    proposed = dep.cli("replan", "--without", lost, "--write", timeout=600)
    replan_s = time.monotonic() - t0
    assert proposed.returncode == 0, (proposed.stdout[-4000:], proposed.stderr[-3000:])
    assert "etcd" in proposed.stdout and "proxy" in proposed.stdout, proposed.stdout[-3000:]
    after = current_plan(dep)
    moved_to = before.nodes[0].name if before.nodes[0].name != lost else before.nodes[1].name
    assert after.etcd.node == after.proxy.node == moved_to != lost, (after.etcd.node, after.proxy.node)
    assert donor in role_nodes(after, "decode") and donor not in role_nodes(after, "prefill")
    t1 = time.monotonic()
    done = dep.cli("forget-node", lost, "--backup-dir", str(dep.workdir / "backups"), timeout=1200)
    forget_s = time.monotonic() - t1
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    report = dep.wait_serving(timeout=300)
    serving_s = time.monotonic() - t0
    # every worker registered in the new etcd, which started empty
    assert report["workers_registered"] == len(report["workers"]) and lost not in {w["node"] for w in report["workers"]}
    clean = dep.project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    FIGURES["etcd-proxy-node-lost"] = {"replan_s": round(replan_s, 1), "forget_node_s": round(forget_s, 1),
                                       "serving_again_s": round(serving_s, 1), "etcd_and_proxy_on": moved_to}


def test_a_prefill_node_lost_leaves_prefill_one_instance_fewer(dep):
    """Then a prefill node's machine is gone: `replan` has no spare and no decode hole to fill, so
    prefill runs one instance fewer; `forget-node` converges, the rest serves. Runs last."""
    before = current_plan(dep)
    prefill = role_nodes(before, "prefill")
    lost = next(n for n in prefill if n not in (before.etcd.node, before.proxy.node))
    instances = len(before.instances_of("prefill"))
    dep.fleet.power_off(lost)
    t0 = time.monotonic()
    proposed = dep.cli("replan", "--without", lost, "--write", timeout=600)
    replan_s = time.monotonic() - t0
    assert proposed.returncode == 0, (proposed.stdout[-4000:], proposed.stderr[-3000:])
    after = current_plan(dep)
    assert len(after.instances_of("prefill")) == instances - 1 and lost not in role_nodes(after, "prefill")
    assert role_nodes(after, "decode") == role_nodes(before, "decode")
    t1 = time.monotonic()
    done = dep.cli("forget-node", lost, "--backup-dir", str(dep.workdir / "backups"), timeout=1200)
    forget_s = time.monotonic() - t1
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    report = dep.wait_serving(timeout=300)
    serving_s = time.monotonic() - t0
    assert not any(r["node"] == lost for r in report["ranks"])
    clean = dep.project.preview(expect_no_changes=True)
    assert clean.ok, clean.stdout[-6000:]
    FIGURES["prefill-node-lost"] = {"replan_s": round(replan_s, 1), "forget_node_s": round(forget_s, 1),
                                    "serving_again_s": round(serving_s, 1),
                                    "prefill_instances": f"{instances} -> {instances - 1}"}
