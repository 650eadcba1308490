#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 3: patches for /vllm-workspace/vllm-ascend on d0
set -euo pipefail

if [ ! -f /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch ]; then echo "patch /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch is missing on d0: copy it there first" >&2; exit 1; fi
if [ ! -f /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch ]; then echo "patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch is missing on d0: copy it there first" >&2; exit 1; fi
mkdir -p /workspace/ascend-pd/patches
want="$(sha256sum /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch | sha256sum | cut -c1-16) $(git -C /vllm-workspace/vllm-ascend rev-parse HEAD)"
if [ -f /workspace/ascend-pd/patches/patches-vllm-ascend.applied ] && [ "$(cat /workspace/ascend-pd/patches/patches-vllm-ascend.applied)" = "$want" ]; then
  echo "/vllm-workspace/vllm-ascend: 2 patch(es) already applied"
  exit 0
fi
if [ ! -f /workspace/ascend-pd/patches/patches-vllm-ascend.base ]; then git -C /vllm-workspace/vllm-ascend rev-parse HEAD > /workspace/ascend-pd/patches/patches-vllm-ascend.base; fi
git -C /vllm-workspace/vllm-ascend am --abort >/dev/null 2>&1 || true
git -C /vllm-workspace/vllm-ascend reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm-ascend.base)"
if ! git -C /vllm-workspace/vllm-ascend -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch; then
  git -C /vllm-workspace/vllm-ascend am --abort >/dev/null 2>&1 || true
  git -C /vllm-workspace/vllm-ascend reset -q --hard "$(cat /workspace/ascend-pd/patches/patches-vllm-ascend.base)"
  echo "git am failed in /vllm-workspace/vllm-ascend; the repository is back at $(cat /workspace/ascend-pd/patches/patches-vllm-ascend.base)" >&2
  exit 1
fi
echo "$(sha256sum /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch | sha256sum | cut -c1-16) $(git -C /vllm-workspace/vllm-ascend rev-parse HEAD)" > /workspace/ascend-pd/patches/patches-vllm-ascend.applied
echo "/vllm-workspace/vllm-ascend: applied 2 patch(es) onto $(cut -c1-12 /workspace/ascend-pd/patches/patches-vllm-ascend.base)"
