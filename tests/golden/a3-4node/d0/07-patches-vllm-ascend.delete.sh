#!/usr/bin/env bash
# ascend-pd a3-4node: revert patches in /vllm-workspace/vllm-ascend on d0
set -euo pipefail
repo=/vllm-workspace/vllm-ascend
base=/workspace/ascend-pd/patches/patches-vllm-ascend.base
applied=/workspace/ascend-pd/patches/patches-vllm-ascend.applied

if [ -f "$base" ]; then
  git -C "$repo" am --abort >/dev/null 2>&1 || true
  git -C "$repo" reset -q --hard "$(cat "$base")"
  echo "$repo: reset to $(cut -c1-12 "$base")"
fi
rm -f "$base" "$applied"
