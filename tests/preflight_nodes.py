"""Fake Ascend nodes behind real sshd (Debian openssh-server) on loopback, for doctor and the gate.

Each node of a stack gets its own sshd on its own 127.0.0.x address, started in its own mount
namespace (run the tests as root inside `unshare --net --pid --fork --mount-proc`, as the README
says) where:

* `/usr/local` is an overlay whose upper layer adds the fake vendor tools of tests/fakes/preflight_bin
  (`/usr/local/bin/npu-smi`, `ss`, `docker`, ... are ahead of /usr/bin on sshd's default PATH;
  `hccn_tool` in `/usr/local/Ascend/driver/tools/` as on a real node), the driver and CANN version
  files, and `/usr/local/ascend-pd-fake` bound to the node's own directory (scenario, weights);
* `/etc` is an overlay adding `/etc/hccn.conf` (a symlink into that directory, so a test can
  delete or rewrite it);
* `/proc/meminfo` and the kernel's ephemeral port range and reserved ports (`/proc/sys/net/ipv4/
  ip_local_port_range`, `ip_local_reserved_ports`) are bound to files of that directory;
* `/run` is a private tmpfs (sshd's privilege separation directory), so nothing outside changes.

A test changes a node by rewriting its scenario file or its files (`FakeNode.set`, `.write`);
`reset()` puts every node back to an all-pass state. Keys are throw-away, made per session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ascend_pd.loader import PROJECT_DIR, load_stack
from ascend_pd.plan import Plan, build_plan
from ascend_pd.ssh import Target, ssh_targets

FAKES = Path(__file__).parent / "fakes" / "preflight_bin"
SSH_PORT = 2222
SSHD = "/usr/sbin/sshd"
FAKE_ROOT = "/usr/local/ascend-pd-fake"
MODEL_PATH = f"{FAKE_ROOT}/weights/model"
GIB_KIB = 1024 * 1024
TOOLS = ("npu-smi", "getconf", "timedatectl", "date", "ss", "docker", "curl", "df", "nft")


def usable() -> Optional[str]:
    """Why these tests cannot run here, or None."""
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        return "needs openssh-server and openssh-client (setup.sh installs them)"
    if os.geteuid() != 0:
        return "needs root in a private namespace (unshare --net --pid --fork --mount-proc)"
    if any(name != "lo" for _, name in socket.if_nameindex()):
        # sshd on 127.0.0.x of the machine's own network would be reachable by everything on it.
        return "runs only in a private network namespace (unshare --net --pid --fork --mount-proc)"
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        return "cannot create mount namespaces here"
    return None


def npu_ip(index: int, dev: int) -> str:
    return f"10.20.{index}.{dev + 1}"


def vnic_ip(index: int, dev: int) -> str:
    return f"10.30.{index}.{dev + 1}"


def meminfo(total_gib: int, available_gib: int, hugepages_total: int = 0, page_kib: int = 2048) -> str:
    return (f"MemTotal:       {total_gib * GIB_KIB} kB\nMemFree:        {available_gib * GIB_KIB} kB\n"
            f"MemAvailable:   {available_gib * GIB_KIB} kB\nHugePages_Total:   {hugepages_total}\n"
            f"HugePages_Free:    {hugepages_total}\nHugepagesize:       {page_kib} kB\n")


@dataclass
class FakeNode:
    name: str
    index: int
    address: str
    root: Path  # the node's directory (bound to FAKE_ROOT on the node)
    npus: int
    hardware: str
    proc: Optional[subprocess.Popen] = None

    @property
    def fake(self) -> Path:
        return self.root / "fake"

    def scenario(self) -> dict[str, str]:
        text = (self.fake / "scenario").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def set(self, **values: str) -> None:
        """Scenario keys; the dots of the tools' keys are written as `__` (link__3 -> link.3)."""
        s = self.scenario()
        s.update({k.replace("__", "."): str(v) for k, v in values.items()})
        (self.fake / "scenario").write_text("".join(f"{k}={v}\n" for k, v in s.items()))

    def write(self, rel: str, text: str) -> None:
        path = self.fake / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:  # in place: /proc/meminfo is bound to this very inode
            f.write(text)

    def reset(self) -> None:
        hw = "a3" if self.hardware == "atlas-800-a3" else "a2"
        # Deployed-like, as the fake docker's container runs: ascend-pd's table loaded (firewall.table's default).
        lines = [f"hardware={hw}", "driver=25.5.0", "synchronized=yes", "nft_tables=inet:filter inet:ascend_pd",
                 "nft_dropped=3"]
        lines += [f"ip.{d}={npu_ip(self.index, d)}" for d in range(self.npus)]
        lines += [f"vnic.{d}={vnic_ip(self.index, d)}" for d in range(self.npus)] if hw == "a3" else []
        (self.fake / "scenario").write_text("\n".join(lines) + "\n")
        self.write("hccn.conf", "".join(f"address_{d}={npu_ip(self.index, d)}\nnetmask_{d}=255.255.255.0\n"
                                        for d in range(self.npus)))
        self.write("version.info", "Version=25.5.0\nascendhal_version=7.35.23\n")
        self.write("ascend_toolkit_install.info", "package_name=Ascend-cann-toolkit\nversion=8.5.0\narch=aarch64\n")
        self.write("meminfo", meminfo(1536, 1200))
        self.write("ip_local_port_range", "32768\t60999\n")  # Linux's default ephemeral range
        self.write("ip_local_reserved_ports", "\n")
        weights = self.fake / "weights" / "model"
        if weights.exists():
            shutil.rmtree(weights)
        weights.mkdir(parents=True)
        for i in range(1, 4):
            (weights / f"model-0000{i}-of-00003.safetensors").write_bytes(b"w" * (1000 + i))
        (weights / "config.json").write_text('{"model_type": "deepseek_v4"}\n')


class FakeCluster:
    """Every node of `stack` as a fake node behind its own sshd; `stop(node)` makes one unreachable."""

    def __init__(self, stack: str, tmp: Path, first: int = 11):
        self.stack, self.tmp = stack, tmp
        # More mounts in each node's namespace, `{fake}` for the node's directory (test_logs.py binds it
        # where the stack's stateDir is).
        self.extra_setup = ""
        tmp.mkdir(parents=True, exist_ok=True)
        self.key = tmp / "id_ed25519"
        self.host_key = tmp / "host_ed25519"
        for k in (self.key, self.host_key):
            if not k.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
        (tmp / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
        os.chmod(tmp / "authorized_keys", 0o600)
        self.project = tmp / "project"
        self.project.mkdir(exist_ok=True)
        shutil.copy(PROJECT_DIR / "Pulumi.yaml", self.project / "Pulumi.yaml")
        doc = yaml.safe_load((PROJECT_DIR / f"Pulumi.{stack}.yaml").read_text())
        cfg = doc["config"]
        host_pub = " ".join((tmp / "host_ed25519.pub").read_text().split()[:2])
        nodes = cfg["ascend-pd:nodes"]
        for i, n in enumerate(nodes):
            n["address"] = f"127.0.0.{first + i}"
        cfg["ascend-pd:ssh"] = {"user": "root", "port": SSH_PORT, "hostKeys": {n["name"]: host_pub for n in nodes}}
        # Loopback timing on a loaded machine jitters by hundreds of ms; the skew test injects a minute.
        cfg["ascend-pd:preflight"] = {"maxClockSkewMs": 5000}
        cfg["ascend-pd:model"] = {**cfg["ascend-pd:model"], "path": MODEL_PATH}
        (self.project / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc))
        self.plan: Plan = build_plan(load_stack(stack, self.project), stack)
        self.nodes = {n.name: FakeNode(n.name, i, n.address, tmp / "nodes" / n.name, n.npus, self.plan.cfg.hardware)
                      for i, n in enumerate(self.plan.nodes)}
        for node in self.nodes.values():
            self._layout(node)
            node.reset()

    def targets(self, **kw) -> dict[str, Target]:
        return ssh_targets(self.plan, identity_file=str(self.key), **kw)

    def _layout(self, node: FakeNode) -> None:
        r = node.root
        for d in ("etc-up", "etc-work", "local-up/bin", "local-up/Ascend/driver/tools",
                  "local-up/Ascend/ascend-toolkit/latest/aarch64-linux", "local-up/ascend-pd-fake", "local-work",
                  "fake"):
            (r / d).mkdir(parents=True, exist_ok=True)

        def link(rel: str, target: Path) -> None:
            p = r / rel
            if p.is_symlink() or p.exists():
                p.unlink()
            p.symlink_to(target)

        for tool in TOOLS + ("_scenario.sh",):
            link(f"local-up/bin/{tool}", FAKES / tool)
        link("local-up/Ascend/driver/tools/hccn_tool", FAKES / "hccn_tool")
        link("local-up/Ascend/driver/tools/_scenario.sh", FAKES / "_scenario.sh")
        link("local-up/Ascend/driver/version.info", node.fake / "version.info")
        link("local-up/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
             node.fake / "ascend_toolkit_install.info")
        link("etc-up/hccn.conf", node.fake / "hccn.conf")
        (r / "sshd_config").write_text(
            f"ListenAddress {node.address}:{SSH_PORT}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PidFile none\nLogLevel ERROR\nMaxStartups 100\nMaxSessions 100\nUseDNS no\n")

    def start(self, name: str) -> None:
        node = self.nodes[name]
        r = node.root
        setup = (
            "set -e\n"
            f"mount -t overlay overlay -o lowerdir=/usr/local,upperdir={r}/local-up,workdir={r}/local-work /usr/local\n"
            f"mount --bind {node.fake} {FAKE_ROOT}\n"
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={r}/etc-up,workdir={r}/etc-work /etc\n"
            f"mount --bind {node.fake}/meminfo /proc/meminfo\n"
            f"mount --bind {node.fake}/ip_local_port_range /proc/sys/net/ipv4/ip_local_port_range\n"
            f"mount --bind {node.fake}/ip_local_reserved_ports /proc/sys/net/ipv4/ip_local_reserved_ports\n"
            "mount -t tmpfs tmpfs /run\nmkdir -p /run/sshd\n"
            + self.extra_setup.format(fake=node.fake) +
            f"exec {SSHD} -D -e -f {r}/sshd_config\n"
        )
        node.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", setup],
                                     stdout=subprocess.DEVNULL, stderr=open(r / "sshd.log", "ab"),
                                     start_new_session=True)

    def start_all(self) -> None:
        for name in self.nodes:
            self.start(name)
        self.wait_ready(self.nodes)

    def wait_ready(self, names) -> None:
        deadline = time.monotonic() + 30
        waiting = set(names)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                try:
                    with socket.create_connection((self.nodes[name].address, SSH_PORT), timeout=0.5):
                        waiting.discard(name)
                except OSError:
                    pass
            time.sleep(0.05)
        if waiting:
            logs = {n: (self.nodes[n].root / "sshd.log").read_text()[-500:] for n in waiting}
            raise RuntimeError(f"sshd did not start on {sorted(waiting)}: {logs}")

    def stop(self, name: str) -> None:
        proc = self.nodes[name].proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        self.nodes[name].proc = None

    def stop_all(self) -> None:
        for name in self.nodes:
            self.stop(name)

    def reset(self) -> None:
        for node in self.nodes.values():
            node.reset()


class SilentListener:
    """A TCP port that accepts and never speaks: a node whose sshd hangs (ssh waits for the banner)."""

    def __init__(self, address: str, port: int = SSH_PORT):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(16)

    def close(self) -> None:
        self.sock.close()


__all__ = ["FakeCluster", "FakeNode", "SilentListener", "usable", "npu_ip", "vnic_ip", "meminfo", "MODEL_PATH"]


def measure(stack: str = "a2-8node", repeat: int = 3) -> None:
    """Wall time of doctor over loopback sshd: all checks, then one node hung at the SSH banner,
    then one node refusing connections. Run as root in a private namespace:
    unshare --net --pid --fork --mount-proc bash -c \
      'ip link set lo up && PYTHONPATH=. exec venv/bin/python tests/preflight_nodes.py'"""
    import tempfile

    from ascend_pd.doctor import run_doctor

    with tempfile.TemporaryDirectory(prefix="apd-preflight-measure-") as tmp:
        c = FakeCluster(stack, Path(tmp))
        c.start_all()
        try:
            def timed(label: str) -> None:
                for _ in range(repeat):
                    start = time.monotonic()
                    report = run_doctor(c.plan, c.targets(), timeout_s=60)
                    bad = sorted({(n, k) for n, ks in report.rows.items() for k, r in ks.items() if r.status == "fail"})
                    print(f"{label}: {time.monotonic() - start:.2f} s, failures {bad}", flush=True)

            timed(f"{stack} all checks")
            victim = list(c.nodes)[-3]
            c.stop(victim)
            hung = SilentListener(c.nodes[victim].address)
            try:
                timed(f"{stack} {victim} hung at the SSH banner")
            finally:
                hung.close()
            timed(f"{stack} {victim} refusing connections")
        finally:
            c.stop_all()


if __name__ == "__main__":
    import sys

    measure(*sys.argv[1:2])
