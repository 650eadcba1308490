#!/usr/bin/env bash
# ascend-pd a3-4node: probes (remove) on p1
set -euo pipefail
probe_dir=/workspace/ascend-pd/probes
rm -rf "$probe_dir"
echo 'probes on p1: removed /workspace/ascend-pd/probes'
