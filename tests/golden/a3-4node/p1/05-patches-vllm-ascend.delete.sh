#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 3: revert patches in /vllm-workspace/vllm-ascend on p1
set -euo pipefail

if [ -f /workspace/ascend-pd/patches/patches-vllm-ascend.base ]; then
  git -C /vllm-workspace/vllm-ascend am --abort >/dev/null 2>&1 || true
  git -C /vllm-workspace/vllm-ascend reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm-ascend.base)"
  echo "/vllm-workspace/vllm-ascend: reset to $(cut -c1-12 /workspace/ascend-pd/patches/patches-vllm-ascend.base)"
fi
rm -f /workspace/ascend-pd/patches/patches-vllm-ascend.base /workspace/ascend-pd/patches/patches-vllm-ascend.applied
