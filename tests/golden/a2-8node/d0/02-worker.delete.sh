#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong worker 192.0.2.20:18481 (stop, clean) on d0
set -euo pipefail
# The environment an interactive shell in this container has (CANN's set_env.sh files).
set +eu
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then . /usr/local/Ascend/ascend-toolkit/set_env.sh; fi
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ]; then . /usr/local/Ascend/nnal/atb/set_env.sh; fi
set -eu

worker_pids() {  # worker_pids ADDRESS: datasystem_worker processes serving exactly ADDRESS
  local d cmd
  for d in /proc/[0-9]*; do
    # 2>/dev/null first: a process that exits mid-scan must not print "No such file" noise.
    cmd=$(tr '\0' ' ' 2>/dev/null < "$d/cmdline") || continue
    case "$cmd" in *datasystem_worker" "*) ;; *) continue ;; esac
    # dscli passes --worker_address=ADDR: matching the whole flag keeps 10.0.0.1:18481 from
    # matching 110.0.0.1:18481, and a shell whose command line holds this script from matching.
    case " $cmd" in *" --worker_address=$1 "*) echo "${d#/proc/}" ;; esac
  done
}

if [ -n "$(worker_pids 192.0.2.20:18481)" ]; then
  cd /workspace/ascend-pd/yuanrong 2>/dev/null || true
  # dscli stop's own wait is 180 s + shared memory / 40 s (hours at 500 GB): bound it.
  if ! timeout 120 dscli stop --worker_address 192.0.2.20:18481; then
    echo "dscli stop failed or did not finish within 120s: terminating the worker" >&2
  fi
  for pid in $(worker_pids 192.0.2.20:18481); do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 15))
  while [ -n "$(worker_pids 192.0.2.20:18481)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
  for pid in $(worker_pids 192.0.2.20:18481); do kill -KILL "$pid" 2>/dev/null || true; done
  # KILL is asynchronous: report success only once the worker is gone (its files go next).
  deadline=$((SECONDS + 10))
  while [ -n "$(worker_pids 192.0.2.20:18481)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
  if [ -n "$(worker_pids 192.0.2.20:18481)" ]; then
    echo "worker 192.0.2.20:18481 (pid $(worker_pids 192.0.2.20:18481 | tr '\n' ' ')) survived KILL" >&2
    exit 1
  fi
fi
# Stale rocksdb metadata and client logs cause 'key not found' after an unclean stop (seed FAQ).
rm -rf /workspace/ascend-pd/yuanrong/datasystem "$HOME/.datasystem" /workspace/liveness /workspace/ascend-pd/run/worker.spec
echo "worker 192.0.2.20:18481: stopped and cleaned"
