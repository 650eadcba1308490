#!/usr/bin/env bash
# ascend-pd a3-4node: pip install huggingface_hub==1.5.0 --no-deps --force-reinstall (forget) on p1
set -euo pipefail
what='pip install huggingface_hub==1.5.0 --no-deps --force-reinstall'
marker=/workspace/ascend-pd/prepared/pip-huggingface-hub.done
echo "$what: installed packages stay until the container is replaced"
rm -f "$marker"
