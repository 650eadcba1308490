"""`pulumi up` and `pulumi destroy` on loopback: the program's resource graph captured under the
SDK's mocks, turned into steps by the engine model (ascend_pd.engine.model), and every step's real
command run on its simulated node, in the engine's order and with its parallelism.

A `Deployment` keeps the state the engine would record between runs. What each step does:

* `command:remote:Command`: the exact text pulumi-command would run over SSH on the node: the
  new `create` for a create, update or replacement, the recorded (old) `delete` for a delete; run
  by `sh -c` with the node's stand-in `docker` first on PATH (run_harness.FAKE_DOCKER);
* the NPU `docker.Container`: created (its name must be free on the node, as docker requires),
  deleted (every process started in it killed, its container-local files gone), or updated in
  place (restart policy: nothing to do here);
* the image-mode etcd `docker.Container`: its `command` started as a process (data dir a fresh
  tmpfs), or killed;
* images and docker providers: nothing to do on this machine.

Every simulated node is its own directory named after its address (a renamed node is the same
machine), and its own plan (run_harness.Cluster), so each node's resources are taken from a capture
of the program with that node's paths.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import run_harness as harness
from proxy_key import TEST_PROXY_KEY

from ascend_pd.engine.capture import COMMAND, CONTAINER, DOCKER_PROVIDER, Graph, Reg, capture, plain, unwrap
from ascend_pd.engine.model import (CREATE, DELETE, DELETE_REPLACED, REPLACE, UPDATE, Outcome, Step, execute,
                                    plan_destroy, plan_up)

PROJECT = "ascend-pd"
# The parallelism the README tells operators to pass for a stack of this size (what the engine
# runs at once); the scenarios use the same number.
DEFAULT_PARALLEL = 16

# A `pip` that succeeds without touching the network or the venv: the stacks install an aarch64
# wheel from the internet; the pip step itself is tested in test_run_prepare.
FAKE_PIP = "#!/bin/sh\necho \"fake pip: $*\"\nexit 0\n"


class StepFailed(AssertionError):
    pass


@dataclass
class Run:
    """One `pulumi up` or `destroy`: its steps, what happened, and the output of each step."""

    steps: list[Step]
    outcome: Outcome
    output: dict[int, str] = field(default_factory=dict)
    step_seconds: dict[int, float] = field(default_factory=dict)
    step_started: dict[int, float] = field(default_factory=dict)  # time.monotonic() at its start
    seconds: float = 0.0

    def span(self, op: str, name: str) -> tuple[float, float]:
        """When the step `op name` started and finished (time.monotonic())."""
        i = next(i for i, s in enumerate(self.steps) if s.op == op and s.name == name)
        return self.step_started[i], self.step_started[i] + self.step_seconds[i]

    def slowest(self, n: int = 5) -> list[tuple[str, float]]:
        return sorted(((str(self.steps[i]), round(t, 1)) for i, t in self.step_seconds.items()),
                      key=lambda x: -x[1])[:n]

    def ops(self, kinds: Sequence[str] = (CREATE, UPDATE, REPLACE, DELETE, DELETE_REPLACED)) -> list[tuple[str, str]]:
        """(op, resource name) of the steps that act on a node, in step order."""
        return [(s.op, s.name) for s in self.steps if s.acts and s.op in kinds]

    def names(self, op: str) -> set[str]:
        return {s.name for s in self.steps if s.acts and s.op == op}

    def failures(self) -> dict[str, str]:
        return {self.steps[i].name: str(e) for i, e in self.outcome.failed.items()}


class Deployment:
    """A stack deployed on loopback by the engine model. `up(overrides)` captures the program with
    the stack's settings changed by `overrides` (as run_harness.local_config_map takes them) and
    runs the steps from the recorded state; `destroy()` deletes everything."""

    def __init__(self, stack: str, tmp: Path, base: Optional[dict] = None, parallel: int = DEFAULT_PARALLEL):
        self.stack, self.tmp, self.base, self.parallel = stack, tmp, dict(base or {}), parallel
        self.state: list[Reg] = []
        self.bin = tmp / "scenario-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.bin / "pip").write_text(FAKE_PIP)
        (self.bin / "pip").chmod(0o755)
        self.cluster = self._cluster(self.base)
        self.runs: list[Run] = []

    # -- the program and the plan ----------------------------------------------------------------

    def _cluster(self, overrides: dict) -> harness.Cluster:
        return harness.Cluster(self.stack, self.tmp, overrides=overrides, transport="pulumi", containers=False,
                               dirs_by_address=True)

    def settings(self, overrides: Optional[dict] = None) -> dict:
        """The deployed settings (`base`) changed by `overrides`; None removes an override (the
        stack file's value applies again), at the top level or one level down."""
        merged = {k: dict(v) if isinstance(v, dict) else v for k, v in self.base.items()}
        for k, v in (overrides or {}).items():
            if v is None:
                merged.pop(k, None)
            elif isinstance(v, dict) and isinstance(merged.get(k), dict):
                merged[k].update(v)
            else:
                merged[k] = dict(v) if isinstance(v, dict) else v
            if isinstance(merged.get(k), dict):
                merged[k] = {kk: vv for kk, vv in merged[k].items() if vv is not None}
        return merged

    def goal(self, cluster: harness.Cluster) -> Graph:
        """The program's registrations, each node's resources from a capture with that node's paths."""
        graphs = {}
        for node in cluster.nodes:
            flat = harness.local_config_map(self.stack, self.tmp, cluster.node_dir(node), **cluster.overrides)
            # The proxy's key, as `pulumi config set --secret` leaves it: the program writes it on the node.
            config = {f"{PROJECT}:{k}": v for k, v in flat.items()} | {f"{PROJECT}:proxyApiKey": TEST_PROXY_KEY}
            secrets = [k for k in config if k in (f"{PROJECT}:sshPrivateKey", f"{PROJECT}:proxyApiKey")]
            graphs[node] = capture(config, stack=self.stack, secret_keys=secrets)
        ref = graphs[cluster.nodes[0]]
        address_to_node = {cluster.address(n): n for n in cluster.nodes}
        regs = []
        for reg in ref.regs:
            node = address_to_node.get(self._address(reg, ref))
            regs.append(graphs[node].by_urn(reg.urn) if node else reg)
        return Graph(regs=regs)

    @staticmethod
    def _address(reg: Reg, graph_or_state) -> Optional[str]:
        if reg.type == COMMAND:
            return unwrap(reg.inputs["connection"])["host"]
        if reg.type == DOCKER_PROVIDER:
            return reg.inputs["host"].rsplit("@", 1)[1].rsplit(":", 1)[0]
        if reg.provider.startswith("urn:") and "pulumi:providers:docker" in reg.provider:
            urn = reg.provider.rsplit("::", 1)[0]
            provider = graph_or_state(urn) if callable(graph_or_state) else graph_or_state.by_urn(urn)
            return Deployment._address(provider, graph_or_state) if provider else None
        return None

    def node_of(self, reg: Reg, regs: Sequence[Reg]) -> str:
        by_urn = {r.urn: r for r in regs}
        address = self._address(reg, by_urn.get)
        by_address = {self.cluster.address(n): n for n in self.cluster.nodes}
        if address not in by_address:
            raise AssertionError(f"{reg.name}: no simulated node has address {address}")
        return by_address[address]

    # -- runs -------------------------------------------------------------------------------------

    def up(self, overrides: Optional[dict] = None, *, env: Optional[dict] = None, parallel: Optional[int] = None
           ) -> Run:
        """`pulumi up` with the deployed settings changed by `overrides`, which then are the
        deployed settings (as an edited stack file stays edited)."""
        self.base = self.settings(overrides)
        cluster = self._cluster(self.base)
        goal = self.goal(cluster)
        steps = plan_up(self.state, goal)
        self.cluster = cluster
        return self._execute(steps, [r.urn for r in goal.regs], env or {}, parallel)

    def destroy(self, *, env: Optional[dict] = None) -> Run:
        return self._execute(plan_destroy(self.state), [], env or {}, None)

    def _execute(self, steps: list[Step], order: list[str], env: dict, parallel: Optional[int]) -> Run:
        run = Run(steps=steps, outcome=None)  # type: ignore[arg-type]
        known = list(self.state) + [s.new for s in steps if s.new is not None]
        index = {id(s): i for i, s in enumerate(steps)}

        def act(step: Step) -> None:
            t = run.step_started[index[id(step)]] = time.monotonic()
            try:
                run.output[index[id(step)]] = self._act(step, known, env)
            finally:
                run.step_seconds[index[id(step)]] = time.monotonic() - t

        t0 = time.monotonic()
        run.outcome = execute(self.state, steps, act, parallel=parallel or self.parallel, goal_order=order)
        run.seconds = time.monotonic() - t0
        self.state = run.outcome.state
        self.runs.append(run)
        print(f"{len([s for s in steps if s.acts])} steps in {run.seconds:.1f}s; slowest: {run.slowest()}")
        return run

    # -- what a step does on its node ---------------------------------------------------------

    def _act(self, step: Step, known: Sequence[Reg], env: dict) -> str:
        reg = step.reg
        node = self.node_of(reg, known)
        creating = step.op in (CREATE, UPDATE, REPLACE)
        if reg.type == COMMAND:
            text = reg.inputs["create"] if creating else reg.inputs["delete"]
            stdin = plain(reg.inputs.get("stdin")) if creating else None  # a secret file's content
            return self.sh(node, text, what=str(step), env=env, stdin=stdin)
        if reg.type == CONTAINER and reg.inputs.get("command"):  # image-mode etcd
            name = reg.inputs["name"]
            self.kill_container(name)
            if creating:
                self._start_etcd_container(node, reg)
            return ""
        if reg.type == CONTAINER:
            state = self.cluster.container_state(node)
            if step.op == UPDATE:
                return ""  # restart policy, must_run: updated in place
            if creating:
                if state.exists():
                    raise StepFailed(f"{step}: Error response from daemon: Conflict. The container name "
                                     f"\"/{reg.inputs['name']}\" is already in use on {node}")
                state.write_text("running\n")
            else:
                self.remove_container(node)
            return ""
        return ""  # images, providers

    def env(self, node: str, extra: Optional[dict] = None) -> dict[str, str]:
        # The fake ranks form their DP group as vLLM's do: none serves before all run, all stop when one dies.
        env = self.cluster.env(node, {"FAKE_VLLM_DP_GROUP": "1", **(extra or {})})
        env["PATH"] = os.pathsep.join([str(self.bin), env["PATH"]])
        return env

    def sh(self, node: str, text: str, *, what: str, env: Optional[dict] = None, stdin: Optional[str] = None) -> str:
        proc = subprocess.run(["sh", "-c", text], env=self.env(node, env), cwd=str(self.cluster.node_dir(node)),
                              capture_output=True, text=True, timeout=harness.SCRIPT_TIMEOUT_S,
                              start_new_session=True, input=stdin if stdin is not None else "")
        if proc.returncode != 0:
            raise StepFailed(f"{what} on {node} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
        return proc.stdout

    # -- containers and faults ------------------------------------------------------------------

    @staticmethod
    def container_processes(container: str) -> list[int]:
        """Every live process started in the simulated container `container` (FAKE_CONTAINER)."""
        mark = f"FAKE_CONTAINER={container}"
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().decode(errors="replace").split("\0"):
                        out.append(int(d.name))
                except OSError:
                    continue
        return [p for p in out if harness.alive(p)]

    def kill_container(self, container: str) -> None:
        harness.kill_all(self.container_processes(container), grace=0.5)

    def container_local(self, node: str) -> list[Path]:
        """What lives in the container's own filesystem (gone with it): the state dir, the worker's
        liveness file, the client's ~/.datasystem. (/tmp and /home are host mounts.)"""
        plan = self.cluster.plans[node]
        return [Path(plan.cfg.state_dir), Path(plan.cfg.yuanrong.liveness_path),
                self.cluster.home(node) / ".datasystem"]

    def remove_container(self, node: str) -> None:
        self.kill_container(node)
        for p in self.container_local(node):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.cluster.container_state(node).unlink(missing_ok=True)

    def _start_etcd_container(self, node: str, reg: Reg) -> None:
        """Its command, started again whenever it exits (restart: unless-stopped, docker's
        backoff), each time on an empty data dir (a tmpfs mount is new at every start)."""
        argv = " ".join(shlex.quote(a) for a in reg.inputs["command"])
        data = next((m["target"] for m in reg.inputs.get("mounts", []) if m.get("type") == "tmpfs"), None)
        wipe = f"rm -rf {shlex.quote(data)}; " if data else ""
        loop = f"while :; do {wipe}{argv}; sleep 1; done"
        env = {**self.cluster.env(node), "FAKE_CONTAINER": reg.inputs["name"]}
        log = self.tmp / f"{reg.inputs['name']}.log"
        with open(log, "ab") as out:
            subprocess.Popen(["bash", "-c", loop], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True)

    def reboot(self, node: str) -> None:
        """The node goes down and comes back: every process gone; docker starts the containers
        again (restart: unless-stopped), with their files, and nothing else in them."""
        self.kill_container(node)
        for reg in self.state:
            if reg.type == CONTAINER and reg.inputs.get("command") and self.node_of(reg, self.state) == node:
                self.kill_container(reg.inputs["name"])
                self._start_etcd_container(node, reg)

    def stop_container(self, node: str) -> None:
        """`docker stop`: the container's processes die; it stays, stopped."""
        self.kill_container(node)
        self.cluster.container_state(node).write_text("stopped\n")

    def kill_rank(self, node: str, rank: str) -> int:
        pid = self.cluster.pid(node, rank)
        os.kill(pid, signal.SIGKILL)
        harness.wait_for(lambda: not harness.alive(pid), 10, what=f"{rank} gone")
        return pid


# ---------------------------------------------------------------------------------------------
# Convergence: what a healthy deployment of the current plan looks like, checked on the machine


def rank_processes() -> dict[tuple[str, int], list[int]]:
    """(address, port) -> live fake vLLM processes serving it, whoever started them."""
    out: dict[tuple[str, int], list[int]] = {}
    for pid in harness.processes_matching(["fake_vllm.py"]):
        cmd = harness.cmdline(pid)
        flags = dict(zip(cmd, cmd[1:]))
        if "--host" in flags and "--port" in flags:
            out.setdefault((flags["--host"], int(flags["--port"])), []).append(pid)
    return out


def worker_processes() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for pid in harness.processes_matching(["datasystem_worker", "--worker_address="]):
        cmd = harness.cmdline(pid)
        if not cmd or not cmd[0].endswith("datasystem_worker"):
            continue
        address = next(a.split("=", 1)[1] for a in cmd if a.startswith("--worker_address="))
        out.setdefault(address, []).append(pid)
    return out


def converged(dep: Deployment, *, timeout: float = 30) -> None:
    """Every planned rank runs its planned command and answers /health; nothing unplanned runs; no
    port or NPU is held twice; one worker per planned address and no other; one etcd; etcd holds
    exactly the planned workers; the proxy runs the planned command and counts every instance."""
    c = dep.cluster
    plan = c.any_plan
    planned = {(r.address, r.port): (n, r) for n in c.nodes for r in harness.ranks_on(c, n)}
    problems: list[str] = []

    def check() -> list[str]:
        problems.clear()
        procs = rank_processes()
        for key, (node, rank) in planned.items():
            pids = procs.get(key, [])
            if len(pids) != 1:
                problems.append(f"{rank.name} on {node}: {len(pids)} processes on {key}")
                continue
            if harness.cmdline(pids[0])[2:] != list(c.plans[node].ranks[[r.name for r in c.plans[node].ranks].index(rank.name)].argv[1:]):
                problems.append(f"{rank.name} on {node}: runs another command than planned")
            if c.pid(node, rank.name) != pids[0]:
                problems.append(f"{rank.name} on {node}: its pid file does not name its process")
            if not harness.http_ok(f"http://{rank.address}:{rank.port}/health", timeout=2):
                problems.append(f"{rank.name} on {node}: /health does not answer 200")
        for key, pids in procs.items():
            if key not in planned and key[0].startswith(harness.ADDRESS_PREFIX):
                problems.append(f"unplanned rank process(es) {pids} on {key}")
        by_address: dict[str, list[set[int]]] = {}
        for (address, _), pids in procs.items():
            for pid in pids:
                devices = harness.environ(pid).get("ASCEND_RT_VISIBLE_DEVICES", "")
                by_address.setdefault(address, []).append({int(d) for d in devices.split(",") if d})
        for address, sets in by_address.items():
            seen: set[int] = set()
            for s in sets:
                if s & seen:
                    problems.append(f"NPUs {sorted(s & seen)} on {address} held by two ranks")
                seen |= s
        workers = worker_processes()
        want = {c.plans[n].worker(n).address for n in c.nodes}
        for address in want:
            if len(workers.get(address, [])) != 1:
                problems.append(f"worker {address}: {len(workers.get(address, []))} processes")
        for address in set(workers) - want:
            if address.startswith(harness.ADDRESS_PREFIX):
                problems.append(f"unplanned worker {address}: {workers[address]}")
        etcds = [p for p in harness.processes_matching([harness.ETCD_BINARY, "--name", "etcd-single"])
                 if harness.cmdline(p)[:1] == [harness.ETCD_BINARY]]  # [] once it has exited
        if len(etcds) != 1:
            problems.append(f"{len(etcds)} etcd processes")
        else:
            try:
                registered = {k.rsplit("/", 1)[1] for k in harness.etcd_keys(c, "/datasystem/cluster/")}
                if registered != want:
                    problems.append(f"etcd registrations {sorted(registered)} != planned {sorted(want)}")
            except Exception as exc:  # noqa: BLE001 - reported
                problems.append(f"etcd: {exc!r}")
        proxies = [p for p in harness.processes_matching(["--prefiller-hosts"]) if harness.alive(p)]
        if len(proxies) != 1:
            problems.append(f"{len(proxies)} proxy processes")
        elif harness.cmdline(proxies[0])[1:] != list(c.plans[plan.proxy.node].proxy.argv[1:]):
            problems.append("the proxy runs another command than planned")
        return list(problems)

    deadline = time.monotonic() + timeout
    while check() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not problems, "not converged:\n  " + "\n  ".join(problems)


def pids_of_ranks(dep: Deployment) -> dict[str, int]:
    c = dep.cluster
    return {r.name: c.pid(n, r.name) for n in c.nodes for r in harness.ranks_on(c, n)}


def any_container_processes() -> list[int]:
    """Every live process started in any simulated container."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                env = (d / "environ").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(e.startswith("FAKE_CONTAINER=") for e in env):
                out.append(int(d.name))
    return [p for p in out if harness.alive(p)]


__all__ = ["Deployment", "Run", "StepFailed", "converged", "pids_of_ranks", "any_container_processes",
           "rank_processes", "worker_processes"]
