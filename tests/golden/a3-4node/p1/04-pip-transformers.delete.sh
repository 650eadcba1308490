#!/usr/bin/env bash
# ascend-pd a3-4node: pip install transformers==5.2.0 --no-deps --force-reinstall (forget) on p1
set -euo pipefail
what='pip install transformers==5.2.0 --no-deps --force-reinstall'
marker=/workspace/ascend-pd/prepared/pip-transformers.done
echo "$what: installed packages stay until the container is replaced"
rm -f "$marker"
