#!/usr/bin/env bash
# ascend-pd a2-8node: install openYuanrong Datasystem on d2
set -euo pipefail
# The environment an interactive shell in this container has (CANN's set_env.sh files).
set +eu
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then . /usr/local/Ascend/ascend-toolkit/set_env.sh; fi
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ]; then . /usr/local/Ascend/nnal/atb/set_env.sh; fi
set -eu

pip install --no-input https://gitcode.com/openeuler/yuanrong-datasystem/releases/download/v0.7.6.rc1/openyuanrong_datasystem-0.7.6rc1-cp311-cp311-manylinux_2_35_aarch64.whl > /tmp/ascend-pd-pip-yuanrong.log 2>&1 \
  || fail_with_log /tmp/ascend-pd-pip-yuanrong.log "pip install https://gitcode.com/openeuler/yuanrong-datasystem/releases/download/v0.7.6.rc1/openyuanrong_datasystem-0.7.6rc1-cp311-cp311-manylinux_2_35_aarch64.whl failed"
python3 -c 'import yr.datasystem' && command -v dscli >/dev/null
echo "openYuanrong Datasystem ready on d2"
