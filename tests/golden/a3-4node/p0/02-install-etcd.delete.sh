#!/usr/bin/env bash
# ascend-pd a3-4node: etcd binary on p0
set -euo pipefail
echo 'installed packages stay until the container is replaced'
