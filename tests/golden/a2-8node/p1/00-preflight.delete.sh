#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on p1
set -euo pipefail
echo 'preflight on p1: read-only, nothing to undo'
