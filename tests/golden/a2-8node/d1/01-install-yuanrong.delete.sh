#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong package on d1
set -euo pipefail
echo 'installed packages stay until the container is replaced'
