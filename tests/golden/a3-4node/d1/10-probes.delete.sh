#!/usr/bin/env bash
# ascend-pd a3-4node: probes (remove) on d1
set -euo pipefail
probe_dir=/workspace/ascend-pd/probes
rm -rf "$probe_dir"
echo 'probes on d1: removed /workspace/ascend-pd/probes'
