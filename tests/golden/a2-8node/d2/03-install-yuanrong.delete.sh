#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong Datasystem (forget) on d2
set -euo pipefail
what='openYuanrong Datasystem'
marker=/workspace/ascend-pd/prepared/install-yuanrong.done
echo "$what: installed packages stay until the container is replaced"
rm -f "$marker"
