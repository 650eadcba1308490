#!/usr/bin/env bash
# ascend-pd a3-4node: host firewall (nftables table inet ascend_pd) on p0
set -euo pipefail
node=p0
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
    tcp dport 8088 accept comment "the PD proxy, from anyone"
    counter drop comment "ascend-pd: not the cluster, an operator or a client"
  }
}
ASCEND_PD_NFT
nft list table inet "$table" >/dev/null
echo "firewall: table inet $table loaded on $node (SSH, the cluster's nodes, the proxy from anyone; the rest dropped)"
