#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 1 on p0
set -euo pipefail
echo 'installed packages stay until the container is replaced'
