#!/usr/bin/env bash
# ascend-pd a3-4node: preflight checks (nothing to undo) on p0
set -euo pipefail
echo 'preflight on p0: read-only, nothing to undo'
