#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on d0
set -euo pipefail
echo 'preflight on d0: read-only, nothing to undo'
