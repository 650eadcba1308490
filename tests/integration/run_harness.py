"""Run the scripts a stack renders, for real, on this machine.

A committed stack file is loaded exactly as the Pulumi CLI hands it to the program
(`loader.cli_config_map`), then remapped to what one small machine holds: node addresses become
loopback addresses 127.0.1.(10+i), sizes shrink, timeouts shorten, etcd/proxy point at local
binaries, the proxy is the release's own script (tests/proxy_release.py) and the vLLM ranks are fakes
that speak the P/D protocol. Everything still goes through `loader.load_config` and `plan.build_plan`, so the
real validation runs on the remapped stack.

Every node of a real cluster is its own machine with its own container filesystem. Here they share
one, so every simulated node gets its own plan whose `stateDir` and `yuanrong.livenessPath` live
under `<tmp>/<node>/`, and its scripts run with `HOME=<tmp>/<node>/home` (the openYuanrong client
keeps `~/.datasystem` there). A node's scripts are always taken from its own plan.

Scripts run as `bash -s` with the script text on stdin: exactly what the components pipe into
`docker exec -i <container> bash -s`; with `transport="pulumi"` the very command the components
send is run instead, through a stand-in `docker`. Every script gets PATH = tests/fakes/bin (the fake
`vllm`), this interpreter's bin dir (dscli, the venv's python3), then the system PATH.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import proxy_key
import proxy_release
from proxy_key import TEST_PROXY_KEY
from quiet_worker import QUIET_WORKER_FLAGS
from ascend_pd import releases, scripts, shell
from ascend_pd.loader import PROJECT_DIR, cli_config_map, load_config
from ascend_pd.plan import Plan, build_plan, proxy_key_file, role_secrets_file, secret_env

proxy_key.export()  # status and heal, run in the tests' process, send the proxy's key

FAKES = PROJECT_DIR / "tests" / "fakes"
FAKES_BIN = FAKES / "bin"
PYTHON = sys.executable
ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"
VENV_BIN = str(Path(PYTHON).parent)

# Loopback addresses of the simulated nodes: 127.0.1.(10+i). Other suites on this machine use
# 127.0.0.x; every address in 127.0.1.0/24 is ours.
ADDRESS_PREFIX = "127.0.1."
ADDRESS_BASE = 10

# Ports of the services outside the vLLM/Mooncake layout, moved off the stack defaults so a
# concurrently running etcd/worker on the defaults (on other loopback addresses) never collides.
ETCD_CLIENT_PORT = 12479
ETCD_PEER_PORT = 12480
WORKER_PORT = 18581

# The config model's floor (ascend-pd:yuanrong.sharedMemoryMb >= 64); the worker itself starts with
# 1 MiB, and 64 MiB holds the suite's values many times over.
SHARED_MEMORY_MB = 64
# No single script may take longer than this in the suite. A replaced launch's delete waits for a
# restart slot while the instances before it roll: the fourth of four prefill instances at
# maxUnavailable 1 waited 240 s on a CI machine whose other half ran the hostile sweep (the whole
# rollout then took 252 s, 130 s when quieter), so the bound is a hang guard, not a deadline.
SCRIPT_TIMEOUT_S = 600
# The release's proxy imports fastapi/uvicorn (and httpx) before it listens: 1-2 s on a quiet machine,
# 5-7 s measured on this loaded one, over 30 s at a load average of 400: the deadline leaves room for that.
PROXY_READY_TIMEOUT_S = 120

# Every script runs with this (unreachable) HTTP proxy in its environment, as in a container whose
# env carries the proxy pip needs: probes of our own services must not go through it, and the
# processes the scripts start must not inherit it.
DEAD_PROXY = f"http://{ADDRESS_PREFIX}254:9"
PROXY_ENV = {"http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY,
             "HTTPS_PROXY": DEAD_PROXY, "no_proxy": "", "NO_PROXY": ""}

# Stand-in for `docker` on a node, with the container's state in $FAKE_DOCKER_STATE (a file holding
# `running` or `stopped`; no file: no such container; the harness creates it `running`):
#   docker exec -i [-e VAR=VALUE]... NAME CMD...   runs CMD here (stdin passed on) with
#                                  FAKE_CONTAINER=<node> and each VAR=VALUE in its environment, or
#                                  fails like docker when the container is stopped or missing;
#   docker inspect --type container --format '{{.State.Running}}' NAME   true / false / No such container;
#   docker start NAME              marks it running;
#   docker stop [-t S] NAME        kills the processes of the container NAME (the node's, which is
#                                  then stopped, or another one's, marked FAKE_CONTAINER=NAME).
# FAKE_DOCKER_NO_CONTAINER=1 makes the container missing for one call.
FAKE_DOCKER = """#!/usr/bin/env bash
set -euo pipefail
state=missing
if [ -z "${FAKE_DOCKER_NO_CONTAINER:-}" ] && [ -f "${FAKE_DOCKER_STATE:?}" ]; then state=$(cat "$FAKE_DOCKER_STATE"); fi
name() { for a in "$@"; do last=$a; done; echo "$last"; }
case "${1:-}" in
  exec)
    shift
    envs=()
    while :; do
      case "${1:-}" in
        -i|-t) shift ;;
        -e) envs+=("$2"); shift 2 ;;
        *) break ;;
      esac
    done
    case "$state" in
      running) ;;
      stopped) echo "Error response from daemon: container $1 is not running" >&2; exit 1 ;;
      *) echo "Error response from daemon: No such container: $1" >&2; exit 1 ;;
    esac
    shift  # the container name
    # Everything started in "the container" carries its name: what a container stop kills.
    exec env FAKE_CONTAINER="${FAKE_DOCKER_NODE:?}" ${envs[@]+"${envs[@]}"} "$@" ;;
  inspect)
    case "$state" in
      running) echo true ;;
      stopped) echo false ;;
      *) echo "Error: No such container: $(name "$@")" >&2; exit 1 ;;
    esac ;;
  start)
    if [ "$state" = missing ]; then echo "Error response from daemon: No such container: $2" >&2; exit 1; fi
    echo running > "$FAKE_DOCKER_STATE"; echo "$2" ;;
  stop)
    # The node's container, or another one (image-mode etcd): its processes end; a stopped
    # container stays (restart policy unless-stopped: it stays stopped until started).
    target=$(name "$@")
    if [ "$target" = "${FAKE_DOCKER_CONTAINER:?}" ]; then mark=$FAKE_DOCKER_NODE; echo stopped > "$FAKE_DOCKER_STATE"
    else mark=$target; fi
    for f in /proc/[0-9]*/environ; do
      if tr '\0' '\n' < "$f" 2>/dev/null | grep -qx "FAKE_CONTAINER=$mark"; then
        p=${f#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null || true
      fi
    done
    echo "$target" ;;
  *) echo "fake docker: unsupported: $*" >&2; exit 2 ;;
esac
"""

# Markers in the command line of every process the suite starts: what the cleanup scans for.
PROCESS_NAMES = ("datasystem_worker", "etcd", "fake_vllm.py", proxy_release.SCRIPT_NAME, "dscli")


def _missing(tool: str) -> bool:
    """Looked up on the PATH the scripts get (fakes, then this interpreter's bin dir, then PATH)."""
    path = os.pathsep.join([str(FAKES_BIN), VENV_BIN, os.environ.get("PATH", "")])
    return shutil.which(tool, path=path) is None and not Path(tool).exists()


def require_tools(*tools: str) -> None:
    """Skip the calling test (or fixture) when a tool the scripts need is not installed."""
    import pytest

    missing = [t for t in tools if _missing(t)]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}")


def node_address(i: int) -> str:
    return f"{ADDRESS_PREFIX}{ADDRESS_BASE + i}"


def _decode(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def local_config_map(stack: str, tmp: Path, node_dir: Path, **overrides) -> dict[str, str]:
    """The stack's CLI map, remapped to this machine; `node_dir` holds the node-local state.
    `overrides` replace top-level settings (decoded values) after the remapping."""
    raw = {k: _decode(v) for k, v in cli_config_map(stack).items()}
    # Nodes (the stack's, or an override's: a renamed node) keep their position's loopback address.
    overrides = dict(overrides)
    raw["nodes"] = [
        {**n, "address": node_address(i), "nic": "lo"} for i, n in enumerate(overrides.pop("nodes", raw["nodes"]))
    ]
    y = dict(raw["yuanrong"])
    y.update(
        sharedMemoryMb=SHARED_MEMORY_MB,
        hugeTlb=False,  # no huge pages here; the huge-page script is tested on fake /proc files
        port=WORKER_PORT,
        livenessPath=str(node_dir / "liveness"),
        # A worker starts in seconds here, but on a loaded 2-core CI machine (the other half of the suite
        # running the hostile-values sweep) one took 57 s to get its etcd keepalive through: room for that.
        startTimeoutS=120,
        stopTimeoutS=20,
        # Short enough that a worker killed by a test is noticed by its peers within the suite.
        nodeTimeoutS=5,
        nodeDeadTimeoutS=10,
        flags={**QUIET_WORKER_FLAGS, **y.get("flags", {})},
    )
    if y.get("interleave") and shutil.which("numactl"):
        y["interleave"] = "all"  # this machine's NUMA nodes, whatever the stack's NPU servers have
    else:
        y.pop("interleave", None)  # dscli refuses --interleave without numactl
    raw["yuanrong"] = y
    raw["container"] = {**raw["container"], "shmSize": "1g"}
    # Nothing here goes over SSH (scripts run by bash, or by a stand-in docker): no host to pin.
    raw["ssh"] = {"insecureIgnoreHostKeys": True}
    raw.pop("hugepages", None)
    # This machine has no NPUs, driver or hccn.conf: the preflight gate is tested against fake Ascend
    # nodes behind sshd (tests/test_preflight_doctor.py), not in the deploy scenarios.
    raw["preflight"] = {"mode": "off"}
    raw["etcd"] = {
        **raw["etcd"],
        "binary": ETCD_BINARY,
        "dataDir": str(tmp / "etcd-data"),
        "clientPort": ETCD_CLIENT_PORT,
        "peerPort": ETCD_PEER_PORT,
        "startTimeoutS": 30,
    }
    raw["proxy"] = {
        **raw["proxy"],
        "python": PYTHON,  # the test interpreter: fastapi, httpx and uvicorn are dev requirements
        "readyTimeoutS": PROXY_READY_TIMEOUT_S,
        "smokeTimeoutS": 30,
    }
    raw["vllm"] = {**raw.get("vllm", {}), "readyTimeoutS": 60, "stopTimeoutS": 5}  # both the minimum
    raw["stateDir"] = str(node_dir / "state")
    for key, value in overrides.items():  # one level deep: {"yuanrong": {"flags": ...}} keeps the rest
        if callable(value):  # a value per simulated node, from its directory
            value = value(node_dir)
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            if key == "yuanrong" and "flags" in value:  # a test's worker flags join the quiet ones
                value = {**value, "flags": {**QUIET_WORKER_FLAGS, **value["flags"]}}
            raw[key] = {**raw[key], **value}
        elif value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    if "script" not in overrides.get("proxy", {}):
        # The release's own script, unedited, at the version the proxy node's image runs.
        raw["proxy"]["script"] = str(proxy_release.for_release(proxy_release_of(raw)))
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


def proxy_release_of(raw: dict) -> str:
    """The vllm-ascend release of the proxy node's image (config.node_image's rule, on decoded settings)."""
    node = raw["proxy"]["node"]
    image = next((raw[r]["image"] for r in ("prefill", "decode") if node in raw[r]["nodes"] and raw[r].get("image")),
                 raw["container"]["image"])
    return releases.release_named(image, raw.get("vllmAscend", {}).get("release"))


@dataclass
class Cluster:
    """One stack, remapped to loopback, with one plan per simulated node."""

    stack: str
    tmp: Path
    overrides: dict = field(default_factory=dict)
    # "bash": the script text on `bash -s`'s stdin. "pulumi": the exact command the components send
    # (scripts.in_container: `docker exec -i <container> bash -s <<'HEREDOC'`), run by `sh -c` with a
    # stand-in `docker` first on PATH whose `exec` runs the command here.
    transport: str = "bash"
    # With the pulumi transport: whether every node's container exists (running) from the start; the
    # engine scenarios create and delete containers themselves.
    containers: bool = True
    # Simulated nodes' directories are named after the node (default) or its address (the engine
    # scenarios: a node renamed in the stack file is the same machine, with the same files).
    dirs_by_address: bool = False
    # Setting path -> value of the secrets the stack holds (placeholders in `overrides`): what the program
    # would hand the nodes; the harness writes them where the secret-file Commands do.
    secret_values: dict = field(default_factory=dict)
    plans: dict[str, Plan] = field(init=False)

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        nodes = self.overrides.get("nodes") or json.loads(cli_config_map(self.stack)["nodes"])
        names = [n["name"] for n in nodes]
        self._addresses = {n: node_address(i) for i, n in enumerate(names)}
        self.plans = {}
        for name in names:
            d = self.node_dir(name)
            (d / "home").mkdir(parents=True, exist_ok=True)
            cfg = load_config(local_config_map(self.stack, self.tmp, d, **self.overrides))
            self.plans[name] = build_plan(cfg, self.stack)
        if self.transport == "pulumi":
            self.docker_bin.mkdir(exist_ok=True)
            docker = self.docker_bin / "docker"
            docker.write_text(FAKE_DOCKER)
            docker.chmod(0o755)
            for name in self.plans:
                if self.containers:
                    self.container_state(name).write_text("running\n")
        if self.containers:  # the engine scenarios run the secret-file Commands themselves
            for name in self.plans:
                self.write_secrets(name)

    def write_secrets(self, node: str) -> None:
        """What `<node>-proxy-key` and `<node>-secrets` write in the container: mode 0600 files."""
        plan = self.plans[node]
        files = {}
        if node == plan.proxy.node and proxy_key_file(plan.cfg):
            files[proxy_key_file(plan.cfg)] = TEST_PROXY_KEY + "\n"
        inst = plan.instance_on(node)
        if inst is not None and secret_env(plan.cfg, inst.role):
            env = {**plan.cfg.vllm.env, **getattr(plan.cfg, inst.role).env}
            files[role_secrets_file(plan.cfg, inst.role)] = "".join(
                f"{n}={shlex.quote(str(self.secret_values.get(path, env[n])))}\n" for n, path in secret_env(plan.cfg, inst.role))
        for path, text in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
            os.chmod(path, 0o600)

    def container_state(self, node: str) -> Path:
        """The fake docker's record of this node's NPU container (running/stopped/absent)."""
        return self.node_dir(node) / "container.state"

    @property
    def docker_bin(self) -> Path:
        return self.tmp / "fake-docker-bin"

    # -- layout ---------------------------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        return list(self.plans)

    @property
    def any_plan(self) -> Plan:
        return next(iter(self.plans.values()))

    def node_dir(self, node: str) -> Path:
        return self.tmp / (self._addresses[node] if self.dirs_by_address else node)

    def home(self, node: str) -> Path:
        return self.node_dir(node) / "home"

    def state_dir(self, node: str) -> Path:
        return Path(self.plans[node].cfg.state_dir)

    def run_dir(self, node: str) -> Path:
        return self.state_dir(node) / "run"

    def log_dir(self, node: str) -> Path:
        return self.state_dir(node) / "logs"

    def liveness(self, node: str) -> Path:
        return Path(self.plans[node].cfg.yuanrong.liveness_path)

    def address(self, node: str) -> str:
        return self.plans[node].node(node).address

    @property
    def etcd_node(self) -> str:
        return self.any_plan.etcd.node

    @property
    def etcd_endpoint(self) -> str:
        return self.any_plan.etcd.endpoint

    # -- scripts ----------------------------------------------------------------------------

    def scripts(self, node: str) -> tuple[scripts.Script, ...]:
        return scripts.node_scripts(self.plans[node], node)

    def script(self, node: str, name: str) -> scripts.Script:
        for s in self.scripts(node):
            if s.name == name:
                return s
        raise KeyError(f"{node} has no script {name!r}: {[s.name for s in self.scripts(node)]}")

    def env(self, node: str, extra: Optional[dict] = None) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items()
            if not k.startswith(("FAKE_VLLM_", "PYTEST_")) and k not in PROXY_ENV
        }
        env.update(PROXY_ENV)
        env["PATH"] = os.pathsep.join([str(FAKES_BIN), VENV_BIN, os.environ.get("PATH", "/usr/bin:/bin")])
        env["HOME"] = str(self.home(node))
        if self.transport == "pulumi":
            env["PATH"] = os.pathsep.join([str(self.docker_bin), env["PATH"]])
            env["FAKE_DOCKER_STATE"] = str(self.container_state(node))
            env["FAKE_DOCKER_NODE"] = node
            env["FAKE_DOCKER_CONTAINER"] = self.plans[node].cfg.container.name
        env.update(extra or {})
        return env

    def run(
        self,
        node: str,
        name: str,
        kind: str = "create",
        *,
        env: Optional[dict] = None,
        timeout: float = SCRIPT_TIMEOUT_S,
        check: bool = True,
        text: Optional[str] = None,
    ) -> Result:
        """Run a node's rendered script (its create or delete text) as `bash -s`."""
        body = text if text is not None else getattr(self.script(node, name), kind)
        argv = ["bash", "-s"]
        if self.transport == "pulumi":
            argv, body = ["sh", "-c", self.sent(node, name, body, kind)], ""
        return run_script(body, env=self.env(node, env), cwd=self.node_dir(node), timeout=timeout,
                          check=check, what=f"{node}/{name}.{kind}", argv=argv)

    def sent(self, node: str, name: str, body: str, kind: str) -> str:
        """What Pulumi sends over SSH for a container script: `body` in the node's container, under
        the script's lock."""
        lock = scripts.script_locks(self.plans[node]).of(name)
        return shell.in_container(self.plans[node].cfg.container.name, body, lock=lock, delete=kind == "delete")

    def start(self, node: str, name: str, *, output: Path, env: Optional[dict] = None) -> subprocess.Popen:
        """A node's script (create) started as Pulumi sends it and left running, its output to a file
        (not a pipe: a caller killed mid-run must not end the script through SIGPIPE, as the
        `docker exec`'d script of a lost SSH session goes on)."""
        if self.transport != "pulumi":
            raise ValueError("start() runs the command Pulumi sends: a Cluster with transport='pulumi'")
        command = self.sent(node, name, self.script(node, name).create, "create")
        with open(output, "w") as out:
            return subprocess.Popen(["sh", "-c", command], env=self.env(node, env), cwd=str(self.node_dir(node)),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run_many(self, jobs: Iterable[tuple[str, str]], kind: str = "create", **kw
                 ) -> dict[str, Result]:
        """Run (node, script) pairs concurrently, as Pulumi runs independent resources; raise the
        first failure after all have finished."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = list(jobs)
        kw.setdefault("check", True)
        check = kw.pop("check")
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            futures = {f"{n}/{s}": pool.submit(self.run, n, s, kind, check=False, **kw) for n, s in jobs}
            results = {k: f.result() for k, f in futures.items()}
        if check:
            for k, r in results.items():
                if r.returncode != 0:
                    raise ScriptFailed(f"{k}.{kind} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return results

    # -- processes --------------------------------------------------------------------------

    def pid(self, node: str, name: str) -> Optional[int]:
        f = self.run_dir(node) / f"{name}.pid"
        try:
            return int(f.read_text().strip())
        except (OSError, ValueError):
            return None


class ScriptFailed(AssertionError):
    pass


class Result(subprocess.CompletedProcess):
    """A finished script: returncode, stdout, stderr, and its wall time in seconds."""

    elapsed: float = 0.0


def run_script(body: str, *, env: dict, cwd: Path, timeout: float, check: bool, what: str,
               argv: Optional[list[str]] = None) -> Result:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv or ["bash", "-s"], input=body, env=env, cwd=str(cwd), capture_output=True,
                              text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise ScriptFailed(f"{what} still running after {timeout}s\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    result = Result(proc.args, proc.returncode, proc.stdout, proc.stderr)
    result.elapsed = time.monotonic() - t0
    if check and result.returncode != 0:
        raise ScriptFailed(
            f"{what} exited {result.returncode} after {result.elapsed:.1f}s\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


# ---------------------------------------------------------------------------------------------
# Process inspection and last-resort cleanup


def alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def processes_matching(needles: Iterable[str]) -> list[int]:
    """Live pids whose command line contains every needle."""
    needles = list(needles)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        cmd = " ".join(cmdline(int(d.name)))
        if cmd and all(n in cmd for n in needles) and alive(int(d.name)):
            out.append(int(d.name))
    return out


def our_processes(tmp: Path) -> list[int]:
    """Every live process the suite started under `tmp`: by its command line (the tmp dir or one
    of our loopback addresses appears in it) or its working directory."""
    tmp_s = str(tmp)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        if pid == os.getpid() or not alive(pid):
            continue
        cmd = " ".join(cmdline(pid))
        if not any(name in cmd for name in PROCESS_NAMES):
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if tmp_s in cmd or cwd.startswith(tmp_s) or ADDRESS_PREFIX in cmd:
            out.append(pid)
    return out


def kill_all(pids: Iterable[int], grace: float = 3.0) -> None:
    pids = [p for p in pids if alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return


def cleanup(tmp: Path) -> list[int]:
    """Kill everything the suite started under `tmp` (pid files first, then a scan).
    Returns what was still running (useful to assert that the scripts left nothing behind)."""
    left = []
    for pidfile in tmp.glob("**/state/run/*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if alive(pid) and any(n in " ".join(cmdline(pid)) for n in PROCESS_NAMES):
            left.append(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    scanned = our_processes(tmp)
    left += scanned
    kill_all(scanned, grace=2.0)
    return sorted(set(left))


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# openYuanrong helpers


KV_CLI = Path(__file__).resolve().parent / "kv_cli.py"


def kv(c: Cluster, node: str, op: str, key: str, value: Optional[str] = None, *, worker_node: Optional[str] = None
       ) -> subprocess.CompletedProcess:
    """One KVClient call from `node` (its HOME) to the worker of `worker_node` (default: its own)."""
    w = c.plans[node].worker(worker_node or node)
    host, port = w.address.rsplit(":", 1)
    env = c.env(node)
    for k in PROXY_ENV:
        env.pop(k, None)
    args = [PYTHON, str(KV_CLI), host, port, op, key] + ([value] if value is not None else [])
    return subprocess.run(args, env=env, cwd=str(c.node_dir(node)), capture_output=True, text=True, timeout=60)


def etcd_keys(c: Cluster, prefix: str) -> list[str]:
    import etcd3gw

    e = c.any_plan.etcd
    client = etcd3gw.client(host=e.address, port=e.client_port, timeout=5)
    return sorted(meta["key"].decode() for _, meta in client.get_prefix(prefix))


def worker_pids(address: str) -> list[int]:
    """Live datasystem_worker processes serving exactly `address`."""
    flag = f"--worker_address={address}"
    out = []
    for pid in processes_matching(["datasystem_worker", flag]):
        # Read once: a worker that exits between two reads (killed while starting) leaves an empty
        # command line, and a second read's [0] raised IndexError (a CI failure).
        args = cmdline(pid)
        if flag in args and args[0].endswith("datasystem_worker"):
            out.append(pid)
    return out


# ---------------------------------------------------------------------------------------------
# vLLM rank helpers


def ranks_on(c: Cluster, node: str, role: Optional[str] = None):
    return [r for r in c.plans[node].ranks if r.node == node and (role is None or r.role == role)]


def launch_name(c: Cluster, node: str) -> str:
    names = [s.name for s in c.scripts(node) if s.name == "launch"]
    assert len(names) == 1, names
    return names[0]


def rank_pids(c: Cluster, node: str) -> dict[str, Optional[int]]:
    """Rank name -> pid from its pid file (None when there is none)."""
    return {r.name: c.pid(node, r.name) for r in ranks_on(c, node)}


def fake_vllm_pids(address: str, ports: Optional[Iterable[int]] = None) -> list[int]:
    """Every fake vLLM process started for `address` (and one of `ports`), whoever started it."""
    wanted = None if ports is None else {str(p) for p in ports}

    def serves(cmd: list[str]) -> bool:
        flags = dict(zip(cmd, cmd[1:]))
        return flags.get("--host") == address and (wanted is None or flags.get("--port") in wanted)

    return [p for p in processes_matching(["fake_vllm.py"]) if serves(cmdline(p))]


def http_ok(url: str, timeout: float = 3) -> bool:
    import requests

    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False
