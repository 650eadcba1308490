#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for ascend-pd: system tools the tests run for real, and ./venv.
# Idempotent; needs root (or sudo) for apt-get. No cluster needed. The Pulumi CLI and plugins: the ones
# on PATH when they match the pinned SDKs, else built from the toolchain sources (see below).
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
# docker.io (dockerd, runc), docker-registry, jq, debootstrap: the real-engine tests' nodes each run a
# dockerd, pull the test NPU image (built with debootstrap) from a registry on a bridge, and jq edits
# runc's bundle in the harness' runtime wrapper (tests/realengine/). nftables: the nodes' firewall
# (ascend-pd:firewall) is loaded for real in the real-engine nodes' network namespaces.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends etcd-server etcd-client shellcheck curl procps iproute2 numactl openssh-server openssh-client prometheus prometheus-node-exporter docker.io docker-registry jq debootstrap nftables >/dev/null
python3 -m venv venv
venv/bin/pip install -q --upgrade pip
venv/bin/pip install -q -r requirements-dev.txt
# The `ascend-pd` command (venv/bin/ascend-pd), editable: it runs this checkout's code.
venv/bin/pip install -q --no-deps --no-build-isolation -e .
# The PD proxy script of each release the stacks run, from its sdist on PyPI (sha256-pinned), for the tests.
venv/bin/python tests/proxy_release.py fetch
# The pinned vllm-ascend and vLLM sources the release facts are derived from: tests/test_release_facts.py
# runs in a network namespace of its own (tests/run) and cannot download them (about 85 MB once).
venv/bin/python -c 'from tools.release_facts import fetch; [fetch.trees(r) for r in fetch.PINS]'

# The Pulumi CLI, its Python language host and the command/docker plugins, at the versions the pinned
# SDKs ask for (requirements.txt). An operator's own `pulumi` on PATH is used when it has them; else
# they are built from the toolchain sources (release tags, every Go module from the module proxy:
# about 12 minutes once, under a second after that) into the user's cache, and linked into venv/bin,
# where the real-engine tests (tests/realengine/) find them. Neither: those tests skip (fail under CI=true).
want() { venv/bin/python -c "from importlib.metadata import version; print(version('$1'))"; }
cli=$(want pulumi) command_v=$(want pulumi-command) docker_v=$(want pulumi-docker)
has_toolchain() {  # has_toolchain PULUMI: that CLI at the SDK's version, with both plugins installed
  [ "$("$1" version 2>/dev/null)" = "v$cli" ] || return 1
  local plugins; plugins=$("$1" plugin ls 2>/dev/null) || return 1
  grep -Eq "^command +resource +$command_v( |$)" <<<"$plugins" && grep -Eq "^docker +resource +$docker_v( |$)" <<<"$plugins"
}
export PULUMI_SKIP_UPDATE_CHECK=true
toolchain_src=${ASCEND_PD_TOOLCHAIN_SRC:-$(pwd)/../shared/toolchain}
toolchain=${XDG_CACHE_HOME:-$HOME/.cache}/ascend-pd/pulumi-toolchain
rm -f venv/bin/pulumi venv/bin/pulumi-language-python venv/bin/pulumi-language-python-exec
if command -v pulumi >/dev/null && has_toolchain "$(command -v pulumi)"; then
  echo "pulumi: using $(command -v pulumi) (v$cli, command $command_v, docker $docker_v)"
elif [ -f "$toolchain_src/build.sh" ] && command -v go >/dev/null; then
  echo "pulumi: building v$cli and its plugins from $toolchain_src into $toolchain (log: $toolchain/setup.log)"
  mkdir -p "$toolchain"
  if ! bash "$toolchain_src/build.sh" "$toolchain" > "$toolchain/setup.log" 2>&1; then
    tail -n 20 "$toolchain/setup.log" >&2; echo "pulumi toolchain build failed (full log: $toolchain/setup.log)" >&2; exit 1
  fi
  for b in pulumi pulumi-language-python pulumi-language-python-exec; do ln -sf "$toolchain/bin/$b" "venv/bin/$b"; done
  has_toolchain venv/bin/pulumi || { echo "the built pulumi lacks v$cli or its plugins (command $command_v, docker $docker_v)" >&2; exit 1; }
else
  echo "pulumi: no CLI with command $command_v and docker $docker_v plugins on PATH, and no toolchain sources" \
       "(../shared/toolchain or ASCEND_PD_TOOLCHAIN_SRC) with Go to build them: the real-engine tests will skip" >&2
fi
echo "setup done: $(venv/bin/python --version), pulumi SDK $(venv/bin/python -c 'from importlib.metadata import version; print(version("pulumi"))' 2>/dev/null || echo '?'), CLI $(PATH="venv/bin:$PATH" pulumi version 2>/dev/null || echo 'none: the real-engine tests skip')"
