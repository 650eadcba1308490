"""A simulated cluster of any size for the scale benchmark's day-2 commands (tools/scale_bench.py):
every node of a generated stack answers SSH and every rank, worker, etcd and the proxy answers HTTP
as a healthy cluster does, on loopback, inside the benchmark's own network and mount namespaces.

- SSH: one real sshd (Debian openssh-server, a throw-away host and client key) listening on
  0.0.0.0:22 of the namespace, so it answers on every node address (127.1.x.y is loopback). Every
  session reads the script the command sends and answers at once with the reply of a node whose
  container is down (`ForceCommand`): a real node runs its script on its own CPU, beside the others,
  while here 256 nodes' scripts would share the benchmark's 2 cores (a first version ran them: the
  figures were the simulated nodes' work, not the command's). What is measured is the command's own
  cost: the sessions (a real handshake each), the `--parallel` gate, the deadline, the parsing.
- HTTP: the suite's loopback fakes (tests/status_support/hostile.py), one listening socket per
  distinct port on 0.0.0.0 (a few dozen for 1,280 ranks), answering as in tests/test_status_robust.py:
  /health, /v1/models, /metrics of every rank; etcd's gateway with every worker registered; the
  proxy's /healthcheck. Worker ports accept and close, as status only connects to them.

Not a test: the benchmark starts it (`SimCluster`), or `python -m tools.sim_cluster http --nodes N`
serves the HTTP side alone (what SimCluster runs in a process of its own).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


def in_namespace() -> bool:
    """True inside the benchmark's namespaces (set by `reexec_in_namespace`)."""
    return os.environ.get("APD_BENCH_NS") == "1"


def reexec_in_namespace(argv: list[str]) -> int:
    """Run `python -m <argv>` again in a new network and mount namespace: loopback up, /run private."""
    if os.geteuid() != 0:
        raise SystemExit("the simulated cluster needs root (network and mount namespaces, sshd on port 22)")
    setup = ("ip link set lo up && mount -t tmpfs tmpfs /run && mkdir -p /run/sshd && "
             "echo '40000 60999' > /proc/sys/net/ipv4/ip_local_port_range && exec \"$@\"")
    return subprocess.call(["unshare", "--net", "--mount", "--fork", "bash", "-c", setup, "_", sys.executable, "-m",
                            *argv], cwd=ROOT, env={**os.environ, "APD_BENCH_NS": "1"})


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")


class SimCluster:
    """sshd for every node address; `http(nodes)` serves the HTTP side of an N-node stack."""

    def __init__(self):
        if not in_namespace():
            raise RuntimeError("SimCluster runs inside the benchmark's namespaces (reexec_in_namespace)")
        self.dir = Path(tempfile.mkdtemp(prefix="apd-sim-"))
        self.identity = self.dir / "id_ed25519"
        host = self.dir / "host_ed25519"
        for key in (self.identity, host):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        self.host_key = " ".join((host.with_suffix(".pub")).read_text().split()[:2])
        (self.dir / "authorized_keys").write_text(self.identity.with_suffix(".pub").read_text())
        (self.dir / "sshd_config").write_text(
            f"Port 22\nListenAddress 0.0.0.0\nHostKey {host}\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nPidFile none\nLogLevel ERROR\n"
            # One sshd stands in for every node: a real cluster spreads the sessions over N of them.
            "MaxStartups 1024\nMaxSessions 1024\n"
            f"ForceCommand {self.dir}/node.sh\n")
        (self.dir / "node.sh").write_text("#!/bin/sh\ncat >/dev/null\necho '@@apd hello'\n")
        (self.dir / "node.sh").chmod(0o755)
        self.server: subprocess.Popen | None = None
        self.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "sshd.log", "ab"))
        try:
            _wait_port(22)
        except RuntimeError:
            self.close()  # nothing left behind: sshd, keys
            raise

    def http(self, nodes: int) -> None:
        """(Re)start the HTTP side for the generated N-node stack."""
        self._stop_http()
        self.server = subprocess.Popen([sys.executable, "-m", "tools.sim_cluster", "http", "--nodes", str(nodes)],
                                       cwd=ROOT, stdout=subprocess.PIPE, text=True)
        ready = self.server.stdout.readline()
        if not ready.startswith("serving"):
            raise RuntimeError(f"the simulated cluster's HTTP side did not start: {ready!r}")

    def _stop_http(self) -> None:
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            self.server.wait(timeout=30)
            self.server = None

    def close(self) -> None:
        self._stop_http()
        self.sshd.kill()
        self.sshd.wait()
        shutil.rmtree(self.dir, ignore_errors=True)  # the throw-away keys go with it


def serve_http(nodes: int) -> None:
    """Serve every HTTP endpoint of the generated N-node stack as a healthy cluster, until SIGTERM."""
    sys.path.insert(0, str(ROOT / "tests"))
    from status_support.hostile import Hostile, Routes, accept_only, etcd_answers, respond

    from ascend_pd.change.compare import plan_of
    from tools.scale_bench import STACK, generated

    plan = plan_of(STACK, generated(nodes))
    worker_ports = {int(w.address.rsplit(":", 1)[1]) for w in plan.workers}
    kinds = {plan.etcd.client_port: "etcd", plan.proxy.port: "proxy"}
    routes = {("etcd", path): answer for path, answer in etcd_answers([w.address for w in plan.workers]).items()}

    def metrics(req, conn, stop):
        respond(conn, (b'vllm:num_requests_running{engine="0"} 0\n'
                       b'vllm:generation_tokens_total{engine="0"} 5\n'
                       b'vllm:request_success_total{engine="0",finished_reason="stop"} 2\n'), ctype="text/plain")

    routes.update({
        ("rank", "/health"): b"",
        ("rank", "/v1/models"): {"object": "list", "data": [{"id": plan.cfg.model.served_name, "object": "model"}]},
        ("rank", "/metrics"): metrics,
        ("proxy", "/healthcheck"): {"status": "ok", "prefill_instances": len(plan.proxy.prefillers),
                                    "decode_instances": len(plan.proxy.decoders)},
    })
    http_ports = sorted({r.port for r in plan.ranks} | set(kinds))
    servers = [Hostile([("0.0.0.0", p) for p in http_ports], Routes(kinds, routes)),
               Hostile([("0.0.0.0", p) for p in sorted(worker_ports)], accept_only())]
    done = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))
    print(f"serving {len(http_ports)} HTTP ports and {len(worker_ports)} worker port(s) for {nodes} nodes", flush=True)
    while not done:
        time.sleep(0.2)
    for s in servers:
        s.close()


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its children it has reaped (/proc/PID/stat utime..cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def ssh_cost(sessions: int, extra: list[str]) -> None:
    """Where one session's CPU goes: the command's side (the `ssh` processes, with the program's own
    argv, ascend_pd.ssh.Target) and the node's side (sshd and what it starts), one session at a time
    and `DEFAULT_PARALLEL` at once. On a real cluster the node's side runs on that node."""
    import resource
    from concurrent.futures import ThreadPoolExecutor

    from ascend_pd.ssh import DEFAULT_PARALLEL, Target

    sim = SimCluster()
    try:
        known = sim.dir / "known_hosts"
        addresses = [f"127.1.{i // 250}.{1 + i % 250}" for i in range(sessions)]
        known.write_text("".join(f"{a} {sim.host_key}\n" for a in addresses))

        def one(address: str) -> None:
            argv = Target(address, address, "root", 22, str(sim.identity), str(known), 10.0).argv()
            argv[1:1] = extra  # options go before the "--" that ends them
            r = subprocess.run(argv, input="echo hi\n", capture_output=True, text=True, timeout=120)
            if "@@apd hello" not in r.stdout:
                raise RuntimeError(f"ssh {address}: rc {r.returncode}: {r.stderr.strip()[:300]}")

        print(f"ssh {' '.join(extra) or '(default options)'}: {subprocess.run(['ssh', '-V'], capture_output=True, text=True).stderr.strip()}")
        for label, width in (("one at a time", 1), (f"{DEFAULT_PARALLEL} at once", DEFAULT_PARALLEL)):
            mine0, node0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_s(sim.sshd.pid), time.monotonic()
            with ThreadPoolExecutor(width) as pool:
                list(pool.map(one, addresses))
            wall, mine1, node1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_s(sim.sshd.pid)
            mine = (mine1.ru_utime + mine1.ru_stime) - (mine0.ru_utime + mine0.ru_stime)
            print(f"{label:>14}: {sessions} sessions in {wall:.1f} s; CPU per session: the command's side "
                  f"{mine / sessions * 1000:.0f} ms, the node's side {(node1 - node0) / sessions * 1000:.0f} ms", flush=True)
    finally:
        sim.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sim_cluster")
    sub = ap.add_subparsers(dest="command", required=True)
    h = sub.add_parser("http", help="serve the HTTP side of the generated N-node stack (inside the namespaces)")
    h.add_argument("--nodes", type=int, required=True)
    c = sub.add_parser("ssh-cost", help="CPU per ssh session, the command's side and the node's (needs root)")
    c.add_argument("--sessions", type=int, default=64)
    c.add_argument("ssh_options", nargs="*", help="extra ssh options after --, e.g. -- -o KexAlgorithms=...")
    args = ap.parse_args(argv)
    if args.command == "http":
        serve_http(args.nodes)
    elif not in_namespace():
        return reexec_in_namespace(["tools.sim_cluster", *(argv if argv is not None else sys.argv[1:])])
    else:
        ssh_cost(args.sessions, args.ssh_options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
