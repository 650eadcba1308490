"""Real nodes on one machine: each simulated server is a network, mount, PID and UTS namespace with
its own address, root filesystem, sshd and dockerd (tests/realengine/node_init.sh), on a bridge
that also carries a loopback-style registry (Debian's `docker-registry`) the nodes pull from.

What a node looks like from outside is what a real Ascend server looks like to the Pulumi
program: SSH on port 22 as root with a pinned ed25519 host key, `docker` over `ssh://`, the NPU
driver's device nodes and mount paths, `npu-smi`, and `vm.nr_hugepages`/`/proc/meminfo` that
belong to that node alone.

Addresses are 198.18.<net>.0/24 (RFC 2544's benchmarking range, never routed): the bridge (and the
registry) is .1, node i is .(10+i). The bridge lives in the caller's network namespace;
tests/run starts the suite in a namespace of its own, so nothing here touches the host's network.

Everything started is stopped by PID at `close()`: killing a node's PID 1 ends every process of
the node (the containers' too, which live in nested PID namespaces), its mounts go with its
mount namespace, its veth with its network namespace. `close()` runs from a `finally`, and a
process that dies without it leaves nodes that the next Fleet in the same directory finds and
kills by their pid files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
NODE_INIT = HERE / "node_init.sh"
FAKE_TOOLS = HERE.parent / "fakes" / "preflight_bin"
REGISTRY_BINARY = "/usr/bin/docker-registry"
REGISTRY_PORT = 5000
NODE_READY_TIMEOUT_S = 60

# The tools a fleet needs on this machine (Debian packages in parentheses, installed by setup.sh).
TOOLS = {
    "unshare": "util-linux", "nsenter": "util-linux", "ip": "iproute2", "sshd": "openssh-server",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "dockerd": "docker.io", "runc": "runc",
    "jq": "jq", "docker-registry": "docker-registry",
}


def missing_tools() -> list[str]:
    """The tools (with their Debian package) this machine lacks for a fleet."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [f"{t} ({p})" for t, p in TOOLS.items() if shutil.which(t, path=path) is None]


def can_run() -> Optional[str]:
    """None when fleets can run here, else why not (one line)."""
    if os.geteuid() != 0:
        return "real nodes need root (network, mount and PID namespaces, dockerd)"
    missing = missing_tools()
    if missing:
        return f"missing: {', '.join(missing)}; run setup.sh"
    return None


def _run(argv: list[str], *, timeout: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclass
class Node:
    name: str
    index: int
    address: str
    dir: Path
    npus: int
    launcher: Optional[subprocess.Popen] = None  # `unshare`, whose only child is the node's PID 1
    pid: int = 0  # the node's PID 1, as this machine sees it
    host_key: str = ""  # "ssh-ed25519 AAAA..." (no comment)
    extra_addresses: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        """The node's filesystem as its processes see it (through /proc, from outside)."""
        return Path(f"/proc/{self.pid}/root")

    def nsenter(self, *argv: str, timeout: float = 60, check: bool = True, input: Optional[str] = None
                ) -> subprocess.CompletedProcess:
        """Run a command on the node (its namespaces and root), as a console session would."""
        return _run(["nsenter", "-t", str(self.pid), "-a", "--root", "--wd=/", "env",
                     "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", *argv],
                    timeout=timeout, check=check, input=input)

    def sh(self, script: str, *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return self.nsenter("bash", "-c", script, timeout=timeout, check=check)

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return self.nsenter("docker", *args, timeout=timeout, check=check)

    def alive(self) -> bool:
        return self.pid > 0 and Path(f"/proc/{self.pid}").exists()


class Fleet:
    """N nodes and a registry; use as a context manager (or call close())."""

    def __init__(self, names: list[str], workdir: Path, *, npus: int = 8, net: Optional[int] = None) -> None:
        why = can_run()
        if why:
            raise RuntimeError(why)
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        # One /24 per fleet, picked from the process id so that two fleets in one namespace differ.
        self.net = net if net is not None else 16 + os.getpid() % 200
        self.prefix = f"198.18.{self.net}."
        self.bridge = f"apdbr{self.net}"
        self.gateway = self.prefix + "1"
        self.registry = f"{self.gateway}:{REGISTRY_PORT}"
        self.key = workdir / "id_ed25519"
        self.registry_proc: Optional[subprocess.Popen] = None
        self.nodes: dict[str, Node] = {}
        self._kill_leftovers()
        if not self.key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ascend-pd-test", "-f", str(self.key)])
        self.known_hosts = workdir / "known_hosts"
        self.ssh_config = workdir / "ssh_config"
        t0 = time.monotonic()
        try:
            self._bridge_up()
            with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
                nodes = list(pool.map(lambda a: self._start(*a, npus=npus), enumerate(names)))
            self.nodes = {n.name: n for n in nodes}
            self._write_ssh_files()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _bridge_up(self) -> None:
        _run(["ip", "link", "set", "lo", "up"])
        _run(["ip", "link", "del", self.bridge], check=False)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def start_registry(self, storage: Path) -> str:
        """Debian's registry on the bridge, its blobs in `storage` (kept between runs: an image
        pushed once is pulled by every later fleet without pushing it again)."""
        storage.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "registry.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"addr": self.registry},
        }))
        log = open(self.workdir / "registry.log", "ab")
        self.registry_proc = subprocess.Popen([REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=log,
                                              start_new_session=True)
        (self.workdir / "registry.pid").write_text(str(self.registry_proc.pid))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.registry}/v2/", timeout=2):
                    return self.registry
            except OSError:
                if self.registry_proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError(f"registry on {self.registry} did not start: {(self.workdir / 'registry.log').read_text()[-2000:]}")

    def has_image(self, ref: str) -> bool:
        """Whether the registry serves `ref` (REGISTRY/NAME:TAG)."""
        name, tag = ref[len(self.registry) + 1:].rsplit(":", 1)
        req = urllib.request.Request(f"http://{self.registry}/v2/{name}/manifests/{tag}", method="HEAD", headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def push_image(self, tarball: Path, changes: list[str], ref: str, via: Optional[str] = None) -> float:
        """`docker import` the rootfs on one node and push it to the registry; seconds taken."""
        t0 = time.monotonic()
        node = self.nodes[via or next(iter(self.nodes))]
        argv = ["nsenter", "-t", str(node.pid), "-a", "--root", "--wd=/", "docker", "import"]
        for c in changes:
            argv += ["--change", c]
        with open(tarball, "rb") as f:
            proc = subprocess.run([*argv, "-", ref], stdin=f, capture_output=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"docker import on {node.name} failed: {proc.stderr.decode()[-2000:]}")
        node.docker("push", ref, timeout=900)
        # The importing node must pull it like every other node: the image is not left behind.
        node.docker("image", "rm", ref, timeout=120)
        return time.monotonic() - t0

    def _start(self, index: int, name: str, *, npus: int) -> Node:
        d = self.workdir / "nodes" / name
        d.mkdir(parents=True, exist_ok=True)
        node = Node(name=name, index=index, address=self.prefix + str(10 + index), dir=d, npus=npus)
        env = {**os.environ, "NODE_DIR": str(d), "NODE_NAME": name, "NODE_NPUS": str(npus),
               "NODE_REGISTRY": self.registry, "NODE_PUBKEY": str(self.key) + ".pub", "NODE_FAKES": str(FAKE_TOOLS)}
        log = open(d / "init.log", "ab")
        node.launcher = subprocess.Popen(
            ["unshare", "--net", "--mount", "--pid", "--uts", "--fork", "--kill-child", "bash", str(NODE_INIT)],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        node.pid = self._child_of(node.launcher.pid)
        (d / "pid").write_text(str(node.pid))
        host, peer = f"apd{self.net}v{index}", "eth0"
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", str(node.pid)])
        _run(["ip", "link", "set", host, "master", self.bridge, "up"])
        netns = ["nsenter", "-t", str(node.pid), "-n"]
        _run([*netns, "ip", "addr", "add", f"{node.address}/24", "dev", peer])
        _run([*netns, "ip", "link", "set", peer, "up"])
        _run([*netns, "ip", "route", "add", "default", "via", self.gateway])
        # The plans bind fixed ports up to 36231 (a3's Mooncake side channels): outgoing connections
        # take ephemeral ports above them, as the preflight tells operators to arrange.
        _run([*netns, "sh", "-c", "echo '40000 60999' > /proc/sys/net/ipv4/ip_local_port_range"])
        self._wait_ready(node)
        key = (node.root / "opt/apd-node/ssh/host_ed25519.pub").read_text().split()
        node.host_key = f"{key[0]} {key[1]}"
        return node

    @staticmethod
    def _child_of(pid: int, timeout: float = 10) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.02)
        raise RuntimeError(f"unshare ({pid}) started no node process")

    def _wait_ready(self, node: Node) -> None:
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"node {node.name} died while starting:\n{(node.dir / 'init.log').read_text()[-3000:]}")
            ssh_up = docker_up = False
            try:
                with socket.create_connection((node.address, 22), timeout=1) as s:
                    ssh_up = s.recv(64).startswith(b"SSH-")
            except OSError:
                pass
            if ssh_up:
                docker_up = node.nsenter("docker", "info", "--format", "{{.ServerVersion}}", check=False,
                                         timeout=20).returncode == 0
            if ssh_up and docker_up:
                return
            time.sleep(0.3)
        raise RuntimeError(f"node {node.name} not ready in {NODE_READY_TIMEOUT_S}s: "
                           f"{(node.dir / 'init.log').read_text()[-2000:]}")

    def _write_ssh_files(self) -> None:
        """known_hosts for every address of every node, and an ssh config: what an operator's
        ~/.ssh holds for the local `ssh` that pulumi-docker runs."""
        lines = []
        for n in self.nodes.values():
            for a in [n.address, *n.extra_addresses]:
                lines.append(f"{a} {n.host_key}")
        self.known_hosts.write_text("\n".join(lines) + "\n")
        self.ssh_config.write_text(
            f"Host *\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n")

    def add_address(self, name: str, address: str) -> None:
        """Give a node a second address (the same machine, readdressed): the one it now connects from
        too, as after a real readdress (the peers' firewalls let in the new address only). The old one
        still answers, so the tools that reach the node by it keep working."""
        node = self.nodes[name]
        ns = ["nsenter", "-t", str(node.pid), "-n"]
        _run([*ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0"])
        _run([*ns, "ip", "route", "replace", f"{self.prefix}0/24", "dev", "eth0", "proto", "kernel", "scope", "link",
              "src", address])
        node.extra_addresses.append(address)
        self._write_ssh_files()

    def address(self, index: int) -> str:
        return self.prefix + str(10 + index)

    def stranger(self) -> "Stranger":
        """A machine on the nodes' network that is not in the stack (not a node, not an operator): a
        network namespace of its own on the bridge, at .250. Close it when done."""
        proc = subprocess.Popen(["unshare", "--net", "--fork", "--kill-child", "sleep", "infinity"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        pid = self._child_of(proc.pid)
        stranger = Stranger(self.prefix + "250", pid, proc)
        host = f"apd{self.net}vs"
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", str(pid)])
        _run(["ip", "link", "set", host, "master", self.bridge, "up"])
        for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{stranger.address}/24", "dev", "eth0"],
                     ["ip", "link", "set", "eth0", "up"], ["ip", "route", "add", "default", "via", self.gateway]):
            stranger.run(*argv)
        return stranger

    def power_off(self, name: str) -> None:
        """The machine gone for good: its PID 1 killed, and with it every process, mount and its veth;
        its address answers nothing any more (a connect finds no route)."""
        node = self.nodes[name]
        self._kill(node.pid)
        if node.launcher:
            node.launcher.wait(timeout=20)
        # Its processes die after its PID 1, and its network namespace (address, sshd's socket) with
        # the last of them: until then a connect is refused, which `forget-node` rightly takes for a
        # machine that is up. Gone = a connect finds no route or no answer.
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((node.address, 22), timeout=1).close()
            except ConnectionRefusedError:
                pass
            except OSError:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} ({node.address}) still answers on port 22 60 s after its power-off")
            time.sleep(0.5)

    def close(self) -> None:
        for node in self.nodes.values():
            self._kill(node.pid)
            if node.launcher:
                try:
                    node.launcher.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    node.launcher.kill()
        if self.registry_proc and self.registry_proc.poll() is None:
            self.registry_proc.terminate()
            try:
                self.registry_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.registry_proc.kill()
        _run(["ip", "link", "del", self.bridge], check=False)
        self._remove_node_dirs()

    def _remove_node_dirs(self) -> None:
        nodes = self.workdir / "nodes"
        if nodes.exists():
            # docker's layers hold files only root may delete but nothing is mounted any more.
            shutil.rmtree(nodes, ignore_errors=True)

    @staticmethod
    def _kill(pid: int) -> None:
        if pid <= 0:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _kill_leftovers(self) -> None:
        """Nodes and a registry left by a process that died without close()."""
        for f in [*(self.workdir / "nodes").glob("*/pid"), self.workdir / "registry.pid"]:
            try:
                pid = int(f.read_text())
            except (OSError, ValueError):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"apd-node" in cmdline or b"docker-registry" in cmdline:
                self._kill(pid)
        self._remove_node_dirs()


@dataclass
class Stranger:
    """A machine on the bridge outside the cluster (Fleet.stranger)."""

    address: str
    pid: int
    proc: subprocess.Popen

    def run(self, *argv: str, timeout: float = 120, check: bool = True, input: Optional[str] = None
            ) -> subprocess.CompletedProcess:
        """A command in the stranger's network namespace (this machine's filesystem and tools)."""
        return _run(["nsenter", "-t", str(self.pid), "-n", *argv], timeout=timeout, check=check, input=input)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
