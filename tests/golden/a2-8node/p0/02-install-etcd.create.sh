#!/usr/bin/env bash
# ascend-pd a2-8node: install etcd v3.5.12 if missing on p0
set -euo pipefail

if command -v etcd >/dev/null 2>&1; then
  echo "etcd present on p0: $(etcd --version | head -n 1)"
  exit 0
fi
case "$(uname -m)" in aarch64) arch=linux-arm64 ;; x86_64) arch=linux-amd64 ;; *) echo "unsupported $(uname -m)" >&2; exit 1 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --max-time 600 -o "$tmp/etcd.tar.gz" "https://github.com/etcd-io/etcd/releases/download/v3.5.12/etcd-v3.5.12-$arch.tar.gz"
tar -xzf "$tmp/etcd.tar.gz" -C "$tmp"
cp "$tmp/etcd-v3.5.12-$arch/etcd" "$tmp/etcd-v3.5.12-$arch/etcdctl" /usr/local/bin/
echo "etcd v3.5.12 installed on p0"
