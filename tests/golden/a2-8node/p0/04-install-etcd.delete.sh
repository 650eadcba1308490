#!/usr/bin/env bash
# ascend-pd a2-8node: etcd v3.5.12 (forget) on p0
set -euo pipefail
what='etcd v3.5.12'
marker=/workspace/ascend-pd/prepared/install-etcd.done
echo "$what: installed packages stay until the container is replaced"
rm -f "$marker"
