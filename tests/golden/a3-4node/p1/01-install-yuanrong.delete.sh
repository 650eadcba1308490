#!/usr/bin/env bash
# ascend-pd a3-4node: openYuanrong package on p1
set -euo pipefail
echo 'installed packages stay until the container is replaced'
