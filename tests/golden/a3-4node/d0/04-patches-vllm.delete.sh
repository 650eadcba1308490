#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 2: revert patches in /vllm-workspace/vllm on d0
set -euo pipefail

if [ -f /workspace/ascend-pd/patches/patches-vllm.base ]; then
  git -C /vllm-workspace/vllm am --abort >/dev/null 2>&1 || true
  git -C /vllm-workspace/vllm reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm.base)"
  echo "/vllm-workspace/vllm: reset to $(cut -c1-12 /workspace/ascend-pd/patches/patches-vllm.base)"
fi
rm -f /workspace/ascend-pd/patches/patches-vllm.base /workspace/ascend-pd/patches/patches-vllm.applied
