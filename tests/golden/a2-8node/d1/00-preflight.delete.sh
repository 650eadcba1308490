#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (nothing to undo) on d1
set -euo pipefail
echo 'preflight on d1: read-only, nothing to undo'
