#!/usr/bin/env bash
# ascend-pd a3-4node: prepare step 0 on d1
set -euo pipefail
echo 'installed packages stay until the container is replaced'
