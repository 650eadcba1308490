#!/usr/bin/env bash
# ascend-pd a3-4node: patches for /vllm-workspace/vllm-ascend on d0
set -euo pipefail
repo=/vllm-workspace/vllm-ascend
marks=/workspace/ascend-pd/patches
base=/workspace/ascend-pd/patches/patches-vllm-ascend.base
applied=/workspace/ascend-pd/patches/patches-vllm-ascend.applied
count=2
if [ ! -f /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch ]; then echo 'patch /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch is missing on d0: copy it there first' >&2; exit 1; fi
if [ ! -f /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch ]; then echo 'patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch is missing on d0: copy it there first' >&2; exit 1; fi
mkdir -p "$marks"
want="$(sha256sum /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)"
if [ -f "$applied" ] && [ "$(cat "$applied")" = "$want" ]; then
  echo "$repo: $count patch(es) already applied"
  exit 0
fi
if [ ! -f "$base" ]; then git -C "$repo" rev-parse HEAD > "$base"; fi
git -C "$repo" am --abort >/dev/null 2>&1 || true
git -C "$repo" reset -q --hard "$(cat "$base")"
if ! git -C "$repo" -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch; then
  git -C "$repo" am --abort >/dev/null 2>&1 || true
  git -C "$repo" reset -q --hard "$(cat "$base")"
  echo "git am failed in $repo; the repository is back at $(cat "$base")" >&2
  exit 1
fi
echo "$(sha256sum /home/yuanrong_patches/0001-Implement-yuanrong-backend.patch /home/yuanrong_patches/0001-fix-kv-pool-update-yuanrong-backend-handling.patch | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)" > "$applied"
echo "$repo: applied $count patch(es) onto $(cut -c1-12 "$base")"
