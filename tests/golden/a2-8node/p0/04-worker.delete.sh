#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong worker 192.0.2.10:18481 (stop, clean) on p0
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
signal_worker() {  # signal_worker SIGNAL ADDRESS SECONDS: signal it, then wait up to SECONDS for it to exit
  local deadline=$((SECONDS + $3)) pid
  for pid in $(worker_pids "$2"); do kill "-$1" "$pid" 2>/dev/null || true; done
  while [ -n "$(worker_pids "$2")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
}
stop_worker() {  # stop_worker ADDRESS STOP_TIMEOUT: dscli stop (bounded), TERM, KILL; 1 if it survives
  [ -n "$(worker_pids "$1")" ] || return 0
  # dscli stop's own wait is 180 s + shared memory / 40 s (hours at 500 GB): bound it.
  if ! timeout "$2" dscli stop --worker_address "$1"; then
    echo "dscli stop failed or did not finish within $2s: terminating the worker" >&2
  fi
  signal_worker TERM "$1" 15
  # KILL is asynchronous: the worker holds its port and files until it is gone.
  signal_worker KILL "$1" 10
  if [ -n "$(worker_pids "$1")" ]; then
    echo "worker $1 (pid $(worker_pids "$1" | tr '\n' ' ')) survived KILL" >&2
    return 1
  fi
}

cd /workspace/ascend-pd/yuanrong 2>/dev/null || true
# Its files go only once it is gone (stop_worker fails the delete otherwise).
stop_worker 192.0.2.10:18481 120
# Stale rocksdb metadata and client logs cause 'key not found' after an unclean stop (seed FAQ).
rm -rf /workspace/ascend-pd/yuanrong/datasystem "$HOME/.datasystem" /workspace/liveness /workspace/ascend-pd/run/worker.spec
echo "worker 192.0.2.10:18481: stopped and cleaned"
