#!/usr/bin/env bash
# ascend-pd a2-8node: probes (remove) on p1
set -euo pipefail
rm -rf /workspace/ascend-pd/probes
echo "probes on p1: removed /workspace/ascend-pd/probes"
