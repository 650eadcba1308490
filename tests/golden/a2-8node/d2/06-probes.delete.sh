#!/usr/bin/env bash
# ascend-pd a2-8node: probes (remove) on d2
set -euo pipefail
probe_dir=/workspace/ascend-pd/probes
rm -rf "$probe_dir"
echo 'probes on d2: removed /workspace/ascend-pd/probes'
