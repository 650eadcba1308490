"""`python -m ascend_pd heal --stack S`: bring broken instances back as a whole, without Kubernetes.

How heal acts: it runs the **rendered scripts** (the same `<node>-worker` and `<node>-launch`
create/delete texts Pulumi runs, wrapped the same way: `docker exec -i <container> bash -s`) on the
nodes over SSH. It changes no input of any Pulumi resource, so the next `pulumi preview`/`up` shows
no change: the scripts are idempotent and find what heal left (healthy ranks with their planned
command fingerprint) already running. (The alternative, driving `pulumi up --target ... --replace`
through the Automation API, needs the Pulumi CLI and the state backend on the supervising machine,
would serialise every heal behind the stack's lock, and cannot be tested here: there is no CLI.)

One cycle (`heal_once`):
1. poll the stack (`status.collect_status`, without the smoke completion) and judge every instance
   with the hang tracker (`hang.py`): dead, hung, or ranks not in one DP group;
2. every dead openYuanrong worker is restarted first, all at once (its node's worker create: it
   restarts a dead or unregistered worker), then the instance on its node is restarted too (its
   ranks' pool client talked to the dead worker);
3. every broken instance, concurrently with the others (each alone; the healthy ones keep serving):
   out of the proxy (`POST /instances/remove`, the launch's own rollout call), its launch's delete
   on every node of the instance at once (TERM, KILL after `vllm.stopTimeoutS`: a DP group restarts
   as a whole, and its NPU memory is free once its processes are gone), the launch's create on every
   node at once (starts the ranks, waits until every rank answers /health), one completion on the
   instance's first rank, back into the proxy (`POST /instances/add`);
   An instance with a node that does not answer (status: every connect to it times out or finds no
   route; before a real restart: `ssh true` to it fails) is BLOCKED, not restarted: its group
   cannot start without that node, and stopping the ranks still alive on the others would only make
   it worse. The report names the node and what replaces it.
4. a restart budget per instance: at most `max_restarts` restarts within `window_s`, each one after
   a backoff (`backoff_s` doubled per restart already in the window). Past the budget the instance is
   taken out of the proxy and LEFT OUT, and the report says so in capitals: a crash loop costs one
   instance, never the cluster.

The transport is a callable `Runner(node, command, timeout_s) -> (rc, stdout, stderr)` that runs a
host command (the wrapped script) on a node. `LocalRunner`-style callables are what the tests use;
`ssh_runner` is the SSH transport `doctor` uses (ascend_pd/ssh.py), at most `--parallel` sessions at
once however many instances and workers heal at the same time.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import requests

from . import scripts
from .hang import HangTracker
from .logsources import logs_command
from .plan import Instance, Plan
from .shell import CURL, in_container, q
from .status import Timeouts, collect_status, hang_tracker
from .status.model import UNREACHABLE
from .status.read import REFUSED

Runner = Callable[[str, str, float], tuple[int, str, str]]  # node, host command, timeout -> rc, out, err

_BUDGET_LOCK = threading.RLock()
DEFAULT_MAX_RESTARTS = 3
DEFAULT_WINDOW_S = 30 * 60
BACKOFF_S = 10.0  # before the second restart within the window; doubled for each further one
PROXY_TIMEOUT_S = 5.0
ONE_REQUEST_TIMEOUT_S = 60.0  # = launch.ONE_REQUEST_TIMEOUT_S
SCRIPT_MARGIN_S = 120  # a script's own deadlines plus this bound its run
REACH_TIMEOUT_S = 30.0  # `true` over ssh, before anything of a group is stopped
# A rank that does not answer in time may only be slow (a loaded node): an instance broken only by
# timeouts is polled once more, this much later, before it is restarted. Refused connections (nothing
# listening) and hangs (judged over hang.seconds already) need no second look.
CONFIRM_AFTER_S = 2.0
MAX_EVIDENCE = 4  # reasons shown per instance (a dead 32-rank group has 32)
# A cycle's first poll has no history: a hang (requests running, counters flat for hang.seconds) is
# invisible to it, and so to a one-shot heal. `--watch` judges hangs from its second cycle on.
HANG_NOTE = ("hangs are not judged: one poll has no history (hung = requests running and the rank's counters "
             "flat for hang.seconds); `heal --watch` judges them from its second cycle on")


def ssh_runner(plan: Plan, *, identity_file: Optional[str] = None, known_hosts_file: Optional[str] = None,
               connect_timeout_s: Optional[float] = None) -> Runner:
    """Runs a host command on a node over SSH with the transport `doctor` uses (ascend_pd/ssh.py: the
    operator's OpenSSH client, `ssh.user`@node address, `ssh.port`, the agent or --identity, the
    stack's pinned host keys or known_hosts). An unreachable node is exit code 255 with the reason
    on stderr, as `ssh` itself reports it."""
    from . import ssh

    extra = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
    targets = ssh.ssh_targets(plan, identity_file=identity_file, known_hosts_file=known_hosts_file, **extra)

    def run(node: str, command: str, timeout_s: float) -> tuple[int, str, str]:
        r = ssh.run_one(targets[node], command, timeout_s)
        if r.error is not None or r.rc is None:
            return 255, r.stdout, f"{r.stderr.rstrip()}\n{node}: {r.error or 'no exit code'}".lstrip()
        return r.rc, r.stdout, r.stderr

    return run


# ---------------------------------------------------------------------------------------------
# Restart budget


@dataclass
class Budget:
    """Restarts per instance within a sliding window, with exponential backoff between them. Kept in
    memory by `--watch`; `path` keeps it across one-shot runs (cron, a person)."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_WINDOW_S
    backoff_s: float = BACKOFF_S
    path: Optional[Path] = None
    restarts: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.path and self.path.is_file():
            try:
                self.restarts = {k: [float(t) for t in v] for k, v in json.loads(self.path.read_text()).items()}
            except (ValueError, TypeError, AttributeError):
                self.restarts = {}  # unreadable: start afresh rather than refuse to heal

    def recent(self, instance: str, now: float) -> list[float]:
        return [t for t in self.restarts.get(instance, []) if now - t < self.window_s]

    def exhausted(self, instance: str, now: float) -> bool:
        return len(self.recent(instance, now)) >= self.max_restarts

    def wait_s(self, instance: str, now: float) -> float:
        """Seconds until the next restart of `instance` may start (0: now)."""
        recent = self.recent(instance, now)
        if not recent:
            return 0.0
        return max(0.0, max(recent) + self.backoff_s * 2 ** (len(recent) - 1) - now)

    def record(self, instance: str, now: float) -> None:
        with _BUDGET_LOCK:  # instances heal concurrently, each recording its restart
            self.restarts[instance] = self.recent(instance, now) + [now]
            self.save()

    def save(self) -> None:
        if self.path:
            with _BUDGET_LOCK:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(self.restarts))
                tmp.replace(self.path)


# ---------------------------------------------------------------------------------------------
# Actions


@dataclass
class InstanceHeal:
    instance: str
    why: list[str]
    outcome: str = ""  # healed, failed, left-out, waiting, planned
    detail: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # out, stop, start, check, in (seconds)
    healthy_at: Optional[float] = None  # epoch s


@dataclass
class HealReport:
    stack: str
    polled_at: float
    broken: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)  # "node: outcome"
    instances: list[InstanceHeal] = field(default_factory=list)
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    worker_restart_s: dict[str, float] = field(default_factory=dict)  # node -> seconds its worker's create took
    etcd_ok: bool = True  # heal does not restart etcd: down, it is left broken
    hangs_judged: bool = True  # False: this cycle's poll had no history (HANG_NOTE)

    @property
    def left_out(self) -> list[InstanceHeal]:
        return [h for h in self.instances if h.outcome == "left-out"]

    @property
    def ok(self) -> bool:
        """Exit 0 or 1: nothing broken, or everything broken healed. A dry run changes nothing, so
        whatever it found broken is still broken."""
        if not self.etcd_ok:
            return False
        if self.dry_run:
            return not self.broken and not self.workers
        return all(h.outcome == "healed" for h in self.instances) and not any(
            "restart failed" in w or "not restarted" in w for w in self.workers)

    def text(self) -> str:
        when = time.strftime("%H:%M:%S", time.gmtime(self.polled_at))
        head = f"ascend-pd heal  stack {self.stack}  {when} UTC" + ("  (dry run: nothing changed)" if self.dry_run else "")
        lines = [head]
        if not self.broken and not self.workers:
            found = "nothing broken" if self.etcd_ok else "etcd is down (see the note); nothing else found broken"
            lines.append(found + ("" if self.hangs_judged else " that one poll can see (hangs: see the note)"))
        lines += [f"  note: {n}" for n in self.notes]
        for w in self.workers:
            lines.append(f"  worker {w}; logs: {logs_command(self.stack, service='worker', node=w.split(':')[0])}")
        for h in self.instances:
            t = ", ".join(f"{k} {v:.1f}s" for k, v in h.timings.items())
            lines.append(f"  {h.instance}: {h.outcome}" + (f" ({t})" if t else "") + (f": {h.detail}" if h.detail else ""))
            lines += [f"    because {w}" for w in h.why[:MAX_EVIDENCE]]
            if len(h.why) > MAX_EVIDENCE:
                lines.append(f"    and {len(h.why) - MAX_EVIDENCE} more")
            lines.append(f"    logs: {logs_command(self.stack, instance=h.instance)}")
        for h in self.left_out:
            lines.append(f"!!! {h.instance} IS OUT OF THE PROXY AND STAYS OUT: {h.detail}. A PERSON MUST LOOK "
                         f"(its logs: `{logs_command(self.stack, instance=h.instance, tail=200)}`), fix the cause, then run "
                         f"`python -m ascend_pd heal --stack {self.stack} --reset {h.instance}` or `pulumi up` with "
                         f"a new ascend-pd:converge.")
        return "\n".join(lines) + "\n"


def blocked_detail(plan: Plan, inst: Instance, node: str, reason: str) -> str:
    """Why an instance is not restarted while `node` does not answer, and what gets it serving again."""
    live = [n for n in inst.nodes if n != node]
    kept = f"its ranks on {', '.join(live)} were not stopped" if live else "nothing was stopped"
    return (f"{node} ({plan.node(node).address}) does not answer: {reason}; {kept}, since the group cannot start "
            f"without {node}. Bring {node} back (heal restarts the group then); if its machine is gone for good, "
            f"put a spare in its place in the stack file and run `ascend-pd forget-node --stack {plan.stack} {node}` "
            f"(docs/operations.md, \"A node that does not come back\")")


def _proxy(plan: Plan, run: Runner, mode: str, inst: Instance) -> str:
    """POST /instances/<mode> with the instance's ranks (the launch's own rollout call), sent from the
    proxy node's container: the proxy's admin routes answer the cluster's own nodes only (proxy.auth);
    what happened."""
    body = json.dumps({"type": inst.role, "instances": [f"{r.address}:{r.port}" for r in inst.ranks]})
    call = (f"{CURL} -sS -o /dev/null -w '%{{http_code}}' -m {PROXY_TIMEOUT_S} -X POST "
            f"-H 'Content-Type: application/json' -d {q(body)} {q(f'{plan.proxy.url}/instances/{mode}')}")
    rc, out, _ = run(plan.proxy.node, f"docker exec {q(plan.cfg.container.name)} {call}", PROXY_TIMEOUT_S + 10)
    code = out.strip()[-3:]
    if rc != 0 or not code.isdigit() or code == "000":
        return f"proxy {mode}: no answer"
    if code != "200":
        return f"proxy {mode}: HTTP {code} (a proxy without /instances/{mode})"
    return f"proxy {mode}: ok"


def _one_request(plan: Plan, inst: Instance) -> Optional[str]:
    """The launch's one-token completion on the instance's first rank; None when it answered."""
    r = inst.ranks[0]
    try:
        resp = requests.post(f"{r.url}/v1/completions", timeout=ONE_REQUEST_TIMEOUT_S,
                             json={"model": plan.cfg.model.served_name, "prompt": "ping", "max_tokens": 1},
                             proxies={"http": None, "https": None})
    except requests.RequestException as exc:
        return f"no completion from {r.name}: {type(exc).__name__}"
    return None if resp.status_code == 200 else f"no completion from {r.name}: HTTP {resp.status_code}"


class Healer:
    """One supervisor of one stack. `plan_for(node)` is the plan whose scripts run on that node (the
    stack's plan; the loopback tests give every simulated node its own state dir)."""

    def __init__(self, plan: Plan, run: Runner, *, budget: Optional[Budget] = None,
                 plan_for: Optional[Callable[[str], Plan]] = None, tracker: Optional[HangTracker] = None,
                 timeouts: Timeouts = Timeouts(), log: Callable[[str], None] = lambda s: None):
        self.plan, self.run, self.budget = plan, run, budget or Budget()
        self.plan_for = plan_for or (lambda node: plan)
        self.tracker = tracker or hang_tracker(plan)
        self.timeouts, self.log = timeouts, log
        self.left_out: set[str] = set()

    def _script(self, node: str, name: str) -> scripts.Script:
        return next(s for s in scripts.node_scripts(self.plan_for(node), node) if s.name == name)

    def _exec(self, node: str, name: str, kind: str) -> tuple[int, str, str, float]:
        s = self._script(node, name)
        cfg = self.plan_for(node).cfg
        body = s.create if kind == "create" else s.delete
        command = in_container(cfg.container.name, body, lock=scripts.script_locks(self.plan_for(node)).of(name),
                               delete=kind == "delete",
                               host_first=s.delete_on_host_first if kind == "delete" else "")
        bound = cfg.vllm.stop_timeout_s + cfg.rollout.drain_timeout_s + cfg.vllm.ready_timeout_s + SCRIPT_MARGIN_S
        t0 = time.monotonic()
        rc, out, err = self.run(node, command, float(bound))
        return rc, out, err, time.monotonic() - t0

    def _on_nodes(self, nodes: tuple[str, ...], name: str, kind: str) -> Optional[str]:
        """Run a script on every node at once; None, or the first failure with its output's tail."""
        with cf.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            results = list(zip(nodes, pool.map(lambda n: self._exec(n, name, kind), nodes)))
        for node, (rc, out, err, _) in results:
            if rc != 0:
                tail = " | ".join((err or out).strip().splitlines()[-3:])
                return f"{node}-{name} {kind} exited {rc}: {tail}"
        return None

    def _unanswered(self, nodes: tuple[str, ...]) -> Optional[tuple[str, str]]:
        """The first of `nodes` that ssh cannot run `true` on, with why; None when all answer."""
        with cf.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            results = list(zip(nodes, pool.map(lambda n: self.run(n, "true", REACH_TIMEOUT_S), nodes)))
        for node, (rc, out, err) in results:
            if rc != 0:
                return node, " | ".join((err or out).strip().splitlines()[-2:]) or f"exit {rc}"
        return None

    def heal_instance(self, inst: Instance, why: list[str]) -> InstanceHeal:
        h = InstanceHeal(inst.name, why)
        silent = self._unanswered(inst.nodes)
        if silent is not None:  # nothing stopped, nothing counted against the budget
            h.outcome, h.detail = "blocked", blocked_detail(self.plan, inst, *silent)
            self.log(f"{inst.name}: not restarted: {h.detail}")
            return h
        t = time.monotonic()

        def lap(name: str) -> None:
            nonlocal t
            now = time.monotonic()
            h.timings[name] = now - t
            t = now

        self.budget.record(inst.name, time.time())
        self.log(f"{inst.name}: restarting on {', '.join(inst.nodes)} ({'; '.join(why)})")
        _proxy(self.plan, self.run, "remove", inst)  # broken: nothing to drain, its requests are lost anyway
        lap("out")
        failure = self._on_nodes(inst.nodes, "launch", "delete")
        lap("stop")
        if failure is None:
            failure = self._on_nodes(inst.nodes, "launch", "create")
            lap("start")
        if failure is None:
            failure = _one_request(self.plan, inst)
            lap("check")
        self.tracker.forget(r.name for r in inst.ranks)
        if failure is not None:
            h.outcome, h.detail = "failed", failure
            self.log(f"{inst.name}: restart failed: {failure}")
            _proxy(self.plan, self.run, "remove", inst)
            return h
        h.healthy_at = time.time()
        h.detail = _proxy(self.plan, self.run, "add", inst)
        lap("in")
        h.outcome = "healed"
        self.log(f"{inst.name}: healthy again ({h.detail})")
        return h

    def _poll(self):
        status = collect_status(self.plan, timeouts=self.timeouts, smoke=False, tracker=self.tracker)
        doubtful = [v.instance for v in status.instances if v.broken and _only_timeouts(v)]
        if doubtful:
            time.sleep(CONFIRM_AFTER_S)
            again = collect_status(self.plan, timeouts=self.timeouts, smoke=False, tracker=self.tracker)
            still = {v.instance for v in again.instances if v.broken}
            status.instances[:] = [v for v in status.instances if v.instance not in doubtful or v.instance in still]
        return status

    def heal_once(self, *, dry_run: bool = False) -> HealReport:
        plan = self.plan
        status = self._poll()
        rep = HealReport(plan.stack, status.polled_at, dry_run=dry_run, etcd_ok=status.etcd.ok,
                         hangs_judged=not status.hang_note)
        why: dict[str, list[str]] = {v.instance: list(v.evidence) for v in status.instances if v.broken}
        # With etcd unreadable a worker's registration is unknown, not dead: restarting every worker
        # because etcd is down would empty the KV pool for nothing.
        dead_workers = [w for w in status.workers if not w.ok and not w.reason.startswith("registrations unknown")]
        if not status.etcd.ok:
            rep.notes.append(f"etcd {status.etcd.endpoint}: {status.etcd.reason}: heal does not restart etcd "
                             "(a person or `pulumi up` with a new ascend-pd:converge does); workers are not judged "
                             "until it answers")
        if status.hang_note:
            rep.notes.append(HANG_NOTE)
        for w in dead_workers:
            inst = plan.instance_on(w.node)
            if inst is not None:
                why.setdefault(inst.name, []).append(f"its node's worker {w.node} {w.address} is down: {w.reason}")
        rep.broken = sorted(why)
        # A node whose connects all time out or find no route may be gone; one that refuses them is up
        # (its kernel answered) with its services dead: that is for the restart, after `ssh true`.
        down = {n.node: n.reason for n in status.nodes if n.state == UNREACHABLE and REFUSED not in n.reason}
        restart = [w for w in dead_workers if w.node not in down and not dry_run]
        restarted: dict[str, tuple[int, str, str, float]] = {}
        if restart:  # every dead worker at once (each its own node; the ssh gate bounds how many run)
            with cf.ThreadPoolExecutor(max_workers=len(restart)) as pool:
                restarted.update(zip([w.node for w in restart],
                                     pool.map(lambda w: self._exec(w.node, "worker", "create"), restart)))
        for w in dead_workers:
            if w.node in down:  # its node's instance is blocked below, and ssh would not get there either
                rep.workers.append(f"{w.node}: not restarted: the node does not answer")
                continue
            if dry_run:
                rep.workers.append(f"{w.node}: would restart ({w.reason})")
                continue
            rc, out, err, took = restarted[w.node]
            rep.worker_restart_s[w.node] = took
            rep.workers.append(f"{w.node}: {'restarted' if rc == 0 else 'restart failed'} in {took:.1f}s"
                               + ("" if rc == 0 else f": {' | '.join((err or out).strip().splitlines()[-3:])}"))
        now = time.time()
        todo: list[tuple[Instance, list[str]]] = []
        for inst in plan.instances:
            if inst.name not in why:
                continue
            gone = next((n for n in inst.nodes if n in down), None)
            if gone is not None:
                rep.instances.append(InstanceHeal(inst.name, why[inst.name], "blocked",
                                                  blocked_detail(plan, inst, gone, down[gone])))
            elif inst.name in self.left_out or self.budget.exhausted(inst.name, now):
                n = len(self.budget.recent(inst.name, now))
                h = InstanceHeal(inst.name, why[inst.name], "left-out",
                                 f"restarted {n} time(s) within {self.budget.window_s / 60:g} min, the budget "
                                 f"(--max-restarts {self.budget.max_restarts} --window "
                                 f"{self.budget.window_s / 60:g}): not restarted again")
                if not dry_run:
                    self.left_out.add(inst.name)
                    h.detail += "; " + _proxy(plan, self.run, "remove", inst)
                rep.instances.append(h)
            elif (wait := self.budget.wait_s(inst.name, now)) > 0:
                rep.instances.append(InstanceHeal(inst.name, why[inst.name], "waiting",
                                                  f"backoff: next restart in {wait:.0f}s"))
            elif dry_run:
                rep.instances.append(InstanceHeal(inst.name, why[inst.name], "planned",
                                                  "would restart on " + ", ".join(inst.nodes)))
            else:
                todo.append((inst, why[inst.name]))
        if todo:
            with cf.ThreadPoolExecutor(max_workers=len(todo)) as pool:
                rep.instances += list(pool.map(lambda a: self.heal_instance(*a), todo))
        return rep

    def reset(self, instance: str) -> None:
        """A person fixed the cause: the instance gets its budget back (and is healed next cycle)."""
        self.left_out.discard(instance)
        self.budget.restarts.pop(instance, None)
        self.budget.save()


def _only_timeouts(v) -> bool:
    """Broken only because ranks did not answer in time (maybe slow, not dead): status says "within"
    for every deadline it ran out of (connect, answer, body)."""
    return v.state == "dead" and all("within" in r.evidence for r in v.ranks if r.state == "dead")


def watch(healer: Healer, every_s: float, *, count: Optional[int] = None, dry_run: bool = False, out=None) -> int:
    """The supervisor loop: a cycle every `every_s` seconds (after the previous one ends)."""
    out = out or sys.stdout
    code, n = 0, 0
    try:
        while True:
            rep = healer.heal_once(dry_run=dry_run)
            if rep.broken or rep.workers or n == 0:
                out.write(rep.text())
                out.flush()
            code, n = (0 if rep.ok else 1), n + 1
            if count is not None and n >= count:
                return code
            time.sleep(every_s)
    except KeyboardInterrupt:
        return code


def default_state_path(stack: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "ascend-pd" / f"heal-{stack}.json"


__all__ = ["Runner", "Budget", "Healer", "HealReport", "InstanceHeal", "watch", "ssh_runner", "default_state_path"]
