"""Helpers for tests/test_status.py and tests/test_probes.py: small stacks on 127.0.2.x, and the real
processes they need (Debian etcd, openYuanrong workers via dscli, fake vLLM ranks that speak the P/D
protocol, the release's PD proxy script),
each started in its own session and always stopped with a bound."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

import requests

import proxy_key
import proxy_release
from proxy_key import TEST_PROXY_KEY
from quiet_worker import QUIET_WORKER_FLAGS
from ascend_pd.config import StackConfig
from ascend_pd.loader import load_stack
from ascend_pd.plan import PROXY_LAUNCHER, Plan, Rank, build_plan, proxy_key_file
from ascend_pd.scripts.worker import WORKER_RETRY_PAUSE_S
from ascend_pd.shell import static_file

TESTS = Path(__file__).resolve().parents[1]
FAKES = TESTS / "fakes"
FAKE_BIN = FAKES / "bin"
# The small stacks are A2 (atlas-800i-a2): the proxy of the release the a2 image runs.
RELEASE_PROXY = str(proxy_release.for_stack("a2-8node"))
proxy_key.export()  # status and the exporter, run in the tests' process, send the proxy's key
PROXY_READY_S = 60  # the release proxy imports fastapi/uvicorn first: 5-7 s measured on a loaded machine
ETCD = "/usr/bin/etcd"
DSCLI = shutil.which("dscli", path=str(Path(sys.executable).parent)) or shutil.which("dscli") or "dscli"
MODEL = "tiny-test-model"


def have_etcd() -> bool:
    return Path(ETCD).exists()


def have_dscli() -> bool:
    return Path(DSCLI).exists() or shutil.which(DSCLI) is not None


# ---------------------------------------------------------------------------------------------
# Stacks


def small_stack(
    tmp: Path,
    addresses: dict[str, str],
    *,
    prefill: list[str],
    decode: list[str],
    etcd_node: str,
    proxy_node: str,
    decode_nodes_per_instance: int = 1,
    prefill_dp: int = 2,
    decode_dp: int = 2,
    etcd_port: int = 12379,
    worker_port: int = 18481,
    port_base: int = 17100,
    proxy_port: int = 18020,
) -> dict:
    """The `ascend-pd:*` settings of a small A2 stack, as a stack file's values (camelCase)."""
    return {
        "hardware": "atlas-800i-a2",
        "nodes": [{"name": n, "address": a, "nic": "lo"} for n, a in addresses.items()],
        "container": {"name": "test", "image": "example/vllm-ascend:v0.20.2rc1", "shmSize": "1g"},
        "model": {"path": "/models/tiny", "servedName": MODEL},
        "vllm": {"flags": {"block-size": 16, "max-model-len": 4096}},
        "prefill": {"nodes": prefill, "dp": prefill_dp, "tp": 1, "portBase": port_base, "rpcPort": 17321,
                    "kvPort": 36000},
        "decode": {"nodes": decode, "nodesPerInstance": decode_nodes_per_instance, "dp": decode_dp, "tp": 1,
                   "portBase": port_base, "rpcPort": 17322, "kvPort": 36100},
        "yuanrong": {"port": worker_port, "sharedMemoryMb": 64, "nodeTimeoutS": 5, "nodeDeadTimeoutS": 10,
                     "livenessPath": str(tmp / "liveness"), "startTimeoutS": 60, "stopTimeoutS": 30,
                     "flags": QUIET_WORKER_FLAGS},
        "etcd": {"node": etcd_node, "clientPort": etcd_port, "peerPort": etcd_port + 1,
                 "dataDir": str(tmp / "etcd-data"), "binary": ETCD},
        "proxy": {"node": proxy_node, "port": proxy_port, "script": RELEASE_PROXY,
                  "python": sys.executable},
        "stateDir": str(tmp / "state"),
        "ssh": {"insecureIgnoreHostKeys": True},  # nothing here is reached over SSH
    }


def config(values: dict) -> StackConfig:
    return StackConfig.model_validate(values)


def plan_of(values: dict, stack: str = "test") -> Plan:
    return build_plan(config(values), stack)


def write_stack(project_dir: Path, stack: str, values: dict) -> None:
    """A project dir the CLI can read (`--project-dir`): Pulumi.yaml + Pulumi.<stack>.yaml."""
    import yaml

    project_dir.mkdir(parents=True, exist_ok=True)
    (project_dir / "Pulumi.yaml").write_text("name: ascend-pd\nruntime: python\n")
    (project_dir / f"Pulumi.{stack}.yaml").write_text(
        yaml.safe_dump({"config": {f"ascend-pd:{k}": v for k, v in values.items()}}))


def a2_8node_on_loopback(tmp: Path, first: int = 20) -> dict:
    """The committed a2-8node stack with its 8 nodes moved to 127.0.2.<first>..<first+7> and the
    paths moved under tmp; ports, roles and rank layout (40 ranks) stay as committed."""
    cfg = load_stack("a2-8node")
    values = cfg.model_dump(by_alias=True, exclude_none=True)
    for i, node in enumerate(values["nodes"]):
        node["address"] = f"127.0.2.{first + i}"
    # The seed's jemalloc preload is an aarch64 path: harmless there, noise for x86 fakes.
    values["vllm"]["env"].pop("LD_PRELOAD", None)
    values["yuanrong"]["livenessPath"] = str(tmp / "liveness")
    values["yuanrong"]["sharedMemoryMb"] = 64
    values["yuanrong"]["hugeTlb"] = False
    values["yuanrong"].pop("interleave", None)
    values["etcd"]["dataDir"] = str(tmp / "etcd-data")
    values["etcd"]["binary"] = ETCD
    values["proxy"]["script"] = RELEASE_PROXY
    values["proxy"]["python"] = sys.executable
    values["stateDir"] = str(tmp / "state")
    return values


# ---------------------------------------------------------------------------------------------
# Processes


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FAKE_VLLM_") and k.lower() not in ("http_proxy", "https_proxy")}
    env["PATH"] = f"{FAKE_BIN}:{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(extra)
    return env


def wait_until(pred, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last error
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready within {timeout}s (last error: {last!r})")


def http_ok(url: str, timeout: float = 1.0) -> bool:
    s = requests.Session()
    s.trust_env = False
    try:
        return s.get(url, timeout=timeout).status_code == 200
    finally:
        s.close()


class Procs:
    """Background processes of a test, each in its own session; stop() is bounded."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        logdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict, cwd: Optional[Path] = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        try:
            return (self.logdir / f"{name}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self, name: str, grace: float = 5.0) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)

    def stop_all(self) -> None:
        names = list(self.procs)
        for name in names:  # TERM everything first, then wait: fast teardown of 40 ranks
            p = self.procs[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name in names:
            self.stop(name)


def start_etcd(plan: Plan, procs: Procs) -> None:
    e = plan.etcd
    shutil.rmtree(e.data_dir, ignore_errors=True)
    p = procs.start("etcd", list(e.argv), clean_env())
    try:
        wait_until(lambda: p.poll() is None and http_ok(f"{e.client_url}/health"), 30, f"etcd {e.endpoint}")
    except TimeoutError:
        raise RuntimeError(f"etcd did not start:\n{procs.log('etcd')}") from None


def rank_env(r: Rank, counters: Optional[dict] = None, **extra: str) -> dict:
    env = clean_env(**dict(r.env))
    if counters:
        env["FAKE_VLLM_COUNTERS"] = json.dumps(counters)
    env.update(extra)
    return env


def start_ranks(plan: Plan, procs: Procs, ranks: Optional[Iterable[Rank]] = None,
                counters: Optional[dict[str, dict]] = None, wait: float = 60, **env: str) -> None:
    """Fake `vllm serve` for each rank with the plan's own argv and environment (plus `env`: a fault
    switch such as FAKE_VLLM_FAULT)."""
    ranks = list(plan.ranks if ranks is None else ranks)
    for r in ranks:
        procs.start(f"rank-{r.name}", list(r.argv), rank_env(r, (counters or {}).get(r.name), **env))
    for r in ranks:
        p = procs.procs[f"rank-{r.name}"]
        try:
            wait_until(lambda: p.poll() is None and http_ok(f"http://{r.address}:{r.port}/health"), wait,
                       f"rank {r.name}")
        except TimeoutError:
            raise RuntimeError(f"fake rank {r.name} did not start:\n{procs.log('rank-' + r.name)}") from None


def start_proxy(plan: Plan, procs: Procs, **env: str) -> None:
    """The release's proxy script with the plan's argv (and without http_proxy: httpx would obey it);
    the launcher that argv names is written where the proxy's own script writes it."""
    if plan.cfg.proxy.keep_removed_out or plan.cfg.proxy.auth:
        launcher = Path(plan.run_dir) / PROXY_LAUNCHER
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(static_file(PROXY_LAUNCHER))
    key_file = proxy_key_file(plan.cfg)
    if key_file:  # what <node>-proxy-key writes: the key, mode 0600
        Path(key_file).parent.mkdir(parents=True, exist_ok=True)
        Path(key_file).write_text(TEST_PROXY_KEY)
        os.chmod(key_file, 0o600)
    p = procs.start("proxy", list(plan.proxy.argv), clean_env(**env))
    try:
        wait_until(lambda: p.poll() is None and http_ok(f"{plan.proxy.url}/healthcheck"), PROXY_READY_S, "proxy")
    except TimeoutError:
        raise RuntimeError(f"the PD proxy did not start:\n{procs.log('proxy')}") from None


def set_counters(r: Rank, values: dict) -> None:
    s = requests.Session()
    s.trust_env = False
    try:
        resp = s.post(f"http://{r.address}:{r.port}/fake/counters", json=values, timeout=5)
        resp.raise_for_status()
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# openYuanrong workers


def worker_pids(address: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"datasystem_worker" in c for c in cmd[:1]) and f"--worker_address={address}".encode() in cmd:
            out.append(int(d.name))
    return out


class Workers:
    """Real openYuanrong workers (`dscli start -w ...` with the plan's flags), each from its own cwd
    with HOME in tmp; stop() is `dscli stop` bounded, then KILL."""

    def __init__(self, tmp: Path):
        # The worker's unix sockets live under <cwd>/datasystem/uds/<8 hex>/...: a socket path must stay
        # within 107 bytes, and pytest's tmp paths are long. Workers run from a short dir of their own.
        self.tmp = Path(tempfile.mkdtemp(prefix="apdw-", dir="/tmp"))
        self.home = self.tmp / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.started: dict[str, str] = {}  # address -> cwd

    def cwd(self, node: str) -> Path:
        return self.tmp / node

    def liveness(self, node: str) -> Path:
        return self.cwd(node) / "liveness"

    def _env(self) -> dict:
        return clean_env(HOME=str(self.home))

    def argv(self, plan: Plan, node: str, liveness: Path) -> list[str]:
        argv = list(plan.worker(node).argv)
        argv[0] = DSCLI
        i = argv.index("--liveness_check_path")
        argv[i + 1] = str(liveness)
        return argv

    def _spawn(self, plan: Plan, node: str) -> subprocess.Popen:
        cwd = self.cwd(node)
        cwd.mkdir(parents=True, exist_ok=True)
        with open(cwd / "dscli-start.log", "wb") as log:
            p = subprocess.Popen(self.argv(plan, node, self.liveness(node)), cwd=cwd, env=self._env(),
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.started[plan.worker(node).address] = str(cwd)
        return p

    def start_many(self, plan: Plan, nodes: list[str], timeout: float = 90) -> None:
        """`dscli start` on every node at once. A worker killed while starting is started again, as
        the rendered script does (`yuanrong.startAttempts`, the same pause): restarted at its old
        address while its peers still move its hash ranges away (after `dscli stop`), the worker
        kills itself ("passive scale down ... Restart", exit -9); one CI run met it."""
        attempts = plan.cfg.yuanrong.start_attempts
        pending = {node: self._spawn(plan, node) for node in nodes}
        attempt = 1
        while pending:
            killed = []
            for node, p in pending.items():
                try:
                    rc = p.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    rc = "timeout"
                if rc == 0:
                    continue
                log = (self.cwd(node) / "dscli-start.log").read_text(errors="replace")
                if attempt < attempts and re.search(r"Worker exited with code -[0-9]", log):
                    killed.append(node)
                    continue
                raise RuntimeError(f"dscli start for {node} failed ({rc}, attempt {attempt} of {attempts}):\n"
                                   f"{log[-2000:]}")
            if killed:
                time.sleep(WORKER_RETRY_PAUSE_S)
            pending = {node: self._spawn(plan, node) for node in killed}
            attempt += 1

    def stop(self, address: str, bound: float = 30) -> None:
        cwd = self.started.pop(address, None)
        if cwd is None:
            return
        if worker_pids(address):
            try:
                subprocess.run([DSCLI, "stop", "--worker_address", address], cwd=cwd, env=self._env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=bound)
            except subprocess.TimeoutExpired:
                pass
        for pid in worker_pids(address):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop_all(self) -> None:
        """All workers at once: each `dscli stop` takes seconds."""
        threads = [threading.Thread(target=self.stop, args=(a,)) for a in list(self.started)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if not self.started:
            shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Unreachable endpoints


def _bound(address: str, port: int, patience: float = 10.0) -> socket.socket:
    """A socket bound to address:port, waiting out a just-killed server's lingering sockets."""
    deadline = time.monotonic() + patience
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Blackhole:
    """A listening socket whose accept queue is full: a connect to it gets no SYN-ACK and times out,
    like a node behind a firewall that drops packets (no iptables needed)."""

    def __init__(self, address: str, port: int):
        self.sock = _bound(address, port)
        self.sock.listen(0)
        self.fill = []
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect((address, port))
            except BlockingIOError:
                pass
            self.fill.append(c)
        time.sleep(0.05)

    def close(self) -> None:
        for c in self.fill:
            c.close()
        self.sock.close()


class Silent:
    """Accepts connections and never answers (a hung server)."""

    def __init__(self, address: str, port: int):
        self.sock = _bound(address, port)
        self.sock.listen(64)

    def close(self) -> None:
        self.sock.close()
