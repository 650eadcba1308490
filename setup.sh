#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for ascend-pd: system tools the tests run for real, and ./venv.
# Idempotent; needs root (or sudo) for apt-get. No cluster and no Pulumi CLI needed.
set -euo pipefail
cd "$(dirname "$0")"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# etcd-server/etcd-client: a real etcd for the integration tests; shellcheck: lints every rendered
# script; curl, procps, iproute2: used by the rendered scripts and the tests; numactl: the A3
# worker starts under `dscli start --interleave`, which needs it; openssh-server/-client: doctor and
# the preflight gate are tested over real sshd on loopback (tests/preflight_nodes.py); prometheus (and
# promtool): the generated scrape config, recording rules and alerts are checked and run for real.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends etcd-server etcd-client shellcheck curl procps iproute2 numactl openssh-server openssh-client prometheus prometheus-node-exporter >/dev/null
python3 -m venv venv
venv/bin/pip install -q --upgrade pip
venv/bin/pip install -q -r requirements-dev.txt
# The `ascend-pd` command (venv/bin/ascend-pd), editable: it runs this checkout's code.
venv/bin/pip install -q --no-deps --no-build-isolation -e .
# The PD proxy script of each release the stacks run, from its sdist on PyPI (sha256-pinned), for the tests.
venv/bin/python tests/proxy_release.py fetch
echo "setup done: $(venv/bin/python --version), pulumi SDK $(venv/bin/python -c 'from importlib.metadata import version; print(version("pulumi"))' 2>/dev/null || echo '?')"
