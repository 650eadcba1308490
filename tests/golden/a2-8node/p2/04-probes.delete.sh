#!/usr/bin/env bash
# ascend-pd a2-8node: probes (remove) on p2
set -euo pipefail
rm -rf /workspace/ascend-pd/probes
echo "probes on p2: removed /workspace/ascend-pd/probes"
