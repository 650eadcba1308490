"""`ascend-pd doctor --stack S --print-host-keys`: the SSH host key every node presents now, as the
`ssh.hostKeys` block to pin and the `known_hosts` lines pulumi-docker's `ssh` checks, each with its
fingerprint, for the operator to compare with the node itself before trusting it (a scan is exactly
what an attacker in the path would answer: it proves nothing by itself).

ssh-keyscan asks for ed25519 first: pulumi-command verifies a pinned key with the algorithm it
names, and a pinned RSA key offers only `ssh-rsa`, which OpenSSH 8.8 and later refuse.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from .plan import Plan
from .ssh import known_hosts_line

KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256")  # in order of preference; RSA left out (above)


@dataclass(frozen=True)
class Scanned:
    node: str
    address: str
    key: Optional[str]  # "ssh-ed25519 AAAA..."
    fingerprint: str = ""
    error: str = ""


def _fingerprint(key: str) -> str:
    r = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=key + "\n", capture_output=True, text=True, timeout=10)
    return r.stdout.split()[1] if r.returncode == 0 and r.stdout.split() else "?"


def scan(node: str, address: str, port: int, timeout_s: float) -> Scanned:
    try:
        r = subprocess.run(["ssh-keyscan", "-T", str(max(1, int(timeout_s))), "-p", str(port), "-t",
                            "ed25519,ecdsa", address], capture_output=True, text=True, timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        return Scanned(node, address, None, error=f"no answer within {timeout_s:.0f}s")
    found = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            found[parts[1]] = f"{parts[1]} {parts[2]}"
    key = next((found[t] for t in KEY_TYPES if t in found), None)
    if key is None:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no ed25519 or ecdsa host key offered"
        return Scanned(node, address, None, error=why)
    return Scanned(node, address, key, _fingerprint(key))


def print_host_keys(plan: Plan, *, timeout_s: float = 5.0) -> tuple[str, bool]:
    """(the text to print, whether every node answered)."""
    ssh = plan.cfg.ssh
    with ThreadPoolExecutor(max_workers=min(32, len(plan.nodes))) as pool:
        found = list(pool.map(lambda n: scan(n.name, n.address, ssh.port, timeout_s), plan.nodes))
    lines = [f"# The host keys the nodes of {plan.stack} present now. A scan proves nothing by itself: compare each",
             "# fingerprint with the node's own (on its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub)",
             f"# before pinning it in Pulumi.{plan.stack}.yaml:",
             "  ascend-pd:ssh:",
             "    hostKeys:"]
    for s in found:
        lines.append(f"      {s.node}: {s.key}   # {s.fingerprint}" if s.key else
                     f"      # {s.node} ({s.address}): {s.error}")
    lines += ["", "# The same for ~/.ssh/known_hosts (pulumi-docker's ssh checks it):"]
    lines += [known_hosts_line(s.address, ssh.port, s.key).rstrip("\n") for s in found if s.key]
    return "\n".join(lines), all(s.key for s in found)
