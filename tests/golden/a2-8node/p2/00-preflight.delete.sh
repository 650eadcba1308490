#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on p2
set -euo pipefail
echo 'preflight on p2: read-only, nothing to undo'
