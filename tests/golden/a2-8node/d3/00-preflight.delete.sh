#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on d3
set -euo pipefail
echo 'preflight on d3: read-only, nothing to undo'
