#!/usr/bin/env bash
# ascend-pd a3-4node: host firewall (nftables table inet ascend_pd) on d0
set -euo pipefail
node=d0
table=ascend_pd

nft delete table inet "$table" 2>/dev/null || true
echo "firewall: table inet $table removed on $node"
