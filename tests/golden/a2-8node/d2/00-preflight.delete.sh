#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on d2
set -euo pipefail
echo 'preflight on d2: read-only, nothing to undo'
