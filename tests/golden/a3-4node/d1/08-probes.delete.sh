#!/usr/bin/env bash
# ascend-pd a3-4node: probes (remove) on d1
set -euo pipefail
rm -rf /workspace/ascend-pd/probes
echo "probes on d1: removed /workspace/ascend-pd/probes"
