#!/usr/bin/env bash
# ascend-pd a3-4node: host firewall (nftables table inet ascend_pd) on d1
set -euo pipefail
node=d1
table=ascend_pd

if ! command -v nft >/dev/null 2>&1; then
  echo "nft is missing on $node: install nftables (apt-get install nftables), or set ascend-pd:firewall.enabled: false" >&2
  exit 1
fi
nft -f - <<'ASCEND_PD_NFT'
table inet ascend_pd
delete table inet ascend_pd
table inet ascend_pd {
  set cluster { type ipv4_addr; elements = { 192.0.2.30, 192.0.2.31, 192.0.2.40, 192.0.2.41 } }
  chain input {
    type filter hook input priority filter - 5; policy accept;
    iif "lo" accept
    ct state established,related accept
    tcp dport 22 accept comment "SSH, from anywhere"
    ip saddr @cluster accept comment "the cluster's nodes: every port"
    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept
    counter drop comment "ascend-pd: not the cluster, an operator or a client"
  }
}
ASCEND_PD_NFT
nft list table inet "$table" >/dev/null
echo "firewall: table inet $table loaded on $node (SSH, the cluster's nodes; the rest dropped)"
tcp_retries2=8
tcp_proc=/proc/sys/net/ipv4/tcp_retries2
tcp_state_file=/var/lib/ascend-pd/tcp_retries2.before
tcp_sysctl_file=/etc/sysctl.d/90-ascend-pd-tcp.conf
if [ -n "$tcp_retries2" ]; then
  mkdir -p "$(dirname "$tcp_state_file")" "$(dirname "$tcp_sysctl_file")"
  # The node's own value, from before ascend-pd first changed it.
  if [ ! -f "$tcp_state_file" ]; then cat "$tcp_proc" > "$tcp_state_file"; fi
  echo "$tcp_retries2" > "$tcp_proc"
  echo "net.ipv4.tcp_retries2 = $tcp_retries2" > "$tcp_sysctl_file"
  echo "net.ipv4.tcp_retries2 = $(cat "$tcp_proc") on $node"
else
  if [ -f "$tcp_state_file" ]; then
    cat "$tcp_state_file" > "$tcp_proc"
    echo "net.ipv4.tcp_retries2 back to $(cat "$tcp_state_file") on $node"
    rm -f "$tcp_state_file"
  fi
  rm -f "$tcp_sysctl_file"
fi
