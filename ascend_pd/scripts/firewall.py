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
"""

from __future__ import annotations

from ..plan import Plan
from ..shell import RESERVED_PREFIX, Script, header, heredoc, one_line, params

RULES_DELIMITER = RESERVED_PREFIX + "NFT"
ANYONE = "0.0.0.0/0"
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


def firewall(plan: Plan, node: str) -> Script:
    table = plan.cfg.firewall.table
    top = header(plan.stack, node, f"host firewall (nftables table inet {table})") + params(node=node, table=table)
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
"""
    delete = top + """
nft delete table inet "$table" 2>/dev/null || true
echo "firewall: table inet $table removed on $node"
"""
    return Script("firewall", node, "host", create, delete, identity=(table,))
