#!/usr/bin/env bash
# ascend-pd a2-8node: host firewall (nftables table inet ascend_pd) on d2
set -euo pipefail
node=d2
table=ascend_pd

nft delete table inet "$table" 2>/dev/null || true
echo "firewall: table inet $table removed on $node"
tcp_proc=/proc/sys/net/ipv4/tcp_retries2
tcp_state_file=/var/lib/ascend-pd/tcp_retries2.before
tcp_sysctl_file=/etc/sysctl.d/90-ascend-pd-tcp.conf
if [ -f "$tcp_state_file" ]; then
  cat "$tcp_state_file" > "$tcp_proc"
  echo "net.ipv4.tcp_retries2 back to $(cat "$tcp_state_file") on $node"
  rm -f "$tcp_state_file"
fi
rm -f "$tcp_sysctl_file"
