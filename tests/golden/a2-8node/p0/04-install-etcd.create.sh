#!/usr/bin/env bash
# ascend-pd a2-8node: install etcd v3.5.12 if missing on p0
set -euo pipefail
node=p0
what='etcd v3.5.12'
binary=etcd
version=v3.5.12

if command -v "$binary" >/dev/null 2>&1; then
  echo "etcd present on $node: $("$binary" --version | head -n 1)"
  exit 0
fi
case "$(uname -m)" in aarch64) arch=linux-arm64 ;; x86_64) arch=linux-amd64 ;; *) echo "unsupported $(uname -m)" >&2; exit 1 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
release="etcd-$version-$arch"
url="https://github.com/etcd-io/etcd/releases/download/$version/$release.tar.gz"
if ! curl -fsSL --max-time 600 -o "$tmp/etcd.tar.gz" "$url" || ! tar -xzf "$tmp/etcd.tar.gz" -C "$tmp" 2>/dev/null; then
  echo "could not download $what from $url on $node: give the container internet access (ascend-pd:container.env" >&2
  echo "https_proxy), put etcd in the image as ascend-pd:etcd.binary, or run it from ascend-pd:etcd.image" >&2
  exit 1
fi
# A path in etcd.binary is where the etcd script will start it from: install it exactly there.
case "$binary" in
  */*) mkdir -p "$(dirname "$binary")"; cp "$tmp/$release/etcd" "$binary"; cp "$tmp/$release/etcdctl" "$(dirname "$binary")/" ;;
  *) cp "$tmp/$release/etcd" "$tmp/$release/etcdctl" /usr/local/bin/ ;;
esac
echo "$what installed on $node"
