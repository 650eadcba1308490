#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 2: patches for /vllm-workspace/vllm on d1
set -euo pipefail

if [ ! -f /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch ]; then echo "patch /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch is missing on d1: copy it there first" >&2; exit 1; fi
mkdir -p /workspace/ascend-pd/patches
want="$(sha256sum /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch | sha256sum | cut -c1-16) $(git -C /vllm-workspace/vllm rev-parse HEAD)"
if [ -f /workspace/ascend-pd/patches/patches-vllm.applied ] && [ "$(cat /workspace/ascend-pd/patches/patches-vllm.applied)" = "$want" ]; then
  echo "/vllm-workspace/vllm: 1 patch(es) already applied"
  exit 0
fi
if [ ! -f /workspace/ascend-pd/patches/patches-vllm.base ]; then git -C /vllm-workspace/vllm rev-parse HEAD > /workspace/ascend-pd/patches/patches-vllm.base; fi
git -C /vllm-workspace/vllm am --abort >/dev/null 2>&1 || true
git -C /vllm-workspace/vllm reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm.base)"
if ! git -C /vllm-workspace/vllm -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch; then
  git -C /vllm-workspace/vllm am --abort >/dev/null 2>&1 || true
  git -C /vllm-workspace/vllm reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm.base)"
  echo "git am failed in /vllm-workspace/vllm; the repository is back at $(cat /workspace/ascend-pd/patches/patches-vllm.base)" >&2
  exit 1
fi
echo "$(sha256sum /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch | sha256sum | cut -c1-16) $(git -C /vllm-workspace/vllm rev-parse HEAD)" > /workspace/ascend-pd/patches/patches-vllm.applied
echo "/vllm-workspace/vllm: applied 1 patch(es) onto $(cut -c1-12 /workspace/ascend-pd/patches/patches-vllm.base)"
