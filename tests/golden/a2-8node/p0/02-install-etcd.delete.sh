#!/usr/bin/env bash
# ascend-pd a2-8node: etcd binary on p0
set -euo pipefail
echo 'installed packages stay until the container is replaced'
