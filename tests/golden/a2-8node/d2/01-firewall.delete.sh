#!/usr/bin/env bash
# ascend-pd a2-8node: host firewall (nftables table inet ascend_pd) on d2
set -euo pipefail
node=d2
table=ascend_pd

nft delete table inet "$table" 2>/dev/null || true
echo "firewall: table inet $table removed on $node"
