#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on p3
set -euo pipefail
echo 'preflight on p3: read-only, nothing to undo'
