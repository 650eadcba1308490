#!/usr/bin/env bash
# ascend-pd a3-4node: patches for /vllm-workspace/vllm on p1
set -euo pipefail
repo=/vllm-workspace/vllm
marks=/workspace/ascend-pd/patches
base=/workspace/ascend-pd/patches/patches-vllm.base
applied=/workspace/ascend-pd/patches/patches-vllm.applied
count=1
if [ ! -f /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch ]; then echo 'patch /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch is missing on p1: copy it there first' >&2; exit 1; fi
mkdir -p "$marks"
want="$(sha256sum /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)"
if [ -f "$applied" ] && [ "$(cat "$applied")" = "$want" ]; then
  echo "$repo: $count patch(es) already applied"
  exit 0
fi
if [ ! -f "$base" ]; then git -C "$repo" rev-parse HEAD > "$base"; fi
git -C "$repo" am --abort >/dev/null 2>&1 || true
git -C "$repo" reset -q --hard "$(cat "$base")"
if ! git -C "$repo" -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch; then
  git -C "$repo" am --abort >/dev/null 2>&1 || true
  git -C "$repo" reset -q --hard "$(cat "$base")"
  echo "git am failed in $repo; the repository is back at $(cat "$base")" >&2
  exit 1
fi
echo "$(sha256sum /home/yuanrong_patches/0001-Bugfix-Fix-negative-local_cache_hit-in-P-D-disaggreg.patch | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)" > "$applied"
echo "$repo: applied $count patch(es) onto $(cut -c1-12 "$base")"
