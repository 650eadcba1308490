"""The host firewall of a node, from the plan (ascend-pd:firewall): one nftables table of ascend-pd's
own, loaded in one `nft -f` transaction (the old table and the new one swap atomically), removed by
delete. Other tables (the operator's, docker's iptables-nft rules) are untouched; a packet this table
drops is dropped whatever they accept.

What reaches the node from where: SSH from anywhere (or the operator could lock themselves out);
every port from the cluster's own nodes (DP RPC, torch and HCCL bootstrap sockets, Mooncake side
channels, the workers, etcd: the ports vLLM, torch and HCCL open at random among them); the proxy's
port from `firewall.clients`; the ports `status`, the exporter and Prometheus read
(Plan.service_ports) from `firewall.operators`; replies to what the node itself opened. Everything
else is dropped and counted.

With the table, the same script sets the node's `net.ipv4.tcp_retries2` (ascend-pd:firewall.tcpRetries2):
the bound on a `pulumi up` step whose node stops answering while the step runs (tcp_bound).
"""

from __future__ import annotations

from ..plan import Plan
from ..shell import RESERVED_PREFIX, Script, header, heredoc, one_line, params

RULES_DELIMITER = RESERVED_PREFIX + "NFT"
ANYONE = "0.0.0.0/0"
# Where the script keeps the node's own tcp_retries2 (put back by delete, or when the setting becomes
# null) and the sysctl file that makes the setting survive a reboot.
TCP_RETRIES2 = "/proc/sys/net/ipv4/tcp_retries2"
TCP_STATE_FILE = "/var/lib/ascend-pd/tcp_retries2.before"
TCP_SYSCTL_FILE = "/etc/sysctl.d/90-ascend-pd-tcp.conf"
# IPv6 neighbour discovery: the table drops other IPv6 from outside, but a host without it loses IPv6.
ND_TYPES = "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"


def _set(name: str, networks: list[str]) -> str:
    flags = "flags interval; " if any("/" in n for n in networks) else ""
    return f"  set {name} {{ type ipv4_addr; {flags}elements = {{ {', '.join(networks)} }} }}\n"


def ruleset(plan: Plan, node: str) -> str:
    """The nft input: the table created, emptied and filled in one transaction."""
    fw, table = plan.cfg.firewall, plan.cfg.firewall.table
    cluster = [n.address for n in plan.nodes]
    ports = sorted({p for p, _ in plan.service_ports(node)})
    rules = [
        'iif "lo" accept',
        "ct state established,related accept",
        f"tcp dport {plan.cfg.ssh.port} accept comment \"SSH, from anywhere\"",
        "ip saddr @cluster accept comment \"the cluster's nodes: every port\"",
        f"icmpv6 type {{ {ND_TYPES} }} accept",
    ]
    sets = _set("cluster", cluster)
    if node == plan.proxy.node:
        if ANYONE in fw.clients:
            rules.append(f"tcp dport {plan.proxy.port} accept comment \"the PD proxy, from anyone\"")
        else:
            sets += _set("clients", fw.clients)
            rules.append(f"ip saddr @clients tcp dport {plan.proxy.port} accept comment \"the PD proxy, from clients\"")
    if fw.operators:
        sets += _set("operators", fw.operators)
        rules.append(f"ip saddr @operators tcp dport {{ {', '.join(map(str, ports))} }} accept "
                     "comment \"what status, the exporter and Prometheus read\"")
        rules.append("ip saddr @operators icmp type echo-request accept")
    rules.append("counter drop comment \"ascend-pd: not the cluster, an operator or a client\"")
    body = "".join(f"    {r}\n" for r in rules)
    return (f"table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n{sets}"
            f"  chain input {{\n    type filter hook input priority filter - 5; policy accept;\n{body}  }}\n}}\n")


def tcp_bound(plan: Plan, node: str, *, proc: str = TCP_RETRIES2, state_file: str = TCP_STATE_FILE,
              sysctl_file: str = TCP_SYSCTL_FILE) -> tuple[str, str]:
    """(create, delete) shell of the node's tcp_retries2. Why it bounds a silent node's step: the node
    keeps retransmitting the step's output to Pulumi, each retransmission restarts the TCP keepalive of
    pulumi-command's session, and the session waits until the node gives up (tcp_retries2); only then
    does the keepalive end it (150 s later). sshd's ClientAliveInterval does not fire while the script
    writes output (measured: no disconnect in 250 s with an interval of 5 s)."""
    retries = plan.cfg.firewall.tcp_retries2
    paths = params(tcp_proc=proc, tcp_state_file=state_file, tcp_sysctl_file=sysctl_file)
    restore = """if [ -f "$tcp_state_file" ]; then
  cat "$tcp_state_file" > "$tcp_proc"
  echo "net.ipv4.tcp_retries2 back to $(cat "$tcp_state_file") on $node"
  rm -f "$tcp_state_file"
fi
rm -f "$tcp_sysctl_file"
"""
    create = params(tcp_retries2="" if retries is None else retries) + paths + """if [ -n "$tcp_retries2" ]; then
  mkdir -p "$(dirname "$tcp_state_file")" "$(dirname "$tcp_sysctl_file")"
  # The node's own value, from before ascend-pd first changed it.
  if [ ! -f "$tcp_state_file" ]; then cat "$tcp_proc" > "$tcp_state_file"; fi
  echo "$tcp_retries2" > "$tcp_proc"
  echo "net.ipv4.tcp_retries2 = $tcp_retries2" > "$tcp_sysctl_file"
  echo "net.ipv4.tcp_retries2 = $(cat "$tcp_proc") on $node"
else
""" + "".join(f"  {line}\n" for line in restore.splitlines()) + "fi\n"
    return create, paths + restore


def firewall(plan: Plan, node: str) -> Script:
    table = plan.cfg.firewall.table
    top = header(plan.stack, node, f"host firewall (nftables table inet {table})") + params(node=node, table=table)
    tcp_create, tcp_delete = tcp_bound(plan, node)
    fw = plan.cfg.firewall
    clients = f", the proxy from {'anyone' if ANYONE in fw.clients else ' '.join(fw.clients)}" if node == plan.proxy.node else ""
    operators = f", {len(plan.service_ports(node))} service ports from {' '.join(fw.operators)}" if fw.operators else ""
    create = top + f"""
if ! command -v nft >/dev/null 2>&1; then
  echo "nft is missing on $node: install nftables (apt-get install nftables), or set ascend-pd:firewall.enabled: false" >&2
  exit 1
fi
nft -f - {heredoc(RULES_DELIMITER, ruleset(plan, node))}nft list table inet "$table" >/dev/null
echo "firewall: table inet $table loaded on $node (SSH, the cluster's nodes{one_line(clients)}{one_line(operators)}; the rest dropped)"
""" + tcp_create
    delete = top + """
nft delete table inet "$table" 2>/dev/null || true
echo "firewall: table inet $table removed on $node"
""" + tcp_delete
    return Script("firewall", node, "host", create, delete, identity=(table,))
